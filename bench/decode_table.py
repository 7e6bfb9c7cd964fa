#!/usr/bin/env python3
"""The decode-attention table of docs/perf.md ("Decode against FlashInfer"): kvpolicy, FlashInfer and
PyTorch's SDPA-flash on the same shapes, each timed two ways in one machine session: kernel time (ncu's
durations of every kernel one call launches, summed: bench/ncu_kernel_time.py) and CUDA-graph replay
of one call with the L2 rotated (bench_cuda.cu's decode_attention_graph, torch_reference.py's
graph_us); with the copy bandwidth of the same session, and the split sweep (decode_split) the
plan's rule is read from.
  decode_table.py bench_cuda.json torch.json ncu_kvpolicy.jsonl ncu_peers.jsonl [sweep.json]"""
import json
import sys


def medians(path):
    out = {}
    for r in json.load(open(path))["benchmarks"]:
        if r.get("aggregate_name", "median") == "median":
            out[r["run_name"].replace("/manual_time", "").replace("/min_time:0.050", "")] = r
    return out


def jsonl(path):
    return [json.loads(line) for line in open(path) if line.startswith("{")]


def fmt(x, digits=1):
    return "–" if x is None else f"{x:,.{digits}f}"


def ratio(a, b):
    return "–" if a is None or b is None else f"{a / b:.2f}"


def main():
    bench, ref = medians(sys.argv[1]), json.load(open(sys.argv[2]))
    if len(sys.argv) > 5:  # the split sweep, from its own run
        bench.update({k: v for k, v in medians(sys.argv[5]).items() if k.startswith("BM_decode_split/")})
    ncu_ours = {int(r["label"]): r["us"] for r in jsonl(sys.argv[3])}
    ncu_peers = {(r["label"]["engine"], r["label"]["tokens"]): r["us"] for r in jsonl(sys.argv[4])}
    graph = {e: {r["tokens"]: r["graph_us"] for r in ref.get(e, [])} for e in ("flashinfer", "sdpa")}
    copy = bench.get("BM_copy/1024")
    print(f"Device: {ref['device']}; torch {ref['torch']}, FlashInfer {ref.get('flashinfer_version', 'not importable')}. "
          f"Copy bandwidth (read + write): {copy['bytes_per_second'] / 1e9:,.0f} GB/s (kvpolicy_bench_cuda), "
          f"{ref['copy_GBps']:,.0f} GB/s (PyTorch).\n")
    print("Batch 8, Hkv 8, G 4, d 128, fp16 K/V, page 16 (pages in random order); times in µs.\n")
    print("| K+V | kvpolicy kernels | FlashInfer kernels | SDPA-flash kernels | kvpolicy graph | FlashInfer graph "
          "| SDPA-flash graph | kvpolicy / FlashInfer, kernels | kvpolicy / FlashInfer, graph | kvpolicy graph / copy |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tokens in sorted(ncu_ours):
        g = bench.get(f"BM_decode_attention_graph/{tokens}")
        ours_graph = g["real_time"] if g else None
        mib = 2 * 8 * 8 * tokens * 128 * 2 / 2**20
        share = f"{mib * 2**20 / (ours_graph * 1e-6) / copy['bytes_per_second']:.0%}" if g else "–"
        fi_k, sd_k = ncu_peers.get(("flashinfer", tokens)), ncu_peers.get(("sdpa", tokens))
        fi_g, sd_g = graph["flashinfer"].get(tokens), graph["sdpa"].get(tokens)
        print(f"| {mib:,.0f} MiB | {fmt(ncu_ours[tokens])} | {fmt(fi_k)} | {fmt(sd_k)} | {fmt(ours_graph)} | {fmt(fi_g)} "
              f"| {fmt(sd_g)} | {ratio(ncu_ours[tokens], fi_k)} | {ratio(ours_graph, fi_g)} | {share} |")
    sweep = {}
    for name, r in bench.items():
        if name.startswith("BM_decode_split/"):
            _, n, s = name.split("/")[:3]  # BM_decode_split/<N>/<S>[/min_time:...]
            sweep.setdefault(int(n), {})[int(s)] = r["real_time"]
    if sweep:
        splits = sorted({s for row in sweep.values() for s in row})
        print("\nThe split sweep (graph replay, µs; the fastest in bold; `plan` is what the plan picks):\n")
        print("| K+V | plan | " + " | ".join(f"{s} splits" for s in splits) + " |")
        print("| ---: | ---: | " + " | ".join("---:" for _ in splits) + " |")
        for n, row in sorted(sweep.items()):
            best = min(row.values())
            g = bench.get(f"BM_decode_attention_graph/{n}")
            plan = f"{g['splits']:.0f}" if g else "–"
            cells = [("**" + fmt(row[s]) + "**" if row[s] == best else fmt(row[s])) if s in row else "–" for s in splits]
            print(f"| {2 * 8 * 8 * n * 128 * 2 / 2**20:,.0f} MiB | {plan} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
