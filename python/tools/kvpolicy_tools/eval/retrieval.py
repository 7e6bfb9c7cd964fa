#!/usr/bin/env python3
"""Tasks where recency is not enough: retrieval in a long context (RULER-style), through kvpolicy-lm.

Each instance hides facts early in ~CONTEXT tokens of real text (held-out prose no gate trained on:
the Python 3.11 tutorial and HOWTOs from Debian's python3.11-doc) and asks about them at the end;
the model answers greedily and is right when its answer holds what the question needs. The tasks:
  single      a 5-digit pass key (its digits must come first);
  multikey    four "special magic numbers" of the same form, one asked (distractors);
  multivalue  three numbers for one key, a fourth for another; all three must come out;
  variable    a variable assigned and reassigned twice, a second one beside it; its last value;
  multihop    a person holds a folder, the folder holds a file number; another pair as a distractor.
All but `single` come from kvpolicy_tools.data.longrange's held-out phrasings and entities, which the
trainer refuses. The prompt is prefilled in chunks of 64 tokens with the policy evicting as it goes,
so a policy keeps a fact only if it judges it worth keeping. One kvpolicy-lm process runs a batch
of instances as sequences of one cache.

  kvpolicy-retrieval --model DIR [--tasks "single multikey"] [--contexts "1024 2048"] [--instances 100]
                     [--budgets "64 256"] [--policies all | "full streamingllm ..."] [--gates DIR]
                     [--out build/lm/retrieval] [--append]

Writes OUT/results.csv (task, context, policy, budget, sinks, correct, instances, accuracy,
seconds, the entries a sequence held after its answer, averaged over the instances, and the seed),
and OUT/instances.csv, a row per instance run (right or not, and its answer's start; both files
begin again without --append); --by-digits reads the second: a cell's pass keys by how many digits
the prose around them holds;
with --append, rows are added and cells already there are skipped, so a long run goes in parts. A
cell there with fewer instances of the same seed is extended: only the instances it lacks run, and
a row of the whole cell is added beside the shorter one (the tables read the longest). --plot draws
OUT/retrieval.png. Instances are fixed by --seed, and n instances are the first n of any larger count.
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

from kvpolicy_tools.data import corpus, longrange

TUTORIAL = "/usr/share/doc/python3.11/html/tutorial"
LEARNED = ("trimkv", "dbtrimkv", "wgkv")  # each reads gates/<model>/<policy>.safetensors


def filler_text():
    pages = sorted(glob.glob(os.path.join(TUTORIAL, "*.html")))
    if not pages:
        raise SystemExit(f"retrieval: {TUTORIAL} is missing: install the Debian package python3.11-doc")
    text = "\n".join(corpus.html_text(p) for p in pages)
    return re.sub(r"\n{2,}", "\n", text)


TASKS = ("single",) + longrange.TASKS


def task_instances(task, n, context, seed):
    """(prompts, the strings each answer must hold, tokens to generate) of one cell."""
    if task == "single":
        data = instances(n, context, seed)
        return [p for p, _ in data], [[k] for _, k in data], 8
    rng = random.Random(f"{task}/{context}/{seed}")
    cells = [longrange.heldout_task(task, rng, context) for _ in range(n)]
    return [p for p, _, _ in cells], [need for _, need, _ in cells], cells[0][2]


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


class Refused(Exception):
    """kvpolicy-lm refused a cell's configuration (its message says which value, e.g. sinks that do not
    fit beside a prompt policy's observation window at a small M)."""


def policy_options(lm):
    """name -> the options it takes, from kvpolicy-lm --list-policies (the registry)."""
    out = subprocess.run([lm, "--list-policies"], capture_output=True, text=True, check=True).stdout
    return {line.split("\t")[0]: set(line.split("\t")[1].split(",")) for line in out.splitlines() if line}


