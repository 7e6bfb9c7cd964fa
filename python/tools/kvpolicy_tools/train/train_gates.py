"""Trains one gate (TRIM-KV's rg, DBTrimKV's tied rg10, or WG-KV's write gate) on a frozen
LLaMA-family model with its paper's objective, and writes it under SPEC's tensor names for
kvpolicy-lm --gate and kvpolicy-replay --gate.

  kvpolicy-train-gates --gate rg --gguf build/train/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out build/train/rg --steps 200 --seq-len 512 --memory 128
  kvpolicy-train-gates --gate rg --tiny --out /tmp/rg --steps 8      (a random tiny model)

  kvpolicy-train-gates --gate rg --gguf ... --data longrange --memory-range 16 256 ...
      (documents with facts at random depths and questions at the end, longrange.py; M drawn per step)

Resumes from OUT/checkpoint.pt when it exists; logs every step to OUT/log.csv and plots the curves
to OUT/curves.png at each checkpoint; the gate is OUT/gate.safetensors (docs/training.md).
"""
import argparse
import csv
import json
import math
import os
import platform
import random
import time

import torch
from tqdm import tqdm

from kvpolicy_tools.data import corpus, longrange
from kvpolicy_tools.train import objectives
from kvpolicy_tools.train.gated_attention import GatedModel
from kvpolicy_tools.train.gates import attention_head_size, gate_file, make_gate
from kvpolicy_tools.train.runs import export, plot, schedule

