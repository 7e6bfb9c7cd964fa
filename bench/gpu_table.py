#!/usr/bin/env python3
"""Prints the GPU results table of docs/perf.md from one run of kvpolicy_bench_cuda (JSON, with
--benchmark_repetitions: the medians are used) and, when given, bench/torch_reference.py's JSON of
the same machine session (PyTorch SDPA-flash and torch.topk on the same shapes). Every ratio is
between figures of that one session.
  gpu_table.py bench_cuda.json [torch.json]"""
import json
import sys


def medians(path):
    runs = json.load(open(path))["benchmarks"]
    out = {}
    for r in runs:
        if r.get("aggregate_name", "median") != "median":
            continue
        out[r["run_name"]] = r
    return out


def main():
    m = medians(sys.argv[1])
    ref = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
    sdpa = {round(r["kv_MiB"]): r for r in ref["sdpa"]} if ref else {}
    copy = m.get("BM_copy/1024/manual_time")
    copy_bw = copy["bytes_per_second"] if copy else float("nan")
    print(f"Copy bandwidth (device to device, read + write): {copy_bw / 1e9:.0f} GB/s\n")
    if ref:
        print(f"PyTorch {ref['torch']} on {ref['device']}: copy {ref['copy_GBps']:.0f} GB/s\n")
    print("| decode attention, KV | time (µs) | K+V read (GB/s) | / copy bandwidth | SDPA-flash dense (µs) | SDPA / ours "
          "| CUDA-core kernel (µs) | its time / ours |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in m.items():
        if name.startswith("BM_decode_attention/"):
            bw = r["bytes_per_second"]
            f = sdpa.get(round(r["kv_MiB"]))
            tail = f"| {f['us']:.1f} | {f['us'] / r['real_time']:.2f} " if f else "| – | – "
            cc = m.get(name.replace("BM_decode_attention/", "BM_decode_attention_cuda_cores/"))
            tail += f"| {cc['real_time']:.1f} | {cc['real_time'] / r['real_time']:.2f} |" if cc else "| – | – |"
            print(f"| {r['kv_MiB']:.0f} MiB | {r['real_time']:.1f} | {bw / 1e9:.0f} | {bw / copy_bw:.0%} {tail}")
    for name, r in m.items():
        if name.startswith("BM_decode_attention_h2o/"):
            plain = m.get(name.replace("_h2o", ""))
            if plain:
                print(f"\nDecode attention with H2O's mass, {r['kv_MiB']:.0f} MiB of KV: {r['real_time']:.1f} µs, "
                      f"{r['real_time'] / plain['real_time']:.2f}x the attention alone.")
    print("\n| selection / eviction | entries | time (µs) |")
    print("| --- | ---: | ---: |")
    for name, r in m.items():
        if name.startswith(("BM_segmented_topk", "BM_global_topk", "BM_evict_step")):
            print(f"| {name.replace('/manual_time', '')} | {r['entries']:.0f} | {r['real_time']:.1f} |")
    if ref:
        seg = m.get("BM_segmented_topk/manual_time")
        if seg:
            print(f"\nSegmented top-K: torch.topk {ref['topk_segmented_us']:.1f} µs, ours {seg['real_time']:.1f} µs "
                  f"({ref['topk_segmented_us'] / seg['real_time']:.1f}x faster).")
        for g in ref["topk_global"]:
            ours = m.get(f"BM_global_topk/{g['batch']}/manual_time")
            if ours:
                print(f"Global top-K, batch {g['batch']}: torch.topk {g['us']:.1f} µs, ours {ours['real_time']:.1f} µs "
                      f"({g['us'] / ours['real_time']:.1f}x faster).")
    step = m.get("BM_evict_step/8/manual_time")
    attn = m.get("BM_decode_attention_36_layers/manual_time")
    if step and attn:
        print(f"\nOne eviction step (batch 8, L 36, Hkv 8, M 1024): {step['real_time']:.1f} µs; one decode attention "
              f"step over the same cache (36 layers): {attn['real_time']:.1f} µs; ratio "
              f"{step['real_time'] / attn['real_time']:.1%} (goal ≤ 5%).")


if __name__ == "__main__":
    main()