def run_batch(lm, model, prompts, policy, budget, sinks, gate, threads, options, generate=8, mode="per-head", window=0):
    # F32 K/V and fp32 activations, as docs/quality.md's table was made (before kvpolicy-lm's F16 and
    # Q8 defaults of 0.21.0): the same command gives the same numbers
    args = [lm, "--model", model, "--generate", str(generate), "--prefill", "64", "--chunk", "64", "--threads", str(threads),
            "--kv", "f32", "--decode-activations", "f32", "--policy", policy]
    takes = options[policy]
    if "ratio" in takes:  # KVzip: the ~1,024-token context to M per head on average, at its probe (SPEC §10)
        args += ["--ratio", repr(1 - budget / 1024), "--sinks", str(sinks)]
    elif "tau" in takes and "local" not in takes:  # KVzap: window M/2, the threshold its file calibrates for M
        from kvpolicy_tools.eval.quality import safetensors_metadata

        tau = safetensors_metadata(gate).get(f"tau_m{budget}")
        if tau is None:
            raise Refused(f"the surrogate {gate} has no threshold calibrated for M = {budget}")
        args += ["--gate", gate, "--window", str(budget // 2), "--tau", tau]
    elif policy != "full":  # M as the budget, or as the ring of a policy without one (WG-KV); B = 16 where taken
        args += ["--budget" if "budget" in takes else "--local", str(budget)]
        args += ["--buffer", "16"] if "buffer" in takes else []
        args += ["--sinks", str(sinks)] if "sinks" in takes else []
        args += ["--window", str(window)] if window and "window" in takes else []
        if "gate" in takes:
            args += ["--gate", gate]
        args += ["--mode", mode] if "mode" in takes else []
    for p in prompts:
        args += ["--prompt", p]
    # the byte-level tokens generated may stop inside a multi-byte character; U+FFFD stands in for the
    # partial character (the answer is scored on its digits)
    p = subprocess.run(args, capture_output=True, text=True, errors="replace")
    if p.returncode == 2 and "kvpolicy:" in p.stderr:  # the policy refused this configuration: a cell, not the run
        raise Refused(p.stderr.strip().splitlines()[-1])
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


def right(task, answer, needed):
    return correct(answer, needed[0]) if task == "single" else longrange.answered(answer, needed)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="the converted model directory (tools/fetch-model.sh); not with --show")
    ap.add_argument("--lm", default="build/default/apps/kvpolicy-lm", help="the kvpolicy-lm binary (default: %(default)s, from the repository's root)")
    ap.add_argument("--tasks", default="single", help=f"any of: {' '.join(TASKS)}")
    ap.add_argument("--instances", type=int, default=100)
    ap.add_argument("--contexts", "--context", default="1024", help="approximate tokens of text per instance")
    ap.add_argument("--budgets", default="64 256")
    ap.add_argument("--policies", default="all", help="names from kvpolicy-lm --list-policies, or all (every one)")
    ap.add_argument("--sinks", type=int, default=4, help="protected oldest entries per head (not wgkv)")
    ap.add_argument("--gates", default="gates/smollm2-135m", help="the learned policies' gates (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=20, help="instances per kvpolicy-lm process")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mode", choices=["per-head", "union"], default="per-head",
                    help="union: each policy in its token-level mode (SPEC §8; recorded as POLICY/union), the "
                         "policies without one skipped")
    ap.add_argument("--window", type=int, default=0,
                    help="protected newest entries per head (SPEC §1, sliding-window protection; recorded as "
                         "POLICY/wW), the policies without a window skipped")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="build/lm/retrieval")
    ap.add_argument("--gates-label", default="",
                    help="names the gates in the results (a column), so gates of several trainings share one file")
    ap.add_argument("--append", action="store_true", help="add rows to an existing results.csv; skip cells already there")
    ap.add_argument("--plot", action="store_true",
                    help="draw OUT/retrieval.png (accuracy against M, a panel per task); without --model, only that")
    ap.add_argument("--plot-gated", metavar="LABELS",
                    help="with --plot: the gated rows to draw, as the table names them, comma-separated (e.g. "
                         "'trimkv (long-range),wgkv (committed)'); the rows without gates are always drawn")
    ap.add_argument("--plot-context", type=int, default=1024, help="with --plot: the context drawn")
    ap.add_argument("--show", type=int, metavar="K",
                    help="print instance K's prompt of the first task and context (what a cell runs) and exit")
    ap.add_argument("--by-digits", metavar="CONTEXT:BUDGET",
                    help="print a markdown table of OUT/instances.csv's pass keys (task single) at one context and "
                         "budget: a row per policy, a column per quarter of the instances by the digits in their "
                         "prose (the key's own not counted), and exit")
    ap.add_argument("--table", metavar="CONTEXT:BUDGET",
                    help="print OUT/results.csv's markdown table for one context and budget (a column per task, "
                         "e.g. 1024:64), or for one context and task (a column per budget, e.g. 1024:single), and exit")
    ap.add_argument("--rows", metavar="LABELS",
                    help="with --table: the rows to print, in this order, comma-separated, each a policy as the table "
                         "names it (e.g. 'trimkv (long-range-gpu-rg10)'), optionally =NAME to print it as NAME")
    ap.add_argument("--entries", action="store_true",
                    help="with --table CONTEXT:TASK: each cell also gives the entries its policy held on average")
    ap.add_argument("--results", metavar="CSV",
                    help="with --table or --plot: the results file to read (default: OUT/results.csv)")
    a = ap.parse_args()
    if (a.rows or a.entries) and not a.table:
        ap.error("--rows and --entries go with --table")
    if a.results and not (a.table or a.plot):
        ap.error("--results goes with --table or --plot")
    if a.by_digits:
        context, budget = a.by_digits.split(":", 1) if ":" in a.by_digits else (a.by_digits, "")
        if not context.isdigit() or not budget.isdigit():
            ap.error(f"--by-digits {a.by_digits}: CONTEXT:BUDGET (e.g. 1024:64)")
        print(digits_table(os.path.join(a.out, "instances.csv"), int(context), int(budget), a.seed))
        return
    if a.table:
        context, what = a.table.split(":", 1) if ":" in a.table else (a.table, "")
        if not context.isdigit() or not (what.isdigit() or what in TASKS):
            ap.error(f"--table {a.table}: CONTEXT:BUDGET or CONTEXT:TASK (e.g. 1024:64, 1024:single)")
        path = a.results or os.path.join(a.out, "results.csv")
        if a.entries and what.isdigit():
            ap.error("--entries goes with --table CONTEXT:TASK (a table of CONTEXT:BUDGET has its entries column)")
        rows = parse_rows(ap, a.rows)
        try:
            print(table(path, int(context), int(what), rows) if what.isdigit()
                  else budgets_table(path, int(context), what, rows, a.entries))
        except UnknownRow as e:
            ap.error(f"--rows: {e}")
        return
    if a.show is not None:
        if a.show < 0:
            ap.error(f"--show {a.show} must be >= 0")
        prompts, needed, _ = task_instances(a.tasks.split()[0], a.show + 1, int(a.contexts.split()[0]), a.seed)
        print(prompts[a.show], end="")
        print(f"needed: {' / '.join(needed[a.show])}", file=sys.stderr)
        return
    if a.plot and not a.model:
        plot(a.results or os.path.join(a.out, "results.csv"), os.path.join(a.out, "retrieval.png"), a.plot_context,
             a.plot_gated, a.tasks.split(), a.mode)
        return
    if not a.model:
        ap.error("--model is needed to run the suite")
    if a.window < 0:
        ap.error(f"--window {a.window} must be >= 0")
    for t in a.tasks.split():
        if t not in TASKS:
            ap.error(f"--tasks: '{t}' is not one of {' '.join(TASKS)}")
    os.makedirs(a.out, exist_ok=True)
    options = policy_options(a.lm)
    policies = list(options) if a.policies == "all" else a.policies.split()
    for policy in policies:
        if policy not in options:
            ap.error(f"--policies: '{policy}' is not registered in kvpolicy-lm (--list-policies)")
    path = os.path.join(a.out, "results.csv")
    fields = ["task", "context", "policy", "gates", "budget", "sinks", "correct", "instances", "accuracy", "seconds",
              "entries", "seed"]
    have = {}  # cell -> its row of the most instances
    if a.append and os.path.exists(path):
        with open(path) as f:
            reader = csv.DictReader(f)
            rows, header = list(reader), reader.fieldnames or []
        if rows and "task" not in rows[0]:
            raise SystemExit(f"retrieval: {path} is from before the task column: give another --out")
        if header != fields:
            # a file from before the gates or the seed column, or with its columns in another order: rewritten
            # in this order, gates empty and the seed the default one where missing (every run before that
            # column used it)
            rows = [{**{k: v for k, v in r.items() if k in fields}, "gates": r.get("gates", ""),
                     "seed": r.get("seed") or "0"} for r in rows]
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows(rows)
        have = {cell_key(r): r for r in longest(rows, cell_key)}
    else:  # a new results file, and a new instances file beside it
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writeheader()
        if os.path.exists(os.path.join(a.out, "instances.csv")):
            os.remove(os.path.join(a.out, "instances.csv"))
    for task in a.tasks.split():
        for context in [int(c) for c in a.contexts.split()]:
            prompts, needed, generate = task_instances(task, a.instances, context, a.seed)
            for policy in policies:
                if a.mode == "union" and policy != "full" and "mode" not in options[policy]:
                    continue  # no token-level mode
                if a.window and policy != "full" and "window" not in options[policy]:
                    continue  # nothing to protect the newest entries with
                for budget in ([0] if policy == "full" else [int(b) for b in a.budgets.split()]):
                    name = label({"policy": recorded(a, policy, options),
                                  "gates": a.gates_label if "gate" in options[policy] else ""})
                    before = have.get((task, str(context), name, str(budget), str(a.seed)))
                    if before and int(before["instances"]) >= len(prompts):
                        continue
                    if before and before["sinks"] != str(cell_sinks(a, policy, options)):
                        print(f"retrieval: skipped {task} {context} {name} M = {budget}: results.csv has it with "
                              f"{before['sinks']} sinks; give another --out", file=sys.stderr, flush=True)
                        continue
                    try:
                        run_cell(a, options, path, fields, task, context, prompts, needed, generate, policy, budget,
                                 before)
                    except Refused as e:
                        print(f"retrieval: skipped {task} {context} {name} M = {budget}: {e}", file=sys.stderr, flush=True)
    if a.plot:
        plot(path, os.path.join(a.out, "retrieval.png"), a.plot_context, a.plot_gated, a.tasks.split(), a.mode)