POLICY = {"rg": "trimkv", "rg10": "dbtrimkv", "wg": "wgkv"}


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gate", required=True, choices=["rg", "rg10", "wg"])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="a LLaMA-family GGUF file transformers can load (kvpolicy-lm's model source)")
    src.add_argument("--hf", help="a transformers model directory (a LLaMA-family checkpoint)")
    src.add_argument("--tiny", action="store_true", help="a tiny random LLaMA built in code, byte tokens (tests)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", choices=["text", "longrange"], default="text",
                    help="text: windows of the Debian handbook (or --text); longrange: documents with facts at random "
                         "depths and questions at the end (longrange.py), mixed with plain prose")
    ap.add_argument("--text", help="text: train on this file instead of the Debian handbook (corpus.py); "
                                   "longrange: the prose to insert facts into, instead of longrange.py's train haystack")
    ap.add_argument("--prose-fraction", type=float, default=0.25, help="longrange: the share of steps on plain prose")
    ap.add_argument("--numerals", type=float, default=0.0,
                    help="longrange: the share of documents with facts that also hold lines of long numbers that "
                         "are not facts (longrange.numeral_line)")
    ap.add_argument("--answer-weight", type=float, default=1.0,
                    help="longrange: weight of the quality term over the answer tokens (objectives.py)")
    ap.add_argument("--keep-weight", type=float, default=0.0,
                    help="longrange, rg and rg10: weight of L_keep, which keeps the stated facts' tokens (objectives.py)")
    ap.add_argument("--rank-weight", type=float, default=0.0,
                    help="longrange, rg and rg10: weight of L_rank, which ranks the stated facts' tokens above the "
                         "M-th best other token at the document's end (objectives.py)")
    ap.add_argument("--memory-range", type=int, nargs=2, metavar=("LO", "HI"),
                    help="draw the training M per step, log-uniform in [LO, HI] (one gate for every budget); "
                         "--memory is then unused")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence (batch 1)")
    ap.add_argument("--memory", type=int, default=128, help="training M per (layer, kv head) of the capacity loss")
    ap.add_argument("--lam", type=float, default=None, help="lambda_cap (rg, rg10; default 1) or lambda_sparsity (wg; default 0.1)")
    ap.add_argument("--local-window", type=int, default=64, help="wg: W_local of the write-gated attention")
    ap.add_argument("--width", type=int, default=128, help="gate MLP width I (rg, rg10)")
    ap.add_argument("--bias-init", type=float, default=None, help="the gate's output bias at the start")
    ap.add_argument("--init", metavar="CHECKPOINT",
                    help="start from the gate in another run's checkpoint.pt or a committed rg/rg10 .safetensors "
                         "(same gate and width; a fresh optimizer)")
    ap.add_argument("--policy", choices=["trimkv", "dbtrimkv"],
                    help="rg10: the eviction the gate is trained for, so its capacity hinge: dbtrimkv's global one "
                         "(the default) or trimkv's per head (TRIM-KV runs an rg10 file, SPEC §1); rg: trimkv only")
    ap.add_argument("--train-layers", metavar="LIST",
                    help="rg, rg10: train only these layers' gate parameters (e.g. 0,25-29; the rest and rg10's shared "
                         "readout stay as --init gave them): to mend the layers where a gate does not rank facts")
    ap.add_argument("--anchor", metavar="GATE",
                    help="rg, rg10: a written retention gate (.safetensors) whose ranking of the tokens that are not "
                         "stated facts the trained gate keeps (L_anchor, objectives.py): e.g. the committed handbook "
                         "gate, whose prose ranking keeps perplexity, while L_keep and L_rank lift the facts")
    ap.add_argument("--anchor-weight", type=float, default=1.0, help="the weight of L_anchor (with --anchor)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of the steps with a linear warm-up")
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope-layout", choices=["adjacent", "half"], default=None,
                    help="the key layout the written write gate expects: adjacent (llama.cpp's, kvpolicy-lm; "
                         "the default for --gguf and --tiny) or half (transformers')")
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many steps of this run, checkpointed (resume later)")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds for the training loop: the step count (at most --steps) is chosen from timed steps "
                         "that change nothing, and the summary records it (--steps N repeats the run); a run still "
                         "going at 1.15x the budget stops there and is exported as truncated")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args()
    for name, low in (("steps", 1), ("seq_len", 2), ("memory", 1), ("width", 1), ("local_window", 1),
                      ("checkpoint_every", 1), ("stop_after", 0), ("threads", 0), ("time_budget", 0)):
        if getattr(a, name) < low:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= {low}")
    if a.memory_range and not 1 <= a.memory_range[0] <= a.memory_range[1]:
        ap.error(f"--memory-range {a.memory_range[0]} {a.memory_range[1]}: need 1 <= LO <= HI")
    if not 0 <= a.numerals <= 1:
        ap.error(f"--numerals {a.numerals} must be in [0, 1]")
    if not 0 <= a.prose_fraction <= 1 or a.answer_weight < 0 or a.keep_weight < 0 or a.rank_weight < 0:
        ap.error(f"--prose-fraction {a.prose_fraction} must be in [0, 1], --answer-weight {a.answer_weight}, "
                 f"--keep-weight {a.keep_weight} and --rank-weight {a.rank_weight} >= 0")
    if a.gate == "wg" and a.policy:
        ap.error(f"--policy {a.policy}: a write gate is WG-KV's")
    if a.gate == "rg" and a.policy == "dbtrimkv":
        ap.error("--policy dbtrimkv: an rg gate is TRIM-KV's (DBTrimKV reads a tied gate: --gate rg10)")
    a.policy = a.policy or POLICY[a.gate]
    if a.anchor is not None and (a.gate == "wg" or not a.anchor_weight > 0):
        ap.error(f"--anchor {a.anchor} --anchor-weight {a.anchor_weight}: an anchor is for the retention gates "
                 "(rg, rg10), with a weight > 0")
    if a.train_layers is not None:
        if a.gate == "wg":
            ap.error("--train-layers is for the retention gates (rg, rg10)")
        try:
            a.train_layers = layer_list(a.train_layers)
        except ValueError as e:
            ap.error(f"--train-layers {a.train_layers}: {e}")
    if not a.lr > 0 or a.weight_decay < 0 or not 0 <= a.warmup < 1:
        ap.error(f"--lr {a.lr} must be > 0, --weight-decay {a.weight_decay} >= 0, --warmup {a.warmup} in [0, 1)")
    return a


