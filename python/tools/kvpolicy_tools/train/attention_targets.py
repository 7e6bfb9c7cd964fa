"""Retention targets from the frozen model's own attention: what each token is worth to later queries.

A top-M eviction at step t keeps, per (layer, kv head), the M entries with the largest score (SPEC §1).
What it should keep is what the full model's later queries read. For a document the model reads once
with full attention, the target of key i at step t in kv head h of layer l is

    y[l, h, t, i] = max over t' >= t and over the query heads of h's GQA group of A[t', i]

(A the softmax attention of the full model): the most any query from t on gives key i. It is
non-increasing in t, so a token whose last strong reader is near keeps a short life and a fact a
late question reads keeps a long one. It is the oracle's view (it knows the future); the gate has
to predict it from the token's hidden state alone, which is what the ranking loss
(kvpolicy_tools.train.ranking) teaches.

One forward pass without gradient gives a document's targets at K sampled steps and every layer's
gate input (the attention block's input after the input RMSNorm, SPEC §1), which a shard stores, so
the gates train on them many times, at the speed of the gate alone, without the model.

    kvpolicy-gate-targets --gguf MODEL.gguf --out build/train/targets --documents 400 --seq-len 1024

writes `doc-NNNNN.pt` per document (resumable: a run finds the ones written and makes the rest).
"""
import argparse
import json
import os
import random
import time

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from kvpolicy_tools.train.documents import (add_document_arguments, check_document_arguments, document_data,
                                           document_settings)

NAME = "kvpolicy_targets"


