"""Trains a retention gate to rank tokens as the full model's later attention does, on the targets
kvpolicy-gate-targets wrote (attention_targets.py), without running the model.

Top-M eviction at step t orders a head's entries by log_beta_i * (t + 1 - i) (SPEC §1), the same
order as the key q_i(t) = -(log(-log_beta_i) + log(t + 1 - i)) (larger keeps), which does not change
when every log_beta is scaled: the loss is read on that axis, so it has no scale to creep. At each
step t a shard holds targets at, the oracle keeps the M entries with the largest target y (the most
attention any later query gives them), M drawn log-uniform per step from --memory-range. The loss is
RankNet's: over pairs (i kept, j dropped) drawn from each ranking, softplus((q_j - q_i) / tau),
zero-gradient where the gate already orders a pair by a wide margin.

Which ranking depends on the policy the gate is for:
- trimkv (per head, SPEC §1): one ranking per (layer, kv head, step) of that head's entries;
- dbtrimkv (global, SPEC §2): one ranking per step of every (layer, kv head, entry), keeping
  L * Hkv * M (the targets are attention probabilities, one scale across heads);
- token (token level, SPEC §8): one ranking per step of positions, the gate's position key the max
  over heads of q (SPEC §8's max aggregation) and the target an aggregate over heads of y, by default
  their mean (the share of all heads' later attention a position draws; --heads-target).

  kvpolicy-rank-gates --gate rg --targets build/train/targets --out build/train/rank/rg --epochs 4

or, where the model's forward is cheap (a GPU), makes each document's targets itself as it trains,
with kvpolicy-gate-targets' settings and none stored (documents beyond any disk):

  kvpolicy-rank-gates --gate rg --gguf MODEL.gguf --documents 20000 --probe --seq-len 2048 --out DIR

Resumes from OUT/checkpoint.pt; logs every step to OUT/log.csv (the loss and the recall of the oracle's
keep set by the gate's top-M); writes OUT/gate.safetensors under SPEC's names and OUT/summary.json.
"""
import argparse
import csv
import glob
import json
import math
import os
import platform
import random
import time
import types

import torch
import torch.nn.functional as F
from tqdm import tqdm

from kvpolicy_tools.train.documents import add_document_arguments, check_document_arguments
from kvpolicy_tools.train.gates import gate_file, holds_token_level_gate, make_gate
from kvpolicy_tools.train.objectives import log_decay_rate
from kvpolicy_tools.train.runs import export, plot, schedule

POLICIES = {"rg": ("trimkv", "token"), "rg10": ("dbtrimkv", "trimkv", "token")}


def rank_keys(log_beta, steps):
    """log_beta [L, H, T], steps [K] -> q [L, H, K, T], -(log(-log_beta_i) + log(t + 1 - i)) for i <= t
    (the eviction's order, larger keeps) and -inf after t."""
    T = log_beta.shape[-1]
    age = steps.to(log_beta.device)[:, None] + 1 - torch.arange(T, device=log_beta.device)[None, :]  # [K, T]
    log_age = age.clamp(min=1).float().log().masked_fill(age < 1, float("inf"))
    return -(log_decay_rate(log_beta)[:, :, None, :] + log_age)