def global_budget(a):
    """Whether the capacity hinge is DBTrimKV's global one (the policy the gate is trained for); None:
    the gate's own policy decides."""
    policy = getattr(a, "policy", None)
    return None if policy is None else policy == "dbtrimkv"


def layer_list(text):
    """'0,25-29' -> [0, 25, 26, 27, 28, 29]; a malformed or empty list raises ValueError naming the part."""
    out = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
            raise ValueError(f"'{part}' is not a layer or a range LO-HI")
        out.update(range(int(lo), int(hi if sep else lo) + 1))
    return sorted(out)


def trained_parameters(gate, layers):
    """The parameters a run trains: every one of the gate's, or with `layers` only those layers' own
    (linear1, linear2, and rg's per-layer bias); the others are frozen (requires_grad off)."""
    if layers is None:
        return list(gate.parameters())
    n = len(gate.linear1)
    if layers[-1] >= n:
        raise SystemExit(f"train_gates: --train-layers names layer {layers[-1]}; the model has {n} (0-{n - 1})")
    gate.requires_grad_(False)
    own = [m[l] for m in (gate.linear1, gate.linear2) for l in layers]
    if gate.kind == "rg":
        own += [gate.bias[l] for l in layers]
    params = [p for m in own for p in (m.parameters() if isinstance(m, torch.nn.Module) else [m])]
    for p in params:
        p.requires_grad_(True)
    return params


def tiny_model(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval(), None


def load_model(a):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a.tiny:
        return tiny_model(a.seed)
    if a.gguf:
        d, f = os.path.dirname(os.path.abspath(a.gguf)), os.path.basename(a.gguf)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    else:
        model = AutoModelForCausalLM.from_pretrained(a.hf, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(a.hf)
    if model.config.model_type not in ("llama", "qwen2", "qwen3", "mistral"):
        raise SystemExit(f"train_gates: model type '{model.config.model_type}' is not LLaMA-family")
    return model.eval(), tok


def token_stream(a, tok, out):
    """The training text's token ids, cached in OUT (the handbook tokenizes in about a minute)."""
    cache = os.path.join(out, "tokens.pt")
    if os.path.exists(cache):
        return torch.load(cache)
    if a.text:
        with open(a.text, encoding="utf-8", errors="replace") as f:
            text = f.read()
    else:
        text = corpus.handbook_text()
    corpus.check_disjoint(text, extra=[("the held-out Python tutorial", corpus.heldout_python_text())]
                          if os.path.isfile(corpus.PYTHON_TUTORIAL_CLASSES) else [])
    ids = torch.tensor(list(text.encode("utf-8")) if tok is None else tok(text, add_special_tokens=False)["input_ids"])
    torch.save(ids, cache)
    return ids


def encode(tok, text, *span_lists):
    """Token ids of a document and, per list of character spans, the mask of the tokens inside them."""
    if tok is None:  # byte tokens (the tiny model)
        data = text.encode("utf-8")
        masks = []
        for spans in span_lists:
            mask = torch.zeros(len(data), dtype=torch.bool)
            for s, e in spans:
                mask[len(text[:s].encode("utf-8")):len(text[:e].encode("utf-8"))] = True
            masks.append(mask)
        return (torch.tensor(list(data)), *masks)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    masks = [torch.tensor([any(a < e and b > s for s, e in spans) for a, b in enc["offset_mapping"]], dtype=torch.bool)
             for spans in span_lists]
    return (torch.tensor(enc["input_ids"]), *masks)


class LongRangeData:
    """Step -> (ids [1, <= T], answer mask, fact mask): a fresh document per step from longrange.py's train
    part, seeded by (seed, step) so a resumed run sees what an uninterrupted one saw. Refuses held-out
    material (longrange.check_train_document) and a haystack that shares a 12-word span with an
    evaluation text (corpus.check_disjoint)."""

    def __init__(self, a, tok):
        self.a, self.tok = a, tok
        self.haystack = None
        if a.text:
            with open(a.text, encoding="utf-8", errors="replace") as f:
                self.haystack = f.read()
        text = self.haystack or longrange.haystack("train")
        held_out = longrange.haystack("heldout") if longrange.has_haystack("heldout") else None
        corpus.check_disjoint(text, extra=[("the held-out haystack", held_out)] if held_out else [])

    def __call__(self, step):
        return self.probed(step)[:3]

    def probed(self, step):
        """(ids, answer mask, fact mask) of step's document and, fourth, its probe's ids [1, P]
        (longrange.probe: every fact asked after the document; P = 0 for plain prose)."""
        a = self.a
        rng = random.Random(a.seed * 1_000_003 + step)
        prose = rng.random() < a.prose_fraction
        target = int(1.1 * a.seq_len)  # a little over: the loop below shrinks it to fit
        if self.tok is None:
            target = int(a.seq_len / longrange.CHARS_PER_TOKEN)  # byte tokens: one a character
        for _ in range(4):  # shrink the document until it fits T tokens
            text, spans, facts, inserted, probe = longrange.train_document_probed(
                rng, target, prose_only=prose, haystack_text=self.haystack, numerals=a.numerals,
                restated=getattr(a, "restated_variables", False))
            longrange.check_train_document(inserted + probe.split("\n"))
            ids, answers, stated = encode(self.tok, text, spans, facts)
            if ids.numel() <= a.seq_len:
                break
            target = int(target * a.seq_len / ids.numel() * 0.97)
        probe_ids = encode(self.tok, probe)[0] if probe else torch.zeros(0, dtype=ids.dtype)
        return tuple(t[-a.seq_len:].unsqueeze(0) for t in (ids, answers, stated)) + (probe_ids.unsqueeze(0),)


def training_memory(a, step):
    """The capacity loss's M at this step: fixed, or drawn log-uniform from --memory-range (seeded by step)."""
    if not a.memory_range:
        return a.memory
    lo, hi = a.memory_range
    u = random.Random(a.seed * 7_919 + step).random()
    return int(round(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))))


