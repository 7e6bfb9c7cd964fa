"""docs/quality.md's perplexity table: SmolLM2-135M on the first 2,048 tokens of a text (default
/usr/share/common-licenses/GPL-3) under every registered policy at M in {64, 128, 256, 512} per
(layer, kv head), each with and without 4 protected sinks where a policy takes both, against the
full cache; then the plot (kvpolicy-quality-plot). Eviction is decided inside kvpolicy-lm's own
loop: a 16-token first step (the prompt), then 16-token steps (a prompt-compressing policy gets a
1,024-token prompt; KVzip compresses the same prompt to M per head on average, ratio 1 - M/1024,
after its probe; KVzap, which has no budget, runs with a window of M/2 and the threshold its
surrogate's file gives for M, calibrated on training text: its rows' mean_entries say what it held).
One thread per run, F32 K/V.

    kvpolicy-quality [OUT_DIR] [--budgets "64 128 256 512"] [--append] [--only "epikv hs-var"]
                     [--text FILE] [--gates DIR] [--mode union] [--sinks "0 4"] [--window W]

OUT_DIR (default build/lm/quality) gets results.csv and quality.png. --append adds the budgets' rows
to an existing results.csv (the full cache is not run again), so a long table can be made in parts;
--only runs just the policies it names. The learned policies run with the gates in DIR (default
gates/smollm2-135m): trimkv and dbtrimkv (its global budget L * Hkv * M, equal total memory) with and
without sinks, wgkv with its ring W_local = M. --mode union runs the policies that have a token-level
mode in it (SPEC §8; rows named POLICY/union) and skips the others; --sinks names the sink settings
run where a policy takes both a buffer and sinks. --window W protects the W newest entries of every
head (SPEC §1) in the policies that take a window (rows named POLICY/wW) and skips the others.
Run from a checkout's root, where kvpolicy-lm is built (--lm) and the model is fetched
(kvpolicy-fetch-model, into build/lm).
"""
import argparse
import csv
import os
import re
import subprocess
import sys

from kvpolicy_tools.convert.fetch_model import fetched

FIELDS = ["policy", "budget", "sinks", "ppl", "peak_entries", "final_entries", "seconds", "mean_entries"]
REFUSED = 2  # kvpolicy-lm's exit status for a configuration the policy refuses (e.g. sinks and window over M)


def parse(argv):
    ap = argparse.ArgumentParser(prog="kvpolicy-quality", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="build/lm/quality")
    ap.add_argument("--budgets", default="64 128 256 512")
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--only", default="", help="policy names, space-separated (default: every one)")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--gates", default="gates/smollm2-135m")
    ap.add_argument("--mode", choices=["per-head", "union"], default="per-head")
    ap.add_argument("--sinks", default="0 4", help="the sink settings where a policy takes a buffer and sinks")
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--lm", default="build/default/apps/kvpolicy-lm")
    ap.add_argument("--model-cache", default="build/lm", help="where kvpolicy-fetch-model keeps the model")
    a = ap.parse_args(argv)
    if a.window < 0:
        ap.error(f"--window {a.window} is not a count of entries")
    a.budgets = [int(m) for m in a.budgets.split()]
    a.only = set(a.only.split())
    a.sinks = a.sinks.split()
    return a