def ranking_pairs(keys, targets, memory, pairs, gen, weighted=False, focus=None, focus_pairs=0):
    """RankNet loss and keep-set recall of one ranking per row: keys, targets [R, n] (every column a
    candidate), the oracle keeping the `memory` largest targets of each row; `pairs` pairs per row.
    Half the pairs are drawn uniformly (a kept token, a dropped one); the other half from the gate's
    errors, a token the oracle keeps that the gate's top-M leaves out against one the gate keeps in
    its place: a pair far from the boundary is rarely in doubt, and a fact the gate ranks just too
    low competes with the entries at the boundary, not with old prose.
    weighted: each pair weighs log(y_kept / y_dropped), so a token later queries read far more than
    what it displaces counts more than one at the margin.
    focus [R, n] (bool) and focus_pairs: in a row where the oracle keeps focus tokens (the stated
    facts), that many of the uniform pairs take one of them as the kept token, against a token the
    gate keeps in its place where it misses one, else against one the oracle drops: a fact is a few
    tokens of a thousand, so uniform pairs would almost never hold one."""
    R, n = targets.shape
    order = targets.argsort(dim=1, descending=True)
    kept = order.gather(1, torch.randint(0, memory, (R, pairs), generator=gen, device=gen.device).to(order.device))
    dropped = order.gather(1, torch.randint(memory, n, (R, pairs), generator=gen, device=gen.device).to(order.device))
    oracle = torch.zeros_like(targets, dtype=torch.bool).scatter_(1, order[:, :memory], True)
    with torch.no_grad():
        chosen = torch.zeros_like(oracle).scatter_(1, keys.topk(memory, dim=1).indices, True)
    missed, intruders = oracle & ~chosen, chosen & ~oracle  # as many of each in a row
    rows = missed.any(dim=1).nonzero()[:, 0]
    half = pairs // 2
    if half and rows.numel():  # rows the gate ranks without error keep uniform pairs only
        kept[rows, :half] = torch.multinomial(missed[rows].float(), half, replacement=True, generator=gen)
        dropped[rows, :half] = torch.multinomial(intruders[rows].float(), half, replacement=True, generator=gen)
    if focus_pairs and focus is not None:
        wanted = oracle & focus
        rows = wanted.any(dim=1).nonzero()[:, 0]
        if rows.numel():
            against = torch.where(intruders[rows].any(dim=1, keepdim=True), intruders[rows], ~oracle[rows])
            cols = slice(half, half + min(focus_pairs, pairs - half))
            n_focus = cols.stop - cols.start
            kept[rows, cols] = torch.multinomial(wanted[rows].float(), n_focus, replacement=True, generator=gen)
            dropped[rows, cols] = torch.multinomial(against.float(), n_focus, replacement=True, generator=gen)
    terms = F.softplus(keys.gather(1, dropped) - keys.gather(1, kept))
    if weighted:
        tiny = torch.finfo(targets.dtype).tiny
        w = targets.gather(1, kept).clamp(min=tiny).log() - targets.gather(1, dropped).clamp(min=tiny).log()
        terms = terms * w / w.mean().clamp(min=1e-6)
    recall = (oracle & chosen).float().sum() / oracle.float().sum()
    return terms.mean(), recall


def heads_target(y, aggregate):
    """A position's token-level target from its heads' targets y [L * Hkv, n]: "mean" (the share of
    all heads' later attention it draws), "max" (the most any one head's later queries give it), or
    an integer k, the mean of its k largest (a fact read by a few retrieval heads counts for them,
    not diluted by the heads that never read it)."""
    if aggregate == "mean":
        return y.mean(dim=0, keepdim=True)
    if aggregate == "max":
        return y.amax(dim=0, keepdim=True)
    return y.topk(min(int(aggregate), y.shape[0]), dim=0).values.mean(dim=0, keepdim=True)


def document_loss(log_beta, shard, policy, memories, pairs, tau, gen, weighted=False, fact_pairs=0, keep_facts=False,
                  token_target="mean"):
    """The mean over the shard's steps of the ranking loss (and recall) for `policy`; memories[k] is
    the step's M (a step with M or fewer candidates has nothing to evict and is skipped);
    fact_pairs: of each ranking's pairs, how many take a stated fact the oracle keeps (ranking_pairs'
    focus, the shard's fact mask); keep_facts: every stated fact's token is the oracle's first choice
    in every head (its target raised to the step's largest), whoever reads it; token_target: the
    token-level ranking's aggregate of the heads' targets (heads_target)."""
    steps, y = shard["steps"], shard["y"].to(log_beta.device)
    facts = shard.get("facts") if fact_pairs or keep_facts else None
    facts = None if facts is None else facts.to(log_beta.device)
    if keep_facts and facts is not None:
        y = torch.where(facts, y.amax(dim=-1, keepdim=True), y)
    L, H, K, T = y.shape
    q = rank_keys(log_beta, steps) / tau
    losses, recalls = [], []
    for k in range(K):
        n = int(steps[k]) + 1
        M = memories[k]
        if n <= M:
            continue
        focus = facts[:n][None, :] if facts is not None else None  # [1, n]: a fact in every head
        if policy == "trimkv":
            keys, targets = q[:, :, k, :n].reshape(L * H, n), y[:, :, k, :n].reshape(L * H, n)
            loss, recall = ranking_pairs(keys, targets, M, pairs, gen, weighted,
                                         None if focus is None else focus.expand(L * H, n), fact_pairs)
        elif policy == "dbtrimkv":
            keys, targets = q[:, :, k, :n].reshape(1, -1), y[:, :, k, :n].reshape(1, -1)
            loss, recall = ranking_pairs(keys, targets, L * H * M, L * H * pairs, gen, weighted,
                                         None if focus is None else focus.repeat(L * H, 1).reshape(1, -1),
                                         L * H * fact_pairs)
        else:  # token level: a position's key is its best head's (SPEC §8), its target heads_target's
            keys = q[:, :, k, :n].reshape(L * H, n).amax(dim=0, keepdim=True)
            targets = heads_target(y[:, :, k, :n].reshape(L * H, n), token_target)
            loss, recall = ranking_pairs(keys, targets, M, 8 * pairs, gen, weighted, focus, 8 * fact_pairs)
        losses.append(loss)
        recalls.append(recall)
    if not losses:
        return None, None
    return torch.stack(losses).mean(), torch.stack(recalls).mean()


