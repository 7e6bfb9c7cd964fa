"""kvpolicy-retrieval's results file across runs, with a scripted engine in kvpolicy-lm's place (no model,
no Debian text package: the prose is the project's docs):
  - --append skips a cell already there with as many instances;
  - --append with more instances extends a cell: only the instances it lacks run, and the new row counts
    them all (correct, accuracy, entries averaged over every instance, seconds summed), the shorter row kept;
  - the tables read each cell's longest row; another seed is another cell;
  - a file from before the seed column is rewritten with seed 0 and extended.
  - an answer that ends inside a multi-byte character (a generated token's partial UTF-8) is scored;
  - OUT/instances.csv holds every instance run once, right or not (a run without --append begins it
    again), and --by-digits' table counts them in quarters of the instances sorted by their prose's digits.
usage: PYTHONPATH=python/tools python3 -m pytest -q -p no:cacheprovider tests/train/test_retrieval_append.py
       (any python3 with pytest)
"""
import csv
import os
import re
import sys
import time

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
from kvpolicy_tools.eval import retrieval

# the engine: answers a pass key right unless it is a multiple of 3, holds (key mod 97) * 10 entries, and
# logs how many prompts each call ran
ENGINE = r'''#!{python}
import re, sys
args = sys.argv[1:]
if "--list-policies" in args:
    print("full\t\nstreamingllm\tbudget,sinks")
    sys.exit(0)
prompts = [args[i + 1] for i, a in enumerate(args) if a == "--prompt"]
with open({log!r}, "a") as f:
    f.write(f"{{len(prompts)}}\n")
for s, p in enumerate(prompts):
    key = re.search(r"The pass key is (\d+)\.", p).group(1)
    answer = " 00000." if int(key) % 3 == 0 else f" {{key}}."
    # each answer ends inside a multi-byte character, as byte-level tokens may
    sys.stdout.buffer.write(f"[{{s}}] {{p}}{{answer}}".encode() + b"\xe2\x80" +
                            f"\n[{{s}}] policy streamingllm: 10 tokens, {{int(key) % 97 * 10}} entries held\n".encode())
'''