def measure(a, model, policy, args):
    """kvpolicy-lm's run of `policy`: ppl, peak, final, seconds, mean entries; None when refused."""
    p = subprocess.run([a.lm, "--model", model, "--text", a.text, "--tokens", "2048", "--score-from", "1",
                        "--chunk", "16", "--threads", "1", "--kv", "f32", "--policy", policy, *args],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        if p.returncode == REFUSED:
            return None
        sys.exit(128 - p.returncode if p.returncode < 0 else p.returncode)  # a signal as the shell says it
    log = p.stdout
    held = re.search(r"^entries held: peak (\d+), final (\d+) ", log, re.M)
    secs = re.search(r"; ([0-9.]+) s, ", log)
    mean = re.search(r"^entries held on average: (.*)$", log, re.M)
    ppl = re.search(r"^ppl (\S+)", log, re.M)
    return [ppl.group(1) if ppl else "", held.group(1) if held else "", held.group(2) if held else "",
            secs.group(1) if secs else "", mean.group(1).strip() if mean else ""]


def safetensors_metadata(path):
    """The __metadata__ of a safetensors file (its JSON header), without a tensor library."""
    import json
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def main(argv=None):
    a = parse(argv)
    if not os.access(a.lm, os.X_OK):
        sys.exit(f"kvpolicy-quality: build kvpolicy-lm first (cmake --build --preset default), or name it: --lm ({a.lm})")
    os.makedirs(a.out, exist_ok=True)
    model = fetched(os.path.abspath(a.model_cache))
    path = os.path.join(a.out, "results.csv")
    append = a.append and os.path.getsize(path) > 0 if os.path.exists(path) else False
    with open(path, "a" if append else "w", newline="") as f:
        out = csv.writer(f)
        if not append:
            out.writerow(FIELDS)

        def run(policy, m, sinks, args):
            if a.only and policy not in a.only:
                return
            got = measure(a, model, policy, args)
            if got is None:
                print(f"kvpolicy-quality: skipped {policy} M = {m}", file=sys.stderr)
                return
            name = policy + ("/union" if "--mode" in args else "") + (f"/w{a.window}" if a.window > 0 else "")
            row = [name, m, sinks, *got]
            out.writerow(row)
            f.flush()
            print(",".join(map(str, row)))

        # every registered policy (kvpolicy-lm --list-policies: name, options, inputs, prompt, device)
        listed = subprocess.run([a.lm, "--list-policies"], capture_output=True, text=True, check=True).stdout
        policies = [line.split("\t") for line in listed.splitlines() if line.strip()]
        if not append:  # a policy without options is the reference row
            for p, opts, *_ in policies:
                if opts == "-":
                    run(p, 1, 0, [])
        for m in a.budgets:
            for p, opts, inputs, prompt, *_ in policies:
                if opts == "-":
                    continue
                takes = set(opts.split(","))
                if inputs == "reconstruction":  # KVzip: the 1,024-token prompt to M per head on average, 4 sinks (kvpress's)
                    run(p, m, 4, ["--prefill", "1024", "--ratio", repr(1 - m / 1024), "--sinks", "4"])
                    continue
                if inputs == "surrogate":  # KVzap: window M/2, the threshold calibrated for M (kvpolicy-train-kvzap)
                    gate = os.path.join(a.gates, p + ".safetensors")
                    tau = safetensors_metadata(gate).get(f"tau_m{m}") if os.path.exists(gate) else None
                    if tau is None:
                        if not a.only or p in a.only:
                            print(f"kvpolicy-quality: no surrogate with a threshold for M = {m} ({gate}): {p} not run",
                                  file=sys.stderr)
                        continue
                    run(p, m, 0, ["--gate", gate, "--window", str(m // 2), "--tau", tau])
                    continue
                args = ["--budget", str(m)] if "budget" in takes else ["--local", str(m)] if "local" in takes else []
                if "buffer" in takes:
                    args += ["--buffer", "16"]
                if prompt == "prompt":
                    args += ["--prefill", "1024"]
                if "gate" in takes:
                    gate = os.path.join(a.gates, p + ".safetensors")
                    if not os.path.exists(gate):
                        if not a.only or p in a.only:
                            print(f"kvpolicy-quality: no gate {gate}: {p} not run (--gates DIR)", file=sys.stderr)
                        continue
                    args += ["--gate", gate]
                if a.mode == "union":
                    if "mode" not in takes:
                        continue
                    args += ["--mode", "union"]
                if a.window > 0:
                    if "window" not in takes:
                        continue
                    args += ["--window", str(a.window)]
                if "sinks" in takes:
                    args += ["--sinks", "0"]  # explicit: a policy's default may protect some (StreamingLLM's 4)
                if "buffer" in takes and "sinks" in takes:
                    for s in a.sinks:
                        run(p, m, int(s), args if s == "0" else args + ["--sinks", s])
                else:
                    run(p, m, 0, args)
    from kvpolicy_tools.eval.quality_plot import plot  # matplotlib: pip install .[eval]

    plot(path, os.path.join(a.out, "quality.png"), f"2,048 tokens of {os.path.basename(a.text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