@torch.no_grad()
def evaluate(gate, shards, policy, memories, pairs, tau, seed=0, token_target="mean"):
    """Mean ranking loss and keep-set recall of `gate` over the shards (paths), every step of each at
    each M of `memories`; the pairs drawn from a generator seeded by `seed` (the same for every gate)."""
    gen = torch.Generator().manual_seed(seed)
    losses, recalls = [], []
    for path in shards:
        shard = torch.load(path)
        x = shard["x"].float()
        log_beta = torch.stack([gate(l, x[l][None])[0] for l in range(x.shape[0])])
        for M in memories:
            loss, recall = document_loss(log_beta, shard, policy, [M] * len(shard["steps"]), pairs, tau, gen,
                                         token_target=token_target)
            if loss is not None:
                losses.append(loss)
                recalls.append(recall)
    return float(torch.stack(losses).mean()), float(torch.stack(recalls).mean())


def drawn_memories(rng, count, lo, hi):
    """count budgets, log-uniform in [lo, hi]."""
    return [int(round(math.exp(math.log(lo) + rng.random() * (math.log(hi) - math.log(lo))))) for _ in range(count)]


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gate", required=True, choices=sorted(POLICIES))
    ap.add_argument("--policy", help="the eviction the gate ranks for: trimkv (rg's default), dbtrimkv (rg10's) or token")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--targets", help="kvpolicy-gate-targets' folder")
    src.add_argument("--gguf", help="make each document's targets with this model while training (no folder): "
                                    "--documents of them, with the document options below")
    src.add_argument("--tiny", action="store_true", help="--gguf's way with a tiny random LLaMA built in code (tests)")
    ap.add_argument("--documents", type=int, default=0,
                    help="with --targets, train on the first N shards only (default: all); with --gguf, how many "
                         "documents to make and train on (required)")
    add_document_arguments(ap.add_argument_group("documents made with --gguf (kvpolicy-gate-targets' options)"))
    ap.add_argument("--validate", type=int, default=0, metavar="N",
                    help="hold the last N shards out of training; the summary gives the gate's loss and recall on them")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--memory-range", type=int, nargs=2, default=[16, 256], metavar=("LO", "HI"))
    ap.add_argument("--pairs", type=int, default=64, help="pairs drawn per ranking (per head and step)")
    ap.add_argument("--tau", type=float, default=1.0, help="the loss's temperature on the key axis")
    ap.add_argument("--weighted", action="store_true", help="weigh each pair by the log ratio of its targets")
    ap.add_argument("--fact-pairs", type=int, default=0,
                    help="of each ranking's uniform pairs, how many take a stated fact the oracle keeps (at most half "
                         "of --pairs)")
    ap.add_argument("--keep-facts", action="store_true",
                    help="a stated fact's tokens are the oracle's first choice in every head, not only where later "
                         "queries read them")
    ap.add_argument("--heads-target", default="mean", metavar="AGG",
                    help="--policy token: a position's target from its heads' (mean, max, or K: the mean of its K "
                         "largest)")
    ap.add_argument("--width", type=int, default=128, help="gate MLP width I")
    ap.add_argument("--bias-init", type=float, default=8.0)
    ap.add_argument("--init", metavar="GATE", help="start from this gate (.safetensors or checkpoint.pt; a token-level "
                                                   "ranking reads a file's token-level gate where it holds one)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many steps of this run (resume later)")
    ap.add_argument("--time-budget", type=float, default=0, metavar="SECONDS",
                    help="at step 20, shorten the run to the steps that fit SECONDS at the rate measured so far (the "
                         "learning rate's schedule follows); a run still going at 1.15x stops and exports there")
    ap.add_argument("--device", default="auto", help="auto (CUDA when torch sees a GPU), cpu, cuda or cuda:N")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args()
    a.online = bool(a.gguf or a.tiny)
    a.hf = None
    a.policy = a.policy or POLICIES[a.gate][0]
    if a.policy not in POLICIES[a.gate]:
        ap.error(f"--policy {a.policy}: a {a.gate} gate ranks for {' or '.join(POLICIES[a.gate])}")
    for name, low in (("epochs", 1), ("pairs", 1), ("width", 1), ("checkpoint_every", 1), ("stop_after", 0),
                      ("threads", 0), ("documents", 1 if a.online else 0), ("validate", 0), ("fact_pairs", 0),
                      ("time_budget", 0)):
        if getattr(a, name) < low:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= {low}"
                     + (" (the documents made with --gguf)" if name == "documents" and a.online else ""))
    check_document_arguments(ap, a)
    if a.heads_target not in ("mean", "max") and not (a.heads_target.isdigit() and int(a.heads_target) >= 1):
        ap.error(f"--heads-target {a.heads_target}: mean, max or a count of heads >= 1")
    if a.heads_target != "mean" and a.policy != "token":
        ap.error(f"--heads-target {a.heads_target} is for --policy token (a per-head ranking reads each head's target)")
    if a.online and a.validate:
        ap.error(f"--validate {a.validate} holds out shards of --targets; with --gguf there are none")
    if a.fact_pairs > a.pairs - a.pairs // 2:
        ap.error(f"--fact-pairs {a.fact_pairs} is more than the {a.pairs - a.pairs // 2} uniform pairs of --pairs {a.pairs}")
    if not 1 <= a.memory_range[0] <= a.memory_range[1]:
        ap.error(f"--memory-range {a.memory_range[0]} {a.memory_range[1]}: need 1 <= LO <= HI")
    if not a.tau > 0 or not a.lr > 0 or a.weight_decay < 0 or not 0 <= a.warmup < 1:
        ap.error(f"--tau {a.tau} and --lr {a.lr} must be > 0, --weight-decay {a.weight_decay} >= 0, "
                 f"--warmup {a.warmup} in [0, 1)")
    return a