def run_cell(a, options, path, fields, task, context, prompts, needed, generate, policy, budget, before=None):
    """Runs one cell and appends its row; `before`, the cell's row of fewer instances of the same seed:
    only the instances after its count run, and the row counts them all."""
    gate = os.path.join(a.gates, policy + ".safetensors") if "gate" in options[policy] else None
    sinks = cell_sinks(a, policy, options)
    first = int(before["instances"]) if before else 0
    t0, wrong_examples = time.time() - (float(before["seconds"]) if before else 0), []
    hits = int(before["correct"]) if before else 0
    entries = float(before["entries"]) * first if before else 0
    cell = {"task": task, "context": context, "policy": recorded(a, policy, options),
            "gates": a.gates_label if gate else "", "budget": budget, "sinks": sinks, "seed": a.seed}
    for b in range(first, len(prompts), a.batch):
        answers, held = run_batch(a.lm, a.model, prompts[b:b + a.batch], policy, budget, sinks, gate, a.threads,
                                  options, generate, a.mode, a.window)
        entries += sum(held)
        outcomes = []
        for k, (need, ans) in enumerate(zip(needed[b:b + a.batch], answers)):
            ok = right(task, ans, need)
            hits += ok
            if not ok and len(wrong_examples) < 2:
                wrong_examples.append((need, ans.strip()[:60]))
            outcomes.append({**cell, "instance": b + k, "right": int(ok), "answer": " ".join(ans.split())[:40]})
        record_instances(os.path.join(os.path.dirname(path), "instances.csv"), outcomes)
    row = {**cell, "correct": hits,
           "instances": len(prompts), "accuracy": f"{hits / len(prompts):.3f}", "seconds": f"{time.time() - t0:.0f}",
           "entries": f"{entries / len(prompts):.0f}"}
    with open(path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=fields).writerow(row)
    print(row, f"(instances {first}-{len(prompts) - 1} run now)" if first else "", "e.g. wrong:", wrong_examples,
          flush=True)


