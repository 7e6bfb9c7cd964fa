#!/usr/bin/env python3
"""The peers of the CUDA benchmarks (bench_cuda.cu), on the shapes that file uses: PyTorch's SDPA-flash
and torch.topk, and FlashInfer's paged decode where `flashinfer` imports (docs/perf.md, "Decode
against FlashInfer"). Inputs are rotated over copies that exceed twice the L2, so no timing reads a
warm L2. Prints one JSON object; bench/gpu_table.py and bench/decode_table.py put it beside
kvpolicy_bench_cuda's figures of the same run.

  copy            device-to-device copy, 1 GiB: read + write bytes / time
  sdpa/<N>        decode attention, batch 8, Hkv 8, G 4, d 128, fp16, N tokens per head (256 to 65536,
                  powers of two: 8 MiB to 2 GiB of K+V), K/V dense and contiguous, SDPA's flash
                  backend (the group folded into the query length, so K/V are read once per kv
                  head, as the paged kernel reads them)
  flashinfer/<N>  the same decode on FlashInfer's BatchDecodeWithPagedKVCacheWrapper (tensor cores,
                  NHD, page 16, the pages in random order as bench_cuda.cu's)
  topk_segmented  torch.topk(k=1024) over [36*8*8, 1152] scores
  topk_global/<b> torch.topk(k=36*8*1024) over each of b rows of 36*8*1152 scores

A decode is timed two ways: `us`, one call from Python between CUDA events (the launch overhead
included), and `graph_us`, the call captured once per copy in a CUDA graph and replayed (what a
decode step replayed by an engine pays; bench_cuda.cu's decode_attention_graph). Medians of --reps.

  torch_reference.py [--reps N]            the JSON above
  torch_reference.py --once N[,N...]      no timing: for each N one call of each engine between two
                                           torch.cuda._sleep marker kernels, for ncu's kernel list
                                           (bench/ncu_kernel_time.py); prints the order of the calls
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BATCH, HKV, GROUP, DIM, PAGE = 8, 8, 4, 128, 16
TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)  # bench_cuda.cu's decode sizes


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


def graphs_of(call, copies):
    """One CUDA graph per copy, each capturing call(copy) once (after a warm call outside capture)."""
    call(0)
    torch.cuda.synchronize()
    graphs = []
    for i in range(copies):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call(i)
        graphs.append(g)
    return graphs


class Sdpa:
    name = "sdpa"

    def __init__(self, tokens, copies, gen):
        dev = "cuda"
        self.ks = [torch.randn(BATCH, HKV, tokens, DIM, device=dev, dtype=torch.float16, generator=gen) for _ in range(copies)]
        self.vs = [torch.randn_like(k) for k in self.ks]
        self.q = torch.randn(BATCH, HKV, GROUP, DIM, device=dev, dtype=torch.float16, generator=gen)

    def __call__(self, i):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(self.q, self.ks[i], self.vs[i])


class FlashInfer:
    name = "flashinfer"
    workspace = None

    def __init__(self, tokens, copies, gen):
        import flashinfer
        dev = "cuda"
        if FlashInfer.workspace is None:
            FlashInfer.workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        pages_per = tokens // PAGE
        npages = BATCH * pages_per
        self.w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(FlashInfer.workspace, "NHD", use_tensor_cores=True)
        perm = torch.randperm(npages, device=dev, generator=gen).int()  # pages scattered, as a paged engine's are
        indptr = torch.arange(0, npages + 1, pages_per, device=dev, dtype=torch.int32)
        last = torch.full((BATCH,), PAGE, device=dev, dtype=torch.int32)
        self.w.plan(indptr, perm, last, HKV * GROUP, HKV, DIM, PAGE, q_data_type=torch.float16, kv_data_type=torch.float16)
        self.caches = [torch.randn(npages, 2, PAGE, HKV, DIM, device=dev, dtype=torch.float16, generator=gen)
                       for _ in range(copies)]
        self.q = torch.randn(BATCH, HKV * GROUP, DIM, device=dev, dtype=torch.float16, generator=gen)

    def __call__(self, i):
        return self.w.run(self.q, self.caches[i])


def engines():
    out = [Sdpa]
    try:
        import flashinfer  # noqa: F401
        out.append(FlashInfer)
    except ImportError as e:
        print(f"torch_reference: flashinfer does not import ({e}): no FlashInfer rows", file=sys.stderr)
    return out


def once(tokens_list):
    """One call of each engine per size between two marker kernels; prints the calls' order."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    order = []
    for tokens in tokens_list:
        for E in engines():
            e = E(tokens, 1, gen)
            e(0)  # warm: JIT modules loaded, plans made
            torch.cuda.synchronize()
            torch.cuda._sleep(1)
            e(0)
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
            order.append({"engine": E.name, "tokens": tokens, "kv_MiB": 2 * BATCH * HKV * tokens * DIM * 2 / 2**20})
            del e
            torch.cuda.empty_cache()
    print(json.dumps({"once": order}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--once", type=str, default=None)
    args = ap.parse_args()
    if args.once:
        return once([int(t) for t in args.once.split(",")])
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    try:
        import flashinfer
        out["flashinfer_version"] = flashinfer.__version__
    except ImportError:
        pass

    n = 1 << 28  # 1 GiB of fp32, as BM_copy/1024
    src = torch.rand(n, device=dev, generator=g)
    dst = torch.empty_like(src)
    ms = median_ms(lambda i: dst.copy_(src), 1, args.reps)
    out["copy_GBps"] = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9
    del src, dst

    for E in engines():
        out[E.name] = []
        for tokens in TOKENS:
            per_copy = 2 * BATCH * HKV * tokens * DIM * 2
            copies = rotation(per_copy)
            e = E(tokens, copies, g)
            ms = median_ms(e, copies, args.reps)
            graphs = graphs_of(e, copies)
            gms = median_ms(lambda i: graphs[i].replay(), copies, args.reps)
            out[E.name].append({"tokens": tokens, "kv_MiB": per_copy / 2**20, "us": ms * 1e3, "graph_us": gms * 1e3,
                                "GBps": per_copy / (gms * 1e-3) / 1e9})
            del e, graphs
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