class StoredTargets:
    """--targets: kvpolicy-gate-targets' folder, its shards (the first --documents, less the last
    --validate held out) read one at a time."""

    def __init__(self, a):
        meta_path = os.path.join(a.targets, "targets.json")
        if not os.path.exists(meta_path):
            raise SystemExit(f"kvpolicy-rank-gates: {a.targets} has no targets.json: not kvpolicy-gate-targets' folder")
        with open(meta_path) as f:
            held = json.load(f)
        shards = sorted(glob.glob(os.path.join(a.targets, "doc-*.pt")))
        if a.documents:
            shards = shards[:a.documents]
        self.paths, self.held_out = shards[:len(shards) - a.validate], shards[len(shards) - a.validate:]
        if not self.paths:
            raise SystemExit(f"kvpolicy-rank-gates: {a.targets} holds no shard (doc-*.pt) to train on "
                             f"(--validate {a.validate})")
        self.shape, self.settings = held["model"], held["settings"]
        self.names = [os.path.basename(s) for s in self.paths]  # what a checkpoint trained on

    def __len__(self):
        return len(self.paths)

    def shard(self, i, device):
        shard = torch.load(self.paths[i])
        shard["x"] = shard["x"].to(device).float()
        return shard


class MadeDocuments:
    """--gguf (or --tiny): document d's targets made when it is drawn, by the frozen model on the
    training device (attention_targets.document_shard), nothing stored."""

    def __init__(self, a, device):
        from kvpolicy_tools.train.attention_targets import TargetRecorder, document_shard, model_shape
        from kvpolicy_tools.train.documents import document_data, document_settings
        from kvpolicy_tools.train.train_gates import load_model

        model, tok = load_model(a)
        model.requires_grad_(False).to(getattr(torch, a.dtype))
        self.recorder, self.make, self.a = TargetRecorder(model.to(device)), document_shard, a
        self.documents = document_data(a, tok)
        self.shape, self.settings = model_shape(model), document_settings(a)
        self.names, self.held_out = self.settings, []

    def __len__(self):
        return self.a.documents

    def shard(self, d, device):
        return self.make(self.recorder, self.documents, d, self.a)


