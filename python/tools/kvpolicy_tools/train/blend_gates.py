#!/usr/bin/env python3
"""Interpolates two exported gates of the same kind and shape, weight by weight (as WiSE-FT blends a
fine-tuned model with the one it started from): out = (1 - alpha) * FROM + alpha * TO. Meaningful
when TO was fine-tuned from FROM (`kvpolicy-train-gates --init FROM`), so both lie in one basin; alpha
trades what the fine-tuning taught (alpha = 1) against what FROM kept (alpha = 0).

  python -m kvpolicy_tools.train.blend_gates FROM TO ALPHA OUT

Each tensor is blended in fp32 and stored in FROM's dtype (bf16 matrices, fp32 vectors, as
runs.export writes them). OUT's metadata is TO's, with `blend` saying what was blended.
Refuses gates whose names, shapes, dtypes or kinds differ, and an ALPHA outside [0, 1].
"""
import argparse
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def blend(src, dst, alpha, out):
    if not 0.0 <= alpha <= 1.0:
        raise SystemExit(f"blend_gates: ALPHA {alpha} is outside [0, 1]")
    a, b = safe_open(src, "pt"), safe_open(dst, "pt")
    kind_a, kind_b = ((g.metadata() or {}).get("kvpolicy_gate") for g in (a, b))
    if kind_a != kind_b:
        raise SystemExit(f"blend_gates: {src} is a {kind_a} gate and {dst} a {kind_b} gate")
    if sorted(a.keys()) != sorted(b.keys()):
        raise SystemExit(f"blend_gates: {src} and {dst} hold different tensors: "
                         f"{sorted(set(a.keys()) ^ set(b.keys()))}")
    tensors = {}
    for k in a.keys():
        x, y = a.get_tensor(k), b.get_tensor(k)
        if x.shape != y.shape or x.dtype != y.dtype:
            raise SystemExit(f"blend_gates: {k} is {tuple(x.shape)} {x.dtype} in {src}, "
                             f"{tuple(y.shape)} {y.dtype} in {dst}")
        tensors[k] = ((1.0 - alpha) * x.float() + alpha * y.float()).to(x.dtype).contiguous()
    meta = dict(b.metadata() or {})
    meta["blend"] = f"{1.0 - alpha:g} x {src} + {alpha:g} x {dst}"
    save_file(tensors, out, metadata=meta)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", metavar="FROM")
    ap.add_argument("dst", metavar="TO")
    ap.add_argument("alpha", metavar="ALPHA", type=float)
    ap.add_argument("out", metavar="OUT")
    args = ap.parse_args()
    blend(args.src, args.dst, args.alpha, args.out)
    print(args.out, file=sys.stderr)
