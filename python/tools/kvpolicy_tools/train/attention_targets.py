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


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="a LLaMA-family GGUF file transformers can load")
    src.add_argument("--hf", help="a transformers model directory")
    src.add_argument("--tiny", action="store_true", help="a tiny random LLaMA built in code, byte tokens (tests)")
    ap.add_argument("--out", required=True, help="the folder of the shards (doc-NNNNN.pt)")
    ap.add_argument("--documents", type=int, default=400, help="how many documents (shards) the folder holds when done")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per document")
    ap.add_argument("--steps-per-document", type=int, default=16, help="K: the steps a shard holds targets at")
    ap.add_argument("--first-step", type=int, default=64, help="the earliest step sampled")
    ap.add_argument("--prose-fraction", type=float, default=0.25, help="the share of documents that are plain prose")
    ap.add_argument("--numerals", type=float, default=0.25,
                    help="the share of documents with facts that also hold lines of numbers nothing asks about")
    ap.add_argument("--text", help="a haystack file instead of the train haystack (kvpolicy_tools.data.longrange)")
    ap.add_argument("--probe", action="store_true",
                    help="read each document with its probe after it (every fact asked, distractors included: "
                         "longrange.probe), so a fact's target is what a question about it reads, whether or not the "
                         "document asks it; the shard holds the document alone")
    ap.add_argument("--part", default="0/1", metavar="I/N",
                    help="make only the documents d with d %% N == I (N processes, one per core, fill one folder)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for name, low in (("documents", 1), ("seq_len", 8), ("steps_per_document", 1), ("first_step", 1), ("threads", 0)):
        if getattr(a, name) < low:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= {low}")
    try:
        a.part_index, a.parts = (int(x) for x in a.part.split("/"))
    except ValueError:
        ap.error(f"--part {a.part}: I/N, two integers")
    if not 0 <= a.part_index < a.parts:
        ap.error(f"--part {a.part}: need 0 <= I < N")
    if a.first_step >= a.seq_len:
        ap.error(f"--first-step {a.first_step} must be below --seq-len {a.seq_len}")
    if not 0 <= a.prose_fraction <= 1 or not 0 <= a.numerals <= 1:
        ap.error(f"--prose-fraction {a.prose_fraction} and --numerals {a.numerals} must be in [0, 1]")
    return a


def main():
    from kvpolicy_tools.train.gates import attention_head_size
    from kvpolicy_tools.train.train_gates import LongRangeData, load_model

    a = parse()
    os.makedirs(a.out, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    settings = {k: getattr(a, k) for k in ("seq_len", "steps_per_document", "first_step", "prose_fraction",
                                           "numerals", "text", "seed")}
    if a.probe:  # a folder made before the probe existed holds settings without it
        settings["probe"] = True
    settings["model"] = os.path.basename(a.gguf or a.hf or "tiny")
    meta_path = os.path.join(a.out, "targets.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            held = json.load(f)["settings"]
        if held != settings:
            diff = sorted(k for k in held.keys() | settings.keys() if held.get(k) != settings.get(k))
            raise SystemExit(f"kvpolicy-gate-targets: {a.out} holds targets made with other settings ({', '.join(diff)}): "
                             "give another --out, or delete it to start again")
    model, tok = load_model(a)
    if not os.path.exists(meta_path):  # the settings, and the model's shape the gates are made for
        c = model.config
        shape = {"num_hidden_layers": c.num_hidden_layers, "hidden_size": c.hidden_size, "hidden_act": c.hidden_act,
                 "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
                 "head_dim": attention_head_size(c)}
        with open(meta_path + f".tmp{a.part_index}", "w") as f:  # whole or absent, whichever part writes it
            json.dump({"settings": settings, "model": shape}, f, indent=2)
        os.replace(meta_path + f".tmp{a.part_index}", meta_path)
    model.requires_grad_(False)
    recorder = TargetRecorder(model)
    data_args = argparse.Namespace(seed=a.seed, prose_fraction=a.prose_fraction, seq_len=a.seq_len, numerals=a.numerals,
                                   text=a.text)
    documents = LongRangeData(data_args, tok)
    tokens, seconds = 0, 0.0
    for d in range(a.documents):
        path = os.path.join(a.out, f"doc-{d:05d}.pt")
        if d % a.parts != a.part_index or os.path.exists(path):
            continue
        t0 = time.time()
        ids, answers, facts, probe = (t[0] for t in documents.probed(d))
        rng = random.Random(a.seed * 1_000_033 + d)
        T = ids.numel()
        steps = sample_steps(rng, T, a.steps_per_document, min(a.first_step, T - 1))
        # with the probe, the queries after T read the document too: every step's target (the max
        # from the step on) includes them, and the shard keeps the document's T positions
        x, y = recorder(torch.cat([ids, probe]) if a.probe else ids, steps)
        x, y = x[:, :T], y[..., :T]
        torch.save({"ids": ids, "answers": answers, "facts": facts, "steps": torch.tensor(steps),
                    "x": x.to(torch.float16), "y": y.float()}, path + ".tmp")
        os.replace(path + ".tmp", path)
        seconds += time.time() - t0
        tokens += T
        print(f"kvpolicy-gate-targets: {path}: {T} tokens (probe {probe.numel() if a.probe else 0}), "
              f"{tokens / seconds:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
