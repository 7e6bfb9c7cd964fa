#!/usr/bin/env python3
"""PyTorch baselines for the CUDA benchmarks (bench_cuda.cu), on the shapes that file uses, timed
with CUDA events (median of --reps after warm-up, inputs rotated over copies that exceed twice the
L2 so no timing reads a warm L2). Prints one JSON object; tools/gpu_table.py puts it beside
kvpolicy_bench_cuda's figures of the same run.

  copy            device-to-device copy, 1 GiB: read + write bytes / time
  sdpa/<N>        decode attention, batch 8, Hkv 8, G 4, d 128, fp16, N tokens per head (256 to 65536,
                  powers of two: 8 MiB to 2 GiB of K+V), K/V dense
                  and contiguous, SDPA's flash backend (the group folded into the query length, so
                  K/V are read once per kv head, as the paged kernel reads them)
  topk_segmented  torch.topk(k=1024) over [36*8*8, 1152] scores
  topk_global/<b> torch.topk(k=36*8*1024) over each of b rows of 36*8*1152 scores
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, copies, reps, warmup=3):
    for i in range(warmup):
        fn(i % copies)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i % copies)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def rotation(bytes_per_copy):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, -(-2 * l2 // max(bytes_per_copy, 1)) + 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    n = 1 << 28  # 1 GiB of fp32, as BM_copy/1024
    src = torch.rand(n, device=dev, generator=g)
    dst = torch.empty_like(src)
    ms = median_ms(lambda i: dst.copy_(src), 1, args.reps)
    out["copy_GBps"] = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9

    batch, hkv, group, dim = 8, 8, 4, 128
    out["sdpa"] = []
    for tokens in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):  # bench_cuda.cu's decode sizes
        per_copy = 2 * batch * hkv * tokens * dim * 2
        copies = rotation(per_copy)
        ks = [torch.randn(batch, hkv, tokens, dim, device=dev, dtype=torch.float16, generator=g) for _ in range(copies)]
        vs = [torch.randn(batch, hkv, tokens, dim, device=dev, dtype=torch.float16, generator=g) for _ in range(copies)]
        q = torch.randn(batch, hkv, group, dim, device=dev, dtype=torch.float16, generator=g)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ms = median_ms(lambda i: F.scaled_dot_product_attention(q, ks[i], vs[i]), copies, args.reps)
        out["sdpa"].append({"tokens": tokens, "kv_MiB": per_copy / 2**20, "us": ms * 1e3,
                            "GBps": per_copy / (ms * 1e-3) / 1e9})
        del ks, vs
        torch.cuda.empty_cache()

    scores = torch.rand(36 * 8 * 8, 1152, device=dev, generator=g) * -50
    ms = median_ms(lambda i: torch.topk(scores, 1024, dim=1), 1, args.reps)
    out["topk_segmented_us"] = ms * 1e3
    out["topk_global"] = []
    for b in (1, 8):
        flat = torch.rand(b, 36 * 8 * 1152, device=dev, generator=g) * -50
        ms = median_ms(lambda i: torch.topk(flat, 36 * 8 * 1024, dim=1), 1, args.reps)
        out["topk_global"].append({"batch": b, "us": ms * 1e3})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