INSTANCE_FIELDS = ["task", "context", "policy", "gates", "budget", "sinks", "seed", "instance", "right", "answer"]


def record_instances(path, outcomes):
    """Appends a batch's instances to OUT/instances.csv (its header written with the first)."""
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=INSTANCE_FIELDS)
        if new:
            w.writeheader()
        w.writerows(outcomes)


def haystack_digits(prompt, key):
    """The digits of a pass-key prompt's prose: all of its digits but the key's, which it states twice."""
    return sum(c.isdigit() for c in prompt) - 2 * len(key)


def digit_parts(digits, parts=4):
    """The instances (indices into `digits`, each one's prose digits) sorted by their digits, ties by
    index, cut into `parts` parts of equal size (the last ones one larger where it does not divide)."""
    n = len(digits)
    order = sorted(range(n), key=lambda i: (digits[i], i))
    return [order[n * q // parts:n * (q + 1) // parts] for q in range(parts)]


def digits_table(path, context, budget, seed=0, parts=4):
    """A markdown table of one context and budget's pass keys from OUT/instances.csv: the instances
    sorted by the digits of their prose (numbers in the text, doctests' output) and cut into `parts`
    equal parts, a column each; a row per policy (the full cache's first), right of run in each part.
    An instance run twice for a policy counts once, its last run."""
    if not os.path.exists(path):
        raise SystemExit(f"retrieval: no {path}: run cells with this --out first")
    runs = {}
    for r in csv.DictReader(open(path)):
        if (r["task"] == "single" and int(r["context"]) == context and int(r["budget"]) in (0, budget)
                and int(r["seed"]) == seed):
            runs[(label(r), int(r["instance"]))] = r
    if not runs:
        raise SystemExit(f"retrieval: {path} has no pass-key instances at context {context}, M = {budget}, seed {seed}")
    n = 1 + max(i for _, i in runs)
    digits = [haystack_digits(p, k) for p, k in instances(n, context, seed)]
    cuts = digit_parts(digits, parts)
    head = [f"digits {digits[part[0]]}–{digits[part[-1]]}" for part in cuts if part]
    out = ["| policy | " + " | ".join(head) + " | all |", "| --- |" + " ---: |" * (len(head) + 1)]
    for name in sorted(dict.fromkeys(name for name, _ in runs), key=lambda x: x != "full"):
        cells = []
        for part in [p for p in cuts if p] + [range(n)]:
            ran = [runs[(name, i)] for i in part if (name, i) in runs]
            cells.append(f"{sum(int(r['right']) for r in ran)}/{len(ran)}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def cell_sinks(a, policy, options):
    """The sinks a cell runs with: none for the full cache, WG-KV (its rows have none) and a policy
    that takes none (KVzap)."""
    return 0 if policy in ("full", "wgkv") or "sinks" not in options[policy] else a.sinks


def cell_key(r):
    """What makes a cell of results.csv: task, context, policy with its gates, budget, seed."""
    return (r.get("task", "single"), r.get("context", ""), label(r), r["budget"], r.get("seed") or "0")


def longest(rows, key=lambda r: cell_key(r)[:4]):
    """Each cell's row of the most instances, in the order the cells first appear (a cell extended by
    --append keeps its shorter row in the file); by default over every seed, as the tables show a cell."""
    best = {}
    for r in rows:
        k = key(r)
        if k not in best or int(r["instances"]) > int(best[k]["instances"]):
            best[k] = r
    return list(best.values())


def recorded(a, policy, options):
    """The policy as results.csv names it: POLICY/union in the token-level mode, POLICY/wW with the
    W newest entries protected."""
    name = f"{policy}/union" if a.mode == "union" and "mode" in options[policy] else policy
    return f"{name}/w{a.window}" if a.window and "window" in options[policy] else name


def label(r):
    return r["policy"] if r["policy"] == "full" or r.get("gates", "") == "" else f"{r['policy']} ({r['gates']})"


def parse_rows(ap, spec):
    """--rows: [(label, shown name)], or None for every row."""
    if spec is None:
        return None
    rows = []
    for item in spec.split(","):
        name, _, shown = item.strip().partition("=")
        if not name.strip():
            ap.error(f"--rows {spec!r}: an empty label")
        rows.append((name.strip(), shown.strip() or name.strip()))
    return rows


class UnknownRow(ValueError):
    """--rows named a row the table's data does not have."""


def chosen(names, rows, where):
    """The table's rows: every label in names, or those --rows picks, in its order (UnknownRow naming
    a label the data lacks)."""
    if rows is None:
        return [(n, n) for n in names]
    for name, _ in rows:
        if name not in names:
            raise UnknownRow(f"'{name}' is not a row of {where} (rows: {', '.join(names)})")
    return rows


def table(path, context, budget, rows_wanted=None):
    """A markdown table of one context and budget: a row per policy, a column per task (accuracy,
    correct of instances), and the entries held on average."""
    rows = [r for r in longest(csv.DictReader(open(path))) if int(r["context"]) == context and int(r["budget"]) in (0, budget)]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    out = ["| policy | sinks | " + " | ".join(tasks) + " | entries held |", "| --- | ---: |" + " ---: |" * (len(tasks) + 1)]
    names = list(dict.fromkeys(label(r) for r in rows))
    for name, shown in chosen(names, rows_wanted, f"{context}:{budget}"):
        cells = {r["task"]: r for r in rows if label(r) == name}
        any_row = next(iter(cells.values()))
        acc = [f"{100 * float(cells[t]['accuracy']):.0f}% ({cells[t]['correct']}/{cells[t]['instances']})"
               if t in cells else "—" for t in tasks]
        held = max(int(r["entries"]) for r in cells.values())
        out.append(f"| {shown} | {any_row['sinks']} | " + " | ".join(acc) + f" | {held:,} |")
    return "\n".join(out)


def budgets_table(path, context, task, rows_wanted=None, entries=False):
    """A markdown table of one context and task: a row per policy, a column per budget M (accuracy,
    correct of instances, and with entries the entries held on average), the full cache's row first."""
    rows = [r for r in longest(csv.DictReader(open(path))) if int(r["context"]) == context and r["task"] == task]
    budgets = sorted({int(r["budget"]) for r in rows if r["policy"] != "full"})
    out = ["| policy | sinks | " + " | ".join(f"M = {m}" for m in budgets) + " |", "| --- | ---: |" + " ---: |" * len(budgets)]

    def cell(r):
        held = f"; {int(r['entries']):,}" if entries and r.get("entries") else ""
        return f"{100 * float(r['accuracy']):.0f}% ({r['correct']}/{r['instances']}{held})"

    names = sorted(dict.fromkeys(label(r) for r in rows), key=lambda n: n != "full")
    for name, shown in chosen(names, rows_wanted, f"{context}:{task}"):
        cells = {int(r["budget"]): r for r in rows if label(r) == name}
        acc = [cell(cells[m]) if m in cells else "—" for m in budgets]
        if name == "full":
            acc = [cell(cells[0]) + ", every entry"] + [""] * (len(budgets) - 1)
        out.append(f"| {shown} | {next(iter(cells.values()))['sinks']} | " + " | ".join(acc) + " |")
    return "\n".join(out)


def plot(path, png, context=1024, gated=None, tasks=None, mode="per-head"):
    """Accuracy against M at one context, a panel per task (`tasks`, or every one in the file); of the
    gated rows only those `gated` names (comma-separated labels; None: every one); the rows of `mode`
    (POLICY/union in the token-level one). A series keeps its colour in every panel; one legend beside
    them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keep = None if gated is None else {g.strip() for g in gated.split(",")}
    rows = [r for r in longest(csv.DictReader(open(path))) if int(r.get("context", context)) == context
            and (keep is None or not r.get("gates") or label(r) in keep)
            and (tasks is None or r.get("task", "single") in tasks)
            and (r["policy"] == "full" or ("union" in r["policy"].split("/")[1:]) == (mode == "union"))]
    if not rows:
        raise SystemExit(f"retrieval: no rows of context {context} to plot in {path}")
    tasks = list(dict.fromkeys(r.get("task", "single") for r in rows))
    names = list(dict.fromkeys(label(r) for r in rows if r["policy"] != "full"))
    colours = {n: plt.cm.tab20(k % 20) for k, n in enumerate(names)}
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks) + 2.2, 3.8), squeeze=False)
    handles = {}
    for ax, task in zip(axes[0], tasks):
        cell = [r for r in rows if r.get("task", "single") == task]
        full = [float(r["accuracy"]) for r in cell if r["policy"] == "full"]
        for name in names:
            pts = sorted((int(r["budget"]), float(r["accuracy"])) for r in cell if label(r) == name)
            if pts:
                style = "-o" if name.split()[0].split("/")[0] in LEARNED else "--."
                handles[name], = ax.plot([b for b, _ in pts], [100 * v for _, v in pts], style,
                                         color=colours[name], label=name)
        if full:
            handles["full cache"] = ax.axhline(100 * full[0], color="k", lw=0.8, label="full cache")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{task}, {context} tokens")
        ax.set_xlabel("M (entries per layer and kv head)")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 1 - 2.2 / (4.2 * len(tasks) + 2.2), 1))
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