def future_max(attention, groups, steps):
    """[Hq, T, T] causal attention -> [Hkv, K, T] y with y[h, k, i] = max over t' >= steps[k] and the
    query heads q of group h of A[q, t', i]. The queries are cut into the runs between consecutive
    steps; each run's max, then a running max from the last run back, is the max from each step on."""
    Hq, T, _ = attention.shape
    bounds = [int(s) for s in steps] + [T]
    runs = torch.stack([attention[:, bounds[k]:bounds[k + 1]].amax(dim=1) for k in range(len(steps))], dim=1)
    runs = runs.view(Hq // groups, groups, len(steps), T).amax(dim=1)
    return runs.flip(1).cummax(dim=1).values.flip(1)


class TargetRecorder:
    """Runs a frozen transformers LLaMA-family model with full causal attention and records, per
    layer, the gate input [T, D] and the targets at the given steps [Hkv, K, T]."""

    def __init__(self, model):
        self.model = model
        self.steps = None
        self.inputs, self.targets = {}, {}
        AttentionInterface.register(NAME, _attention)
        model.config._attn_implementation = NAME
        for layer in model.model.layers:
            attn = layer.self_attn
            attn._kvpolicy_targets = self
            attn.register_forward_pre_hook(self._capture_input, with_kwargs=True)

    def _capture_input(self, module, args, kwargs):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        self.inputs[module.layer_idx] = x[0].detach()

    @torch.no_grad()
    def __call__(self, ids, steps):
        """ids [T] -> (x [L, T, D], y [L, Hkv, K, T]) at the K steps given."""
        self.steps = torch.as_tensor(steps)
        self.inputs.clear()
        self.targets.clear()
        self.model.model(input_ids=ids[None], use_cache=False)  # the decoder alone: no logits are needed
        L = len(self.model.model.layers)
        return (torch.stack([self.inputs[l] for l in range(L)]), torch.stack([self.targets[l] for l in range(L)]))


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    rec = module._kvpolicy_targets
    Hq, Hkv, T = query.shape[1], key.shape[1], query.shape[2]
    k = key.repeat_interleave(Hq // Hkv, dim=1)
    v = value.repeat_interleave(Hq // Hkv, dim=1)
    logits = torch.matmul(query, k.transpose(-1, -2)) * scaling
    future = torch.ones(T, T, dtype=torch.bool, device=query.device).triu(1)
    probs = F.softmax(logits.float().masked_fill(future, float("-inf")), dim=-1)
    rec.targets[module.layer_idx] = future_max(probs[0], Hq // Hkv, rec.steps)
    out = torch.matmul(probs.to(v.dtype), v)
    return out.transpose(1, 2).contiguous(), None


def sample_steps(rng, T, count, first):
    """count distinct steps in [first, T - 1], sorted (the steps a shard holds targets at)."""
    return sorted(rng.sample(range(first, T), min(count, T - first)))


def model_shape(model):
    """The model's shape the gates are made for (targets.json's "model")."""
    from kvpolicy_tools.train.gates import attention_head_size

    c = model.config
    return {"num_hidden_layers": c.num_hidden_layers, "hidden_size": c.hidden_size, "hidden_act": c.hidden_act,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": attention_head_size(c)}


def document_shard(recorder, documents, d, a):
    """Document d's shard: its ids, answer and fact masks, the K sampled steps, and the gate input
    x [L, T, D] and targets y [L, Hkv, K, T] on the recorder's model's device. With the probe, the
    queries after T read the document too: every step's target (the max from the step on) includes
    them, and the shard keeps the document's T positions."""
    ids, answers, facts, probe = (t[0] for t in documents.probed(d))
    rng = random.Random(a.seed * 1_000_033 + d)
    T = ids.numel()
    steps = sample_steps(rng, T, a.steps_per_document, min(a.first_step, T - 1))
    device = next(recorder.model.parameters()).device
    x, y = recorder((torch.cat([ids, probe]) if a.probe else ids).to(device), steps)
    return {"ids": ids, "answers": answers, "facts": facts, "steps": torch.tensor(steps), "x": x[:, :T].float(), "y": y[..., :T],
            "probe_tokens": probe.numel() if a.probe else 0}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="a LLaMA-family GGUF file transformers can load")
    src.add_argument("--hf", help="a transformers model directory")
    src.add_argument("--tiny", action="store_true", help="a tiny random LLaMA built in code, byte tokens (tests)")
    ap.add_argument("--out", required=True, help="the folder of the shards (doc-NNNNN.pt)")
    ap.add_argument("--documents", type=int, default=400, help="how many documents (shards) the folder holds when done")
    add_document_arguments(ap)
    ap.add_argument("--part", default="0/1", metavar="I/N",
                    help="make only the documents d with d %% N == I (N processes, one per core, fill one folder)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for name, low in (("documents", 1), ("threads", 0)):
        if getattr(a, name) < low:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= {low}")
    check_document_arguments(ap, a)
    try:
        a.part_index, a.parts = (int(x) for x in a.part.split("/"))
    except ValueError:
        ap.error(f"--part {a.part}: I/N, two integers")
    if not 0 <= a.part_index < a.parts:
        ap.error(f"--part {a.part}: need 0 <= I < N")
    return a


def main():
    from kvpolicy_tools.train.train_gates import load_model

    a = parse()
    os.makedirs(a.out, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    settings = document_settings(a)
    meta_path = os.path.join(a.out, "targets.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            held = json.load(f)["settings"]
        if held != settings:
            diff = sorted(k for k in held.keys() | settings.keys() if held.get(k) != settings.get(k))
            raise SystemExit(f"kvpolicy-gate-targets: {a.out} holds targets made with other settings ({', '.join(diff)}): "
                             "give another --out, or delete it to start again")
    model, tok = load_model(a)
    model.to(getattr(torch, a.dtype))
    if not os.path.exists(meta_path):
        with open(meta_path + f".tmp{a.part_index}", "w") as f:  # whole or absent, whichever part writes it
            json.dump({"settings": settings, "model": model_shape(model)}, f, indent=2)
        os.replace(meta_path + f".tmp{a.part_index}", meta_path)
    model.requires_grad_(False)
    recorder = TargetRecorder(model)
    documents = document_data(a, tok)
    tokens, seconds = 0, 0.0
    for d in range(a.documents):
        path = os.path.join(a.out, f"doc-{d:05d}.pt")
        if d % a.parts != a.part_index or os.path.exists(path):
            continue
        t0 = time.time()
        shard = document_shard(recorder, documents, d, a)
        shard["x"], shard["y"] = shard["x"].to(torch.float16), shard["y"].float()
        probe_tokens = shard.pop("probe_tokens")
        torch.save(shard, path + ".tmp")
        os.replace(path + ".tmp", path)
        seconds += time.time() - t0
        tokens += shard["ids"].numel()
        print(f"kvpolicy-gate-targets: {path}: {shard['ids'].numel()} tokens (probe {probe_tokens}), "
              f"{tokens / seconds:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
