#!/usr/bin/env python3
"""Prints the GPU results table of docs/perf.md from one run of kvpolicy_bench_cuda (JSON, with
--benchmark_repetitions: the medians are used). Every ratio is between figures of that one run."""
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
    copy = m.get("BM_copy/1024/manual_time")
    copy_bw = copy["bytes_per_second"] if copy else float("nan")
    print(f"Copy bandwidth (device to device, read + write): {copy_bw / 1e9:.0f} GB/s\n")
    print("| decode attention, KV | time (µs) | K+V read (GB/s) | / copy bandwidth |")
    print("| ---: | ---: | ---: | ---: |")
    for name, r in m.items():
        if name.startswith("BM_decode_attention/"):
            bw = r["bytes_per_second"]
            print(f"| {r['kv_MiB']:.0f} MiB | {r['real_time']:.1f} | {bw / 1e9:.0f} | {bw / copy_bw:.0%} |")
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
    step = m.get("BM_evict_step/8/manual_time")
    attn = m.get("BM_decode_attention_36_layers/manual_time")
    if step and attn:
        print(f"\nOne eviction step (batch 8, L 36, Hkv 8, M 1024): {step['real_time']:.1f} µs; one decode attention "
              f"step over the same cache (36 layers): {attn['real_time']:.1f} µs; ratio "
              f"{step['real_time'] / attn['real_time']:.1%} (goal < 10%).")


if __name__ == "__main__":
    main()
