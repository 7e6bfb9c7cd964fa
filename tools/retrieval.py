#!/usr/bin/env python3
"""A task where recency is not enough: pass-key retrieval in a long context, through kvpolicy-lm.

Each instance hides a 5-digit pass key early in ~CONTEXT tokens of real text (the Python 3.11
tutorial from Debian's python3.11-doc, which no gate trained on), then asks for it at the end; the
model answers greedily (8 tokens) and is right when the key's digits come out first. The prompt is
prefilled in chunks of 64 tokens with the policy evicting as it goes, so a policy keeps the key
only if it judges it worth keeping. One kvpolicy-lm process runs a batch of instances as sequences
of one cache.

  tools/retrieval.py --model DIR [--instances 100] [--context 1024] [--budgets "64 256"]
                     [--policies "full streamingllm ..."] [--gates DIR] [--out build/lm/retrieval]

Writes OUT/results.csv (policy, budget, sinks, correct, instances, accuracy, seconds, and the
entries a sequence held after its answer, averaged over the instances) and, with
--plot, OUT/retrieval.png. Instances are fixed by --seed.
"""
import argparse
import csv
import glob
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train"))
import corpus  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TUTORIAL = "/usr/share/doc/python3.11/html/tutorial"
LEARNED = ("trimkv", "dbtrimkv", "wgkv")  # each reads gates/<model>/<policy>.safetensors


def filler_text():
    pages = sorted(glob.glob(os.path.join(TUTORIAL, "*.html")))
    if not pages:
        raise SystemExit(f"retrieval: {TUTORIAL} is missing: install the Debian package python3.11-doc")
    text = "\n".join(corpus.html_text(p) for p in pages)
    return re.sub(r"\n{2,}", "\n", text)


def instances(n, context, seed):
    """(prompt, key) pairs: the key after 5-25% of the filler, ~4 characters a token."""
    rng = random.Random(seed)
    text = filler_text()
    chars = 4 * context
    out = []
    for _ in range(n):
        key = str(rng.randrange(10000, 100000))
        start = rng.randrange(0, len(text) - chars)
        body = text[start:start + chars]
        body = body[body.find("\n") + 1:]  # start on a line
        cut = body.find("\n", int(len(body) * rng.uniform(0.05, 0.25))) + 1
        prompt = ("There is a pass key hidden in the text below. Remember it.\n\n" + body[:cut] +
                  f"\nThe pass key is {key}. Remember it: {key} is the pass key.\n\n" + body[cut:] +
                  "\n\nWhat is the pass key? The pass key is")
        out.append((prompt, key))
    return out


def policy_options(lm):
    """name -> the options it takes, from kvpolicy-lm --list-policies (the registry)."""
    out = subprocess.run([lm, "--list-policies"], capture_output=True, text=True, check=True).stdout
    return {line.split("\t")[0]: set(line.split("\t")[1].split(",")) for line in out.splitlines() if line}


def run_batch(lm, model, prompts, policy, budget, sinks, gate, threads, options):
    # F32 K/V and fp32 activations, as docs/quality.md's table was made (before kvpolicy-lm's F16 and
    # Q8 defaults of 0.21.0): the same command gives the same numbers
    args = [lm, "--model", model, "--generate", "8", "--prefill", "64", "--chunk", "64", "--threads", str(threads),
            "--kv", "f32", "--decode-activations", "f32", "--policy", policy]
    takes = options[policy]
    if policy != "full":  # M as the budget, or as the ring of a policy without one (WG-KV); B = 16 where taken
        args += ["--budget" if "budget" in takes else "--local", str(budget)]
        args += ["--buffer", "16"] if "buffer" in takes else []
        args += ["--sinks", str(sinks)] if "sinks" in takes else []
        if "gate" in takes:
            args += ["--gate", gate]
    for p in prompts:
        args += ["--prompt", p]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"retrieval: kvpolicy-lm failed ({p.returncode}): {p.stderr[-2000:]}")
    answers, held = [], []
    for s, prompt in enumerate(prompts):
        head = f"[{s}] {prompt}"
        i = p.stdout.find(head)
        j = p.stdout.find(f"\n[{s}] policy ", i)
        if i < 0 or j < 0:
            raise SystemExit(f"retrieval: cannot find sequence {s}'s answer in kvpolicy-lm's output")
        answers.append(p.stdout[i + len(head):j])
        m = re.search(rf"^\[{s}\] policy \S+: \d+ tokens, (\d+) entries held", p.stdout, re.M)
        held.append(int(m.group(1)) if m else 0)
    return answers, held


