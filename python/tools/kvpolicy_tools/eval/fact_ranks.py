"""Where a retention gate ranks a stated fact, layer by layer: for each (layer, kv head), the rank of
the fact's worst-placed token at the prompt's end under the score a top-M eviction ranks by,
(t - i) * log beta_i (SPEC §1; the S oldest tokens protected, counted as ranked first). A token of
rank r survives a top-M eviction there when r < M. Retrieval fails when the heads that copy the
answer lose it; this says which layers' gates do not rank the fact, before any retrieval run.

  python -m kvpolicy_tools.eval.fact_ranks --gguf build/train/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --gate gates/smollm2-135m/dbtrimkv.safetensors [--gate OTHER ...] \\
      [--source passkey|train] [--instances 4] [--context 1024] [--sinks 4] [--budgets "64 128"]

--source passkey: kvpolicy-retrieval's pass-key prompts (held-out prose; the fact is the key's digits).
--source train: longrange.py's training documents, cut before their first question (the fact is
every stated fact's tokens). A gate is a written .safetensors (its kind from its tensors) or a
training run's checkpoint.pt. Prints one line per layer: the median over instances of each head's
worst rank, and for each budget the share of (instance, head) pairs that keep the whole fact; then,
with --source passkey, one line per instance, fewest digits in its prose first: those digits, the
share of the top-M slots of all (layer, head) pairs that the prose's digit tokens hold (the key's
own not counted), and the share of pairs that keep the whole key, at the first budget.
"""
import argparse
import os
import random
import statistics

import torch

from kvpolicy_tools.data import longrange
from kvpolicy_tools.train.gated_attention import GatedModel
from kvpolicy_tools.train.gates import attention_head_size, gate_file, make_gate


def load_gate(path, config, head_dim):
    """A retention gate (rg, rg10) from a written gate or a checkpoint.pt (gates.gate_file)."""
    try:
        kind, width, load = gate_file(path)
    except ValueError as e:
        raise SystemExit(f"fact_ranks: {e}")
    if kind == "wg":
        raise SystemExit(f"fact_ranks: {path} is a write gate; it admits, it does not rank")
    gate = make_gate(kind, config, width)
    load(gate, head_dim)
    return gate.eval()


def documents(source, n, context, tok):
    """[(token ids, fact token indices, the prose's digits or None)] of n instances."""
    out = []
    if source == "passkey":
        from kvpolicy_tools.eval import retrieval
        for prompt, key in retrieval.instances(n, context, 0):
            enc = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
            at = prompt.find(key, prompt.find(f"The pass key is {key}."))
            fact = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < at + len(key) and b > at]
            out.append((enc["input_ids"], fact, retrieval.haystack_digits(prompt, key)))
        return out
    for k in range(n):
        text, _, spans, _ = longrange.train_document(random.Random(1000 + k), int(1.1 * context))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        q = text.find("\nQuestion:")
        end = next(i for i, (a, _) in enumerate(enc["offset_mapping"]) if a >= q)
        fact = [i for i, (a, b) in enumerate(enc["offset_mapping"][:end]) if any(a < e and b > s for s, e in spans)]
        out.append((enc["input_ids"][:end], fact, None))
    return out


def worst_ranks(log_beta, fact, sinks):
    """[H] rank of each head's worst-placed fact token among all tokens at the last position."""
    T = log_beta.shape[-1]
    score = log_beta * torch.arange(T - 1, -1, -1, dtype=log_beta.dtype)
    score[:, :sinks] = float("inf")
    f = score[:, fact]  # [H, F]
    return (score[:, None, :] > f[:, :, None]).sum(-1).max(-1).values  # [H]


def digit_slots(log_beta, digit, sinks, budget):
    """[H] how many of each head's top-`budget` slots at the last position go to the tokens `digit`
    marks (a bool per position), under the score worst_ranks ranks by."""
    T = log_beta.shape[-1]
    score = log_beta * torch.arange(T - 1, -1, -1, dtype=log_beta.dtype)
    score[:, :sinks] = float("inf")
    top = score.topk(min(budget, T), dim=-1).indices  # [H, budget]
    return digit[top].sum(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--gate", action="append", required=True)
    ap.add_argument("--source", choices=["passkey", "train"], default="passkey")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--budgets", default="64 128")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.instances < 1 or a.context < 64 or a.sinks < 0:
        ap.error(f"--instances {a.instances} must be >= 1, --context {a.context} >= 64, --sinks {a.sinks} >= 0")
    budgets = [int(m) for m in a.budgets.split()]
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(os.path.abspath(a.gguf)), os.path.basename(a.gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval().requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    config = model.config
    head_dim = attention_head_size(config)
    docs = documents(a.source, a.instances, a.context, tok)
    gm = None
    for path in a.gate:
        gate = load_gate(path, config, head_dim)
        if gm is None:
            gm = GatedModel(model, gate)
        gm.gate = gate
        ranks = {}  # layer -> [instances, H]
        per_instance = []  # (the prose's digits, share of slots its digit tokens hold, share of pairs keeping the fact)
        for ids, fact, prose_digits in docs:
            with torch.no_grad():
                gm.student(torch.tensor([ids]))
            # the prose's digit tokens: a token whose text is digits (SmolLM2 writes a number a digit a token)
            digit = torch.tensor([t.lstrip("Ġ").isdigit() for t in tok.convert_ids_to_tokens(ids)])
            digit[fact] = False
            held = kept = pairs = 0
            for l, lb in gm.outputs.items():
                worst = worst_ranks(lb[0], fact, a.sinks)
                ranks.setdefault(l, []).append(worst)
                held += digit_slots(lb[0], digit, a.sinks, budgets[0]).sum().item()
                kept += (worst < budgets[0]).sum().item()
                pairs += worst.numel()
            per_instance.append((prose_digits, held / (pairs * budgets[0]), kept / pairs))
        print(f"{path} ({a.source}, {len(docs)} instances, {a.sinks} sinks): worst fact-token rank per head "
              f"(median over instances); share of (instance, head) keeping the whole fact at M = {budgets}")
        for l in sorted(ranks):
            r = torch.stack(ranks[l])  # [N, H]
            med = [int(statistics.median(r[:, h].tolist())) for h in range(r.shape[1])]
            kept = " ".join(f"{(r < m).float().mean().item():4.0%}" for m in budgets)
            print(f"  layer {l:2d}: {' '.join(f'{x:5d}' for x in med)}   kept {kept}")
        if a.source == "passkey":
            print(f"  per instance at M = {budgets[0]}, fewest digits in the prose first: the prose's digits; the share of "
                  "the top-M slots (all layers and heads) its digit tokens hold; the share of (layer, head) keeping the key")
            for k, (n, held, kept) in sorted(enumerate(per_instance), key=lambda x: (x[1][0], x[0])):
                print(f"  instance {k:3d}: {n:4d} digits   digit slots {held:5.1%}   key kept {kept:5.1%}")
            # the quarters kvpolicy-retrieval --by-digits counts answers in, over the same instances
            from kvpolicy_tools.eval import retrieval
            print("  by quarter of the prose's digits (means):")
            for part in retrieval.digit_parts([n for n, _, _ in per_instance]):
                if part:
                    held = statistics.mean(per_instance[i][1] for i in part)
                    kept = statistics.mean(per_instance[i][2] for i in part)
                    print(f"  digits {per_instance[part[0]][0]}–{per_instance[part[-1]][0]} ({len(part)} instances): "
                          f"digit slots {held:5.1%}   key kept {kept:5.1%}")


if __name__ == "__main__":
    main()