def test_results_file_across_runs(tmp_path, monkeypatch):
    """One results file through the runs the module's docstring lists, in order (each run reads what the
    one before it wrote); every check is made, and the test fails listing those that did not hold."""
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    tmp = str(tmp_path)
    pages = os.path.join(tmp, "tutorial")
    os.makedirs(pages)
    for name in ("architecture.md", "api.md", "quality.md"):
        with open(os.path.join(root, "docs", name), encoding="utf-8") as f:
            body = "".join(f"<p>{line}</p>\n" for line in f.read().replace("<", " ").splitlines() if line.strip())
        with open(os.path.join(pages, name + ".html"), "w", encoding="utf-8") as f:
            f.write(f"<html><body>{body}</body></html>")
    monkeypatch.setattr(retrieval, "TUTORIAL", pages)
    log = os.path.join(tmp, "calls.log")
    engine = os.path.join(tmp, "engine")
    with open(engine, "w") as f:
        f.write(ENGINE.format(python=sys.executable, log=log))
    os.chmod(engine, 0o755)
    out = os.path.join(tmp, "out")
    path = os.path.join(out, "results.csv")

    def run(*extra):
        monkeypatch.setattr(sys, "argv", ["kvpolicy-retrieval", "--model", tmp, "--lm", engine, "--tasks", "single",
                                          "--budgets", "64", "--policies", "streamingllm", "--batch", "2", "--out", out,
                                          *extra])
        retrieval.main()

    def calls():
        if not os.path.exists(log):
            return []
        with open(log) as f:
            got = [int(n) for n in f.read().split()]
        os.remove(log)
        return got

    def rows():
        with open(path) as f:
            return list(csv.DictReader(f))

    def expected(n, seed=0):
        keys = [k for _, k in retrieval.instances(n, 1024, seed)]
        return sum(int(k) % 3 != 0 for k in keys), sum(int(k) % 97 * 10 for k in keys) / n

    run("--instances", "5")
    check(calls() == [2, 2, 1], "5 instances in batches of 2")
    run("--instances", "5", "--append")
    check(calls() == [], "--append ran a cell already there")
    first = rows()
    with open(path, "w", newline="") as f:  # the first part took 500 s
        w = csv.DictWriter(f, fieldnames=list(first[0]))
        w.writeheader()
        w.writerow({**first[0], "seconds": "500"})
    run("--instances", "9", "--append", "--sinks", "8")
    check(calls() == [], "a cell extended with other sinks than its rows'")
    started = time.monotonic()
    run("--instances", "9", "--append")
    took = time.monotonic() - started
    check(calls() == [2, 2], "extending 5 to 9 instances did not run just the 4 it lacked")
    r = rows()
    hits, held = expected(9)
    check(len(r) == 2 and r[1]["instances"] == "9" and r[0]["instances"] == "5", f"rows after the extension: {r}")
    check(int(r[1]["correct"]) == hits, f"extended cell: {r[1]['correct']} correct, by hand {hits}")
    check(r[1]["accuracy"] == f"{hits / 9:.3f}", f"extended accuracy {r[1]['accuracy']}")
    check(abs(float(r[1]["entries"]) - held) <= 1, f"extended entries {r[1]['entries']}, by hand {held:.1f}")
    # the first part's 500 s plus what the extension's engine calls took, within that run's wall time
    # (written rounded to a whole second: half a second more may be the rounding)
    check(500 <= float(r[1]["seconds"]) <= 500 + took + 0.5, f"the extended row's seconds {r[1]['seconds']} are not "
          f"the first part's 500 plus the extension's (at most {took:.2f} s)")
    with open(os.path.join(out, "instances.csv")) as f:
        ran = list(csv.DictReader(f))
    keys = [k for _, k in retrieval.instances(9, 1024, 0)]
    check([int(x["instance"]) for x in ran] == list(range(9)), f"instances.csv after 5 and 4 more: {ran}")
    check([x["right"] for x in ran] == [str(int(int(k) % 3 != 0)) for k in keys], "instances.csv's right column")
    check(all(x["policy"] == "streamingllm" and x["budget"] == "64" and x["seed"] == "0" for x in ran),
          "instances.csv's cell columns")
    # by hand: the 9 instances by their prose's digits (ties by instance), cut 2, 2, 2, 3
    prompts = retrieval.instances(9, 1024, 0)
    digits = [sum(c.isdigit() for c in p.replace(f"The pass key is {k}.", "").replace(f"{k} is the pass key", ""))
              for p, k in prompts]
    order = sorted(range(9), key=lambda i: (digits[i], i))
    parts = [order[0:2], order[2:4], order[4:6], order[6:9]]
    want = [f"{sum(int(keys[i]) % 3 != 0 for i in q)}/{len(q)}" for q in parts] + [f"{hits}/9"]
    quarters = retrieval.digits_table(os.path.join(out, "instances.csv"), 1024, 64)
    check(quarters.splitlines()[2] == "| streamingllm | " + " | ".join(want) + " |",
          f"--by-digits, by hand {want}:\n{quarters}")
    check(f"digits {digits[order[0]]}–{digits[order[1]]} |" in quarters.splitlines()[0],
          f"--by-digits' first quarter's range:\n{quarters}")
    with open(path, "w", newline="") as f:  # the shorter row last, as a file merged by hand may have it
        w = csv.DictWriter(f, fieldnames=list(r[0]))
        w.writeheader()
        w.writerows([r[1], r[0]])
    table = retrieval.table(path, 1024, 64)
    check(f"({hits}/9)" in table and "/5)" not in table, f"the table does not read the longest row:\n{table}")
    check(f"({hits}/9)" in retrieval.budgets_table(path, 1024, "single"), "the budgets table does not read the longest row")
    run("--instances", "3", "--append")
    check(calls() == [], "--append ran a cell already there with more instances")
    run("--instances", "3", "--append", "--seed", "1")
    check(calls() == [2, 1], "another seed is another cell")
    hits1, _ = expected(3, seed=1)
    check(rows()[-1]["seed"] == "1" and int(rows()[-1]["correct"]) == hits1, f"seed 1's row: {rows()[-1]}")
    check(f"({hits}/9)" in retrieval.table(path, 1024, 64), "after another seed, the table does not read the longest row")

    # a file from before the seed column: the first 5 instances of seed 0 as that version wrote them
    old_fields = ["task", "context", "policy", "gates", "budget", "sinks", "correct", "instances", "accuracy", "seconds",
                  "entries"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old_fields)
        w.writeheader()
        w.writerow({**{k: rows_k for k, rows_k in r[0].items() if k in old_fields}})
    run("--instances", "9", "--append")
    check(calls() == [2, 2], "a file without the seed column: the cell was not extended")
    r = rows()
    check(all(x["seed"] == "0" for x in r) and len(r) == 2 and int(r[1]["correct"]) == hits,
          f"a file without the seed column, after the extension: {r}")
    check(re.match(r"task,.*,entries,seed$", open(path).readline().strip()), "the header lacks the seed column")
    run("--instances", "2")  # without --append: both files begin again
    with open(os.path.join(out, "instances.csv")) as f:
        ran = list(csv.DictReader(f))
    check([x["instance"] for x in ran] == ["0", "1"] and len(rows()) == 1,
          f"a run without --append kept earlier instances: {len(ran)} rows in instances.csv")

    assert not failures, "FAILED:\n  " + "\n  ".join(failures)
    print("retrieval --append: skips, extends and reads the longest row of each cell")


