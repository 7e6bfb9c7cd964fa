#!/usr/bin/env python3
"""Writes the converter's fixture checkpoints (tests/converter/fixtures/) with real torch.save, in
the authors' exact key names, and what converting them must give (expected.json). Run once, by
hand, with torch installed; the files are committed and test_convert_fixtures.py checks them in CI
without torch. How they were made (2026-11-23): torch 2.15.0 from PyPI in a venv,
    python -m venv v && v/bin/pip install torch && v/bin/python tests/converter/make_fixtures.py

  trimkv_weights.pth  TRIM-KV's `rg` gate (SPEC §1), bf16, keys `model.layers.{l}.self_attn.retention_gate.*`
  dbtrimkv_rg10.pth   DBTrimKV's `rg10` gate (SPEC §2), fp32, linear3/bias tied: every layer's copy identical
  wgkv_gates.pt       WG-KV's `g_predictors` (SPEC §3), fp32, grouped 1x1 convolutions, as nn.Parameters
expected.json holds, per fixture, every converted tensor's name, dtype, shape and SHA-256 (of the
bytes torch gives for the tensor the converter must write), and for the two retention gates the
log_beta torch computes on gate_forward's input x[t][i] = sin(0.37 (t D + i)), T = 3, [L][Hkv][T].
"""
import hashlib
import json
import os
import sys

import torch

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
os.makedirs(here, exist_ok=True)
torch.manual_seed(20261123)


def raw(t):
    """The little-endian bytes of a tensor, C order (bf16/f16 as 16-bit words)."""
    t = t.detach().contiguous()
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    ints = t.view(view).reshape(-1).tolist()
    fmt = "<%d%s" % (len(ints), "i" if view == torch.int32 else "h")
    import struct

    return struct.pack(fmt, *ints)


def entry(t):
    name = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[t.dtype]
    return {"dtype": name, "shape": list(t.shape), "sha256": hashlib.sha256(raw(t)).hexdigest()}


def x_of(D):
    return torch.sin(0.37 * torch.arange(3 * D, dtype=torch.float32)).reshape(3, D)


expected = {}

# ---- TRIM-KV (rg) ----
L, D, I, H = 2, 12, 8, 2
state = {}
for l in range(L):
    p = "model.layers.%d.self_attn.retention_gate." % l
    state[p + "linear1.weight"] = (torch.randn(I, D) * 0.3).bfloat16()
    state[p + "linear1.bias"] = (torch.randn(I) * 0.1).bfloat16()
    state[p + "linear2.weight"] = (torch.randn(H, I) * 0.3).bfloat16()
    state[p + "bias"] = (torch.full((H,), 9.0) + torch.randn(H)).bfloat16()  # initialised near 8..10
state["model.norm.weight"] = torch.ones(D).bfloat16()  # another key of the model: ignored
torch.save(state, os.path.join(here, "trimkv_weights.pth"))
x, lb = x_of(D), []
for l in range(L):
    p = "model.layers.%d.self_attn.retention_gate." % l
    u = torch.nn.functional.silu(x @ state[p + "linear1.weight"].float().T + state[p + "linear1.bias"].float())
    z = u @ state[p + "linear2.weight"].float().T + state[p + "bias"].float()
    lb += torch.nn.functional.logsigmoid(z).T.reshape(-1).tolist()
expected["trimkv_weights.pth"] = {
    "kind": "trimkv", "dims": [L, D, H, I], "log_beta": lb, "ignored": 1,
    "tensors": {k: entry(v) for k, v in state.items() if "retention_gate" in k}}

# ---- DBTrimKV (rg10: two layers per layer, the readout tied) ----
L, D, I, H = 3, 10, 6, 2
w3, b = torch.randn(H, I) * 0.4, torch.full((H,), 3.0) + torch.randn(H)
state = {}
for l in range(L):
    p = "model.layers.%d.self_attn.retention_gate." % l
    state[p + "linear1.weight"] = torch.randn(I, D) * 0.3
    state[p + "linear1.bias"] = torch.randn(I) * 0.1
    state[p + "linear2.weight"] = torch.randn(I, I) * 0.3
    state[p + "linear2.bias"] = torch.randn(I) * 0.1
    state[p + "linear3.weight"] = w3.clone()
    state[p + "bias"] = b.clone()
torch.save(state, os.path.join(here, "dbtrimkv_rg10.pth"))
x, lb = x_of(D), []
for l in range(L):
    p = "model.layers.%d.self_attn.retention_gate." % l
    u = torch.nn.functional.silu(x @ state[p + "linear1.weight"].T + state[p + "linear1.bias"])
    u = torch.nn.functional.silu(u @ state[p + "linear2.weight"].T + state[p + "linear2.bias"])
    lb += torch.nn.functional.logsigmoid(u @ w3.T + b).T.reshape(-1).tolist()
expected["dbtrimkv_rg10.pth"] = {
    "kind": "dbtrimkv", "dims": [L, D, H, I], "log_beta": lb, "ignored": 0,
    "tensors": {k: entry(v) for k, v in state.items()}}

# ---- WG-KV (g_predictors as grouped 1x1 convolutions) ----
L, d, H, E = 2, 4, 2, 3
state, tensors = {}, {}
for l in range(L):
    p = "model.layers.%d.self_attn.g_predictors." % l
    q = "model.layers.%d.self_attn.write_gate." % l
    state[p + "pre_key_norm.weight"] = torch.nn.Parameter(torch.randn(d))
    state[p + "post_key_norm.weight"] = torch.nn.Parameter(torch.randn(d))
    state[p + "conv1.weight"] = torch.nn.Parameter(torch.randn(H * E, 2 * d, 1))
    state[p + "conv1.bias"] = torch.nn.Parameter(torch.randn(H * E))
    state[p + "conv2.weight"] = torch.nn.Parameter(torch.randn(H, E, 1))
    state[p + "conv2.bias"] = torch.nn.Parameter(torch.randn(H))
    tensors[q + "pre_norm.weight"] = entry(state[p + "pre_key_norm.weight"])
    tensors[q + "post_norm.weight"] = entry(state[p + "post_key_norm.weight"])
    tensors[q + "w1.weight"] = entry(state[p + "conv1.weight"].reshape(H, E, 2 * d))  # head h: rows E h .. E h + E - 1
    tensors[q + "w1.bias"] = entry(state[p + "conv1.bias"].reshape(H, E))
    tensors[q + "w2.weight"] = entry(state[p + "conv2.weight"].reshape(H, E))
    tensors[q + "w2.bias"] = entry(state[p + "conv2.bias"])
torch.save(state, os.path.join(here, "wgkv_gates.pt"))
expected["wgkv_gates.pt"] = {"kind": "wgkv", "ignored": 0, "tensors": tensors}

expected["_made_with"] = "torch %s, tests/converter/make_fixtures.py" % torch.__version__
with open(os.path.join(here, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1, sort_keys=True)
print("wrote", ", ".join(sorted(os.listdir(here))), "with torch", torch.__version__, file=sys.stderr)