def correct(answer, key):
    digits = re.sub(r"\D", "", answer)
    return digits.startswith(key)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--lm", default=os.path.join(ROOT, "build/default/examples/kvpolicy-lm"))
    ap.add_argument("--instances", type=int, default=100)
    ap.add_argument("--context", type=int, default=1024, help="approximate tokens of text per instance")
    ap.add_argument("--budgets", default="64 256")
    ap.add_argument("--policies", default="full streamingllm h2o snapkv knorm keydiff trimkv dbtrimkv wgkv")
    ap.add_argument("--sinks", type=int, default=4, help="protected oldest entries per head (not wgkv)")
    ap.add_argument("--gates", default=os.path.join(ROOT, "gates/smollm2-135m"))
    ap.add_argument("--batch", type=int, default=20, help="instances per kvpolicy-lm process")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "build/lm/retrieval"))
    ap.add_argument("--append", action="store_true", help="add rows to an existing results.csv")
    ap.add_argument("--plot", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    data = instances(a.instances, a.context, a.seed)
    options = policy_options(a.lm)
    path = os.path.join(a.out, "results.csv")
    fields = ["policy", "budget", "sinks", "correct", "instances", "accuracy", "seconds", "entries"]
    if not a.append or not os.path.exists(path):
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writeheader()
    for policy in a.policies.split():
        for budget in ([0] if policy == "full" else [int(b) for b in a.budgets.split()]):
            gate = os.path.join(a.gates, policy + ".safetensors") if "gate" in options[policy] else None
            sinks = 0 if policy in ("full", "wgkv") else a.sinks
            t0, right, wrong_examples, entries = time.time(), 0, [], 0
            for b in range(0, len(data), a.batch):
                chunk = data[b:b + a.batch]
                answers, held = run_batch(a.lm, a.model, [p for p, _ in chunk], policy, budget, sinks, gate, a.threads,
                                          options)
                entries += sum(held)
                for (_, key), ans in zip(chunk, answers):
                    if correct(ans, key):
                        right += 1
                    elif len(wrong_examples) < 2:
                        wrong_examples.append((key, ans.strip()[:40]))
            row = {"policy": policy, "budget": budget, "sinks": sinks, "correct": right, "instances": len(data),
                   "accuracy": f"{right / len(data):.3f}", "seconds": f"{time.time() - t0:.0f}",
                   "entries": f"{entries / len(data):.0f}"}
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=fields).writerow(row)
            print(row, "e.g. wrong:", wrong_examples, flush=True)
    if a.plot:
        plot(path, os.path.join(a.out, "retrieval.png"))


def plot(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(path)))
    full = [float(r["accuracy"]) for r in rows if r["policy"] == "full"]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for policy in dict.fromkeys(r["policy"] for r in rows if r["policy"] != "full"):
        pts = sorted((int(r["budget"]), float(r["accuracy"])) for r in rows if r["policy"] == policy)
        style = "-o" if policy in LEARNED else "--."
        ax.plot([b for b, _ in pts], [100 * v for _, v in pts], style, label=policy)
    if full:
        ax.axhline(100 * full[0], color="k", lw=0.8, label="full cache")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (entries per layer and kv head; wgkv: W_local)")
    ax.set_ylabel("pass-key accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
