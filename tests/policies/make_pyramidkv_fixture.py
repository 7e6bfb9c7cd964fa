#!/usr/bin/env python3
"""Writes tests/policies/fixtures/pyramidkv_kvpress.safetensors: NVIDIA kvpress 0.5.5's PyramidKVPress
on a tiny random LLaMA (4 layers, 2 kv heads, 4 query heads, d = 8; seeded, built in code: no model
to fetch), 96 random tokens, so that test_pyramidkv.cpp compares kvpolicy with kvpress without PyPI.

The file is a kvpolicy-replay trace (the post-RoPE queries, keys and values each layer's attention
saw: kvpolicy_tools.eval.kvpress_survivors's record_trace) plus, for each configuration (M, W_obs, beta):
  configs         I64 [C, 3]            M, W_obs and beta (kvpress: compression_ratio = 1 - M / T)
  kvpress_budget  I64 [C, L]            PyramidKVPress.get_layer_budget(layer, T)
  kvpress_kept    I64 [C, L, Hkv, T]    1 where kvpress keeps the position
Two configurations build a pyramid (the layers' budgets differ), one falls back to SnapKV's uniform M.

Run once in kvpress's venv (tools/kvpress-check.sh makes it, build/kvpress/venv):
  PYTHONPATH=python/tools build/kvpress/venv/bin/python tests/policies/make_pyramidkv_fixture.py
"""
import os
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
from kvpolicy_tools.eval.kvpress_survivors import kvpress_survivors, record_trace

T = 96
CONFIGS = [(48, 16, 3), (24, 8, 3), (12, 8, 3)]  # the last: M / beta < W_obs, kvpress's uniform fallback


def main():
    from kvpress import PyramidKVPress
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    ids = torch.randint(0, config.vocab_size, (1, T))
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.safetensors")
        L, H = record_trace(model, ids, trace)
        tensors = load_file(trace)
    budgets, kept = [], []
    for M, window, beta in CONFIGS:
        press = PyramidKVPress(compression_ratio=1 - M / T, window_size=window, kernel_size=5, beta=beta)
        k, _ = kvpress_survivors(model, ids, press, adakv=False)
        kept.append(np.stack([k[l] for l in range(L)]).astype(np.int64))
        budgets.append([press.get_layer_budget(layer.self_attn, T) for layer in model.model.layers])
        print(f"M {M}, W_obs {window}, beta {beta}: kvpress's layer budgets {budgets[-1]}")
    tensors["configs"] = np.array(CONFIGS, np.int64)
    tensors["kvpress_budget"] = np.array(budgets, np.int64)
    tensors["kvpress_kept"] = np.stack(kept)
    out = os.path.join(ROOT, "tests", "policies", "fixtures", "pyramidkv_kvpress.safetensors")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    save_file(tensors, out, metadata={"source": "kvpress 0.5.5 PyramidKVPress (tests/policies/make_pyramidkv_fixture.py)"})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