def training_device(name):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise SystemExit(f"kvpolicy-rank-gates: --device {name}: {e}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"kvpolicy-rank-gates: --device {name}: torch sees no CUDA device")
    return device


def main():
    a = parse()
    device = training_device(a.device)
    os.makedirs(a.out, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    source = MadeDocuments(a, device) if a.online else StoredTargets(a)
    config = types.SimpleNamespace(**source.shape)
    torch.manual_seed(a.seed)
    gate = make_gate(a.gate, config, a.width, bias_init=a.bias_init)
    if a.init:
        try:
            # a token-level ranking starts from the file's token-level gate where it holds one (SPEC §8)
            kind, width, load = gate_file(a.init, token_level=a.policy == "token" and holds_token_level_gate(a.init))
            if (kind, width) != (a.gate, a.width):
                raise ValueError(f"holds a gate of kind {kind} and width {width}, not {a.gate} and {a.width}")
            load(gate, config.head_dim)
        except ValueError as e:
            raise SystemExit(f"kvpolicy-rank-gates: --init {a.init}: {e}")
    gate.to(device)
    opt = torch.optim.AdamW(gate.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    total = a.epochs * len(source)

    ckpt_path, log_path = os.path.join(a.out, "checkpoint.pt"), os.path.join(a.out, "log.csv")
    start, elapsed, tokens = 0, 0.0, 0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device)
        for key in ("gate", "policy", "width", "epochs", "seed", "memory_range", "pairs", "tau", "init", "documents",
                    "validate", "weighted", "fact_pairs", "keep_facts", "time_budget", "heads_target"):
            held_value = ck["args"].get(key, {"fact_pairs": 0, "keep_facts": False, "time_budget": 0,
                                              "heads_target": "mean"}.get(key))
            if held_value != getattr(a, key):  # (the defaults: a checkpoint from before the options)
                raise SystemExit(f"kvpolicy-rank-gates: {ckpt_path} is a run with --{key.replace('_', '-')} "
                                 f"{held_value}, not {getattr(a, key)}: give another --out, or delete it")
        if ck["shards"] != source.names:
            raise SystemExit(f"kvpolicy-rank-gates: {ckpt_path} trained on other documents than "
                             f"{a.targets or 'these settings make'}: give another --out, or delete it")
        gate.load_state_dict(ck["gate"])
        opt.load_state_dict(ck["optimizer"])
        start, elapsed, tokens = ck["step"], ck["seconds"], ck["tokens"]
        total = ck.get("total", total)  # the steps a --time-budget chose
        print(f"kvpolicy-rank-gates: resumed at step {start} from {ckpt_path}")
        with open(log_path) as f:  # steps logged after the checkpoint run again: keep one row each
            kept = [r for r in csv.DictReader(f) if int(r["step"]) <= start]
    else:
        kept = []
    fields = ["step", "lr", "loss", "recall", "memory", "seconds", "tokens"]
    with open(log_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(kept)
    log_file = open(log_path, "a", newline="")
    writer = csv.DictWriter(log_file, fieldnames=fields)

    def save_checkpoint(step):
        torch.save({"gate": gate.state_dict(), "optimizer": opt.state_dict(), "step": step, "seconds": elapsed,
                    "tokens": tokens, "total": total, "args": vars(a), "shards": source.names},
                   ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)
        log_file.flush()
        plot(log_path, os.path.join(a.out, "curves.png"))

    L = config.num_hidden_layers
    bar = tqdm(initial=start, total=total, disable=a.no_progress, dynamic_ncols=True)
    step, order, truncated, measured_from = start, None, 0, None
    while step < total:
        t0 = time.time()
        epoch, i = divmod(step, len(source))
        if order is None or order[0] != epoch:
            order = (epoch, list(range(len(source))))
            random.Random(a.seed * 7_919 + epoch).shuffle(order[1])  # each epoch its own order, seeded
        shard = source.shard(order[1][i], device)
        rng = random.Random(a.seed * 1_000_003 + step)
        memories = drawn_memories(rng, len(shard["steps"]), *a.memory_range)
        gen = torch.Generator(device=device).manual_seed(a.seed * 104_729 + step)
        for group in opt.param_groups:
            group["lr"] = a.lr * schedule(step, total, a.warmup)
        x = shard["x"]
        log_beta = torch.stack([gate(l, x[l][None])[0] for l in range(L)])  # [L, Hkv, T]
        loss, recall = document_loss(log_beta, shard, a.policy, memories, a.pairs, a.tau, gen, a.weighted,
                                     a.fact_pairs, a.keep_facts, a.heads_target)
        step += 1
        bar.update(1)
        if loss is None:
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gate.parameters(), a.grad_clip)
        opt.step()
        loss, recall = loss.item(), recall.item()  # (waits for the device: the step's time is its own)
        elapsed += time.time() - t0
        tokens += x.shape[1]
        writer.writerow({"step": step, "lr": f"{opt.param_groups[0]['lr']:.3g}", "loss": f"{loss:.5f}",
                         "recall": f"{recall:.4f}", "memory": sum(memories) // len(memories),
                         "seconds": f"{elapsed:.1f}", "tokens": tokens})
        bar.set_postfix(loss=f"{loss:.4f}", recall=f"{recall:.3f}")
        if a.time_budget and step == 5 and start < 5:  # the first steps allocate and choose kernels
            measured_from = elapsed
        if a.time_budget and step == 20 and measured_from is not None:
            per_step = (elapsed - measured_from) / 15
            total = min(total, step + max(0, int((a.time_budget - elapsed) / per_step)))
            bar.total = total
            print(f"kvpolicy-rank-gates: {total} steps fit --time-budget {a.time_budget:g} s "
                  f"({per_step:.3f} s a step)", flush=True)
        overrun = a.time_budget and elapsed > 1.15 * a.time_budget and step < total
        if step % a.checkpoint_every == 0 or step == total or step - start == a.stop_after or overrun:
            save_checkpoint(step)
        if overrun:
            truncated = step
            print(f"kvpolicy-rank-gates: --time-budget {a.time_budget:g} s overrun: exported after step {step} "
                  f"of {total}")
            break
        if step - start == a.stop_after and step < total:
            log_file.close()
            print(f"kvpolicy-rank-gates: stopped after step {step} (--stop-after); run again to resume")
            return
    bar.close()
    log_file.close()
    meta = {"kvpolicy_gate": a.gate, "policy": "trimkv" if a.policy == "token" else a.policy,
            "trained_for": a.policy, "method": "ranking", "epochs": a.epochs, "documents": len(source),
            "steps": total, "memory": "%d-%d drawn" % tuple(a.memory_range), "pairs": a.pairs, "tau": a.tau,
            "weighted": a.weighted, "fact_pairs": a.fact_pairs, "keep_facts": a.keep_facts, "lr": a.lr,
            **({"heads_target": a.heads_target} if a.policy == "token" else {}),
            "seed": a.seed, "width": a.width, "targets": source.settings,
            "targets_made": "while training" if a.online else "stored",
            **({"init": os.path.basename(a.init)} if a.init else {}),
            **({"truncated_at": truncated} if truncated else {})}
    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    if source.held_out:  # at the budgets the quality goals are set at (docs/quality.md)
        loss, recall = evaluate(gate.cpu(), source.held_out, a.policy, (64, 128), a.pairs, a.tau, a.seed,
                                a.heads_target)
        meta["validation"] = {"shards": len(source.held_out), "memory": [64, 128], "loss": round(loss, 5),
                              "recall": round(recall, 4)}
    export(gate, os.path.join(a.out, "gate.safetensors"), config.head_dim, True, meta)
    summary = {**meta, "tokens_seen": tokens,
               "seconds": round(elapsed, 1), "tokens_per_second": round(tokens / max(elapsed, 1e-9), 1),
               "device": device.type,
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
               "final": rows[-1] if rows else {}}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