def test_table_rows_entries_results(tmp_path):
    """--table CONTEXT:TASK --rows picks, orders and renames rows (a label the data lacks is an error that
    names it), --entries adds each cell's entries, and --results reads a file other than OUT/results.csv."""
    import subprocess
    path = tmp_path / "suite.csv"
    fields = ["task", "context", "policy", "gates", "budget", "sinks", "correct", "instances", "accuracy", "seconds",
              "entries", "seed"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerow(dict(task="single", context="1024", policy="full", gates="", budget="0", sinks="0", correct="9",
                        instances="10", accuracy="0.900", seconds="1", entries="105261", seed="0"))
        for policy, gates, budget, correct, entries in [("trimkv", "lr", "64", "5", "6408"),
                                                        ("streamingllm", "", "64", "0", "6408"),
                                                        ("trimkv", "lr", "128", "9", "12168")]:
            w.writerow(dict(task="single", context="1024", policy=policy, gates=gates, budget=budget, sinks="4",
                            correct=correct, instances="10", accuracy=f"{int(correct) / 10:.3f}", seconds="1",
                            entries=entries, seed="0"))
    out = subprocess.run([sys.executable, "-m", "kvpolicy_tools.eval.retrieval", "--results", str(path), "--table",
                          "1024:single", "--entries", "--rows", "streamingllm,trimkv (lr)=TRIM-KV with the lr gate,full"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "| policy | sinks | M = 64 | M = 128 |", out
    assert out[2:] == ["| streamingllm | 4 | 0% (0/10; 6,408) | — |",
                       "| TRIM-KV with the lr gate | 4 | 50% (5/10; 6,408) | 90% (9/10; 12,168) |",
                       "| full | 0 | 90% (9/10; 105,261), every entry |  |"], out
    plain = retrieval.budgets_table(str(path), 1024, "single")
    assert "6,408" not in plain and "| trimkv (lr) | 4 | 50% (5/10) | 90% (9/10) |" in plain, plain
    bad = subprocess.run([sys.executable, "-m", "kvpolicy_tools.eval.retrieval", "--results", str(path), "--table",
                          "1024:single", "--rows", "full,h2o"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'h2o' is not a row of 1024:single" in bad.stderr, bad.stderr
    alone = subprocess.run([sys.executable, "-m", "kvpolicy_tools.eval.retrieval", "--rows", "full"],
                           capture_output=True, text=True)
    assert alone.returncode == 2 and "--rows and --entries go with --table" in alone.stderr, alone.stderr
    budget_table = subprocess.run([sys.executable, "-m", "kvpolicy_tools.eval.retrieval", "--results", str(path),
                                   "--table", "1024:64", "--entries"], capture_output=True, text=True)
    assert budget_table.returncode == 2 and "--entries goes with --table CONTEXT:TASK" in budget_table.stderr, \
        budget_table.stderr
