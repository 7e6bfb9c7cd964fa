#!/usr/bin/env python3
"""Scales a retention gate's logit: out's log beta = logsigmoid(S * z), where GATE's is logsigmoid(z)
(SPEC §1, §2: z is the readout, `linear2` and `bias` for rg, the tied `linear3` and `bias` for rg10).
Only the readout's tensors are multiplied by S; the layers under it stay as they are. A file that
holds a token-level gate beside its per-head one (SPEC §8) has both scaled.

  python -m kvpolicy_tools.train.scale_gate GATE S OUT

Why: an eviction ranks by (t - i) * log beta_i, and where z >> 0, -log beta ~ exp(-z), so an old
token outranks a new one when their logits differ by more than log(age ratio). S < 1 shrinks those
differences: fewer old tokens outrank the newest, and only those the gate is surest of (the facts a
long-range gate learned to keep) stay old. S trades what a long-range gate retrieves against the
perplexity of prose, without training (docs/lab/training.md, "Trading retrieval for prose").

Each tensor is scaled in fp32 and stored in GATE's dtype. OUT's metadata is GATE's, with `scale`
saying by how much. Refuses S <= 0 and a file that is not a written retention gate (a write gate or a checkpoint.pt
included).
"""
import argparse
import sys

from safetensors import safe_open
from safetensors.torch import save_file

from kvpolicy_tools.train.gates import TOKEN_LEVEL, gate_file, holds_token_level_gate

READOUT = {"rg": ("linear2.weight", "bias"), "rg10": ("linear3.weight", "bias")}


def scale(src, s, out):
    if not s > 0.0:
        raise SystemExit(f"scale_gate: S {s} must be > 0 (S = 0 leaves recency alone to rank; S < 0 inverts the ranking)")
    if not src.endswith(".safetensors"):  # a checkpoint.pt is exported first (train_gates writes gate.safetensors)
        raise SystemExit(f"scale_gate: {src} is not a written gate (.safetensors)")
    try:  # the per-head gate, and the token-level one where the file holds it (SPEC §8), each of its own kind
        kinds = {"": gate_file(src)[0]}
        if holds_token_level_gate(src):
            kinds[TOKEN_LEVEL] = gate_file(src, token_level=True)[0]
    except ValueError as e:
        raise SystemExit(f"scale_gate: {e}")
    g = safe_open(src, "pt")
    tensors = {}
    for k in g.keys():
        x = g.get_tensor(k)
        prefix = TOKEN_LEVEL if k.startswith(TOKEN_LEVEL) else ""
        name = k[len(prefix):]
        readout = name.startswith("model.layers.") and name.split(".retention_gate.")[-1] in READOUT[kinds[prefix]]
        tensors[k] = (x.float() * s).to(x.dtype).contiguous() if readout else x
    meta = dict(g.metadata() or {})
    meta["scale"] = f"{s:g} x {src}'s logit"
    save_file(tensors, out, metadata=meta)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", metavar="GATE")
    ap.add_argument("s", metavar="S", type=float)
    ap.add_argument("out", metavar="OUT")
    args = ap.parse_args()
    scale(args.src, args.s, args.out)
    print(args.out, file=sys.stderr)