def budgeted_steps(a, gm, gate, x, lam, answers=None, facts=None, anchor=None):
    """The steps that fit a.time_budget: three forward-backward passes on the first window, timed
    after the first (allocation, kernel selection), then the gradients dropped; the optimizer never
    steps, so the run that follows is the run `--steps N` gives."""
    seconds = []
    for _ in range(3):
        t0 = time.time()
        loss, _ = objectives.objective(gm, x, training_memory(a, 0), lam, answers, a.answer_weight, facts,
                                       getattr(a, "keep_weight", 0.0), getattr(a, "rank_weight", 0.0),
                                       global_budget(a), anchor, getattr(a, "anchor_weight", 0.0))
        loss.backward()
        loss.item()
        seconds.append(time.time() - t0)
    gate.zero_grad(set_to_none=True)
    per_step = sum(seconds[1:]) / 2
    return max(1, min(a.steps, int(a.time_budget / per_step)))


def main():
    a = parse()
    os.makedirs(a.out, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    model, tok = load_model(a)
    model.requires_grad_(False)
    model.to(device)
    config = model.config
    head_dim = attention_head_size(config)
    lam = a.lam if a.lam is not None else (0.1 if a.gate == "wg" else 1.0)
    torch.manual_seed(a.seed)
    gate = make_gate(a.gate, config, a.width, bias_init=a.bias_init).to(device)
    if a.init:
        try:
            kind, width, load = gate_file(a.init, device)
            if (kind, width) != (a.gate, a.width):
                raise ValueError(f"holds a gate of kind {kind} and width {width}, not {a.gate} and {a.width}")
            load(gate, head_dim)
        except ValueError as e:
            raise SystemExit(f"train_gates: --init {a.init}: {e}")
    anchor = None
    if a.anchor:
        try:
            if not a.anchor.endswith(".safetensors"):  # as scale_gate.py: a checkpoint.pt is exported first
                raise ValueError("not a written gate (.safetensors)")
            kind, width, load = gate_file(a.anchor, device)
            if kind == "wg":
                raise ValueError("holds a write gate; an anchor is a retention gate (rg, rg10)")
            anchor = make_gate(kind, config, width).to(device)
            load(anchor, head_dim)
            anchor.requires_grad_(False)
        except ValueError as e:
            raise SystemExit(f"train_gates: --anchor {a.anchor}: {e}")
    gm = GatedModel(model, gate, a.local_window)
    params = trained_parameters(gate, a.train_layers)
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=a.weight_decay)

    T = a.seq_len
    if a.data == "longrange":
        documents = LongRangeData(a, tok)

        def batch(step):
            return tuple(t.to(device) for t in documents(step))
    else:
        ids = token_stream(a, tok, a.out)
        windows = ids.numel() // T
        if windows < 1:
            raise SystemExit(f"train_gates: the text has {ids.numel()} tokens, fewer than --seq-len {T}")
        order = torch.randperm(windows, generator=torch.Generator().manual_seed(a.seed))

        def batch(step):
            w = int(order[step % windows])
            return ids[w * T:(w + 1) * T].unsqueeze(0).to(device), None, None

    ckpt_path, log_path = os.path.join(a.out, "checkpoint.pt"), os.path.join(a.out, "log.csv")
    start, elapsed = 0, 0.0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device)
        if a.time_budget:  # the step count the budgeted run chose
            a.steps = ck["args"]["steps"]
        for key in ("gate", "width", "seq_len", "steps", "seed", "data", "memory_range", "keep_weight", "rank_weight",
                    "init", "train_layers", "policy", "anchor", "anchor_weight"):  # not another run's
            if ck["args"].get(key, {"data": "text", "keep_weight": 0.0, "rank_weight": 0.0, "anchor_weight": 1.0,
                                     "policy": POLICY[a.gate]}.get(key)) != getattr(a, key):
                raise SystemExit(f"train_gates: {ckpt_path} is a run with --{key.replace('_', '-')} {ck['args'][key]}, "
                                 f"not {getattr(a, key)}: give another --out, or delete it to start again")
        gate.load_state_dict(ck["gate"])
        opt.load_state_dict(ck["optimizer"])
        start, elapsed = ck["step"], ck["seconds"]
        print(f"train_gates: resumed at step {start} from {ckpt_path}")
        if os.path.exists(log_path):  # steps logged after the checkpoint run again: keep one row each
            with open(log_path) as f:
                kept = [r for r in csv.DictReader(f) if int(r["step"]) <= start]
            with open(log_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(kept[0]) if kept else ["step"])
                w.writeheader()
                w.writerows(kept)
    else:
        if os.path.exists(log_path):  # a log without its checkpoint: another run's
            os.remove(log_path)
        if a.time_budget:
            x, answers, facts = batch(0)
            a.steps = budgeted_steps(a, gm, gate, x, lam, answers, facts, anchor)
            print(f"train_gates: {a.steps} steps fit --time-budget {a.time_budget:g} s")
    fields = ["step", "lr", "loss", "kl", "ce", "cap"] if a.gate != "wg" else ["step", "lr", "loss", "distill", "sparsity", "admitted"]
    fields += (["answer"] + (["keep"] if a.keep_weight > 0 and a.gate != "wg" else [])
               + (["rank"] if a.rank_weight > 0 and a.gate != "wg" else [])) if a.data == "longrange" else []
    fields += ["anchor"] if anchor is not None else []
    fields += ["memory"] if a.memory_range else []
    fields += ["seconds", "tokens"]
    new_log = not os.path.exists(log_path)
    log_file = open(log_path, "a", newline="")
    writer = csv.DictWriter(log_file, fieldnames=fields)
    if new_log:
        writer.writeheader()

    def save_checkpoint(step):
        torch.save({"gate": gate.state_dict(), "optimizer": opt.state_dict(), "step": step, "seconds": elapsed,
                    "args": vars(a)}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)
        log_file.flush()
        plot(log_path, os.path.join(a.out, "curves.png"))

    bar = tqdm(range(start, a.steps), initial=start, total=a.steps, disable=a.no_progress, dynamic_ncols=True)
    row, truncated, tokens_seen = {}, 0, 0
    if start and os.path.exists(log_path):
        with open(log_path) as f:
            tokens_seen = max([int(r["tokens"]) for r in csv.DictReader(f)] or [0])
    for step in bar:
        t0 = time.time()
        for group in opt.param_groups:
            group["lr"] = a.lr * schedule(step, a.steps, a.warmup)
        x, answers, facts = batch(step)
        memory = training_memory(a, step)
        loss, parts = objectives.objective(gm, x, memory, lam, answers, a.answer_weight, facts, a.keep_weight,
                                           a.rank_weight, global_budget(a), anchor, a.anchor_weight)
        for k in ("answer", "keep", "rank"):  # a prose step has none of them (an empty cell)
            if k in fields and k not in parts:
                parts[k] = None
        tokens_seen += x.shape[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        elapsed += time.time() - t0
        row = {"step": step + 1, "lr": f"{opt.param_groups[0]['lr']:.3g}", "loss": f"{loss.item():.5f}",
               **{k: "" if v is None else f"{v.item():.5f}" for k, v in parts.items()},
               **({"memory": memory} if a.memory_range else {}), "seconds": f"{elapsed:.1f}", "tokens": tokens_seen}
        writer.writerow(row)
        bar.set_postfix({k: row[k] for k in fields if k not in ("step", "lr", "seconds", "tokens", "memory")})
        if (step + 1) % a.checkpoint_every == 0 or step + 1 == a.steps or step + 1 - start == a.stop_after:
            save_checkpoint(step + 1)
        if step + 1 - start == a.stop_after and step + 1 < a.steps:
            log_file.close()
            print(f"train_gates: stopped after step {step + 1} (--stop-after); run again to resume")
            return
        if a.time_budget and elapsed > 1.15 * a.time_budget and step + 1 < a.steps:
            save_checkpoint(step + 1)
            truncated = step + 1
            print(f"train_gates: --time-budget {a.time_budget:g} s overrun: exported after step {truncated} of {a.steps}")
            break
    log_file.close()
    with open(log_path) as f:  # the last step's losses, also when a finished run is run again (export only)
        rows = list(csv.DictReader(f))
    row = rows[-1] if rows else row

    adjacent = (a.rope_layout or ("half" if a.hf else "adjacent")) == "adjacent"
    meta = {"kvpolicy_gate": a.gate, "policy": a.policy, "steps": a.steps, "seq_len": T,
            "memory": "%d-%d drawn" % tuple(a.memory_range) if a.memory_range else a.memory, "lambda": lam,
            "data": a.data, **({"prose_fraction": a.prose_fraction, "numerals": a.numerals, "answer_weight": a.answer_weight,
                                "keep_weight": a.keep_weight, "rank_weight": a.rank_weight}
                               if a.data == "longrange" else {}), "lr": a.lr, "seed": a.seed, "width": a.width,
            "local_window": a.local_window, "rope_layout": "adjacent" if adjacent else "half",
            **({"init": a.init} if a.init else {}),
            **({"anchor": a.anchor, "anchor_weight": a.anchor_weight} if a.anchor else {}),
            "model": os.path.basename(a.gguf or a.hf or "tiny")}
    export(gate, os.path.join(a.out, "gate.safetensors"), head_dim, adjacent, meta)
    done = truncated or a.steps
    if truncated:
        meta["truncated_at"] = truncated
    seen = int(row.get("tokens") or done * T)
    summary = {**meta, "tokens_seen": seen, "seconds": round(elapsed, 1),
               "tokens_per_second": round(seen / max(elapsed, 1e-9), 1), "device": str(device),
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
               "final": row}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
