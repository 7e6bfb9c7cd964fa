#!/usr/bin/env python3
"""What a tools/test.sh run passed, failed and skipped, from the JUnit files its ctest phases wrote
(`ctest --output-junit`) and the phases it skipped (phases.tsv: name, reason).

  tools/test_results.py DIR           prints the counts and names every skipped entry with its reason
  tools/test_results.py --ci DIR      the same, and exits 1 when anything skipped for a reason other
                                      than the absence of a GPU (.ci/run: CI reaches PyPI, so a skip
                                      there is a set-up that failed)

A skip's reason is the line its entry printed with SKIPPED in it (every set-up script and test of
this project prints one), else ctest's own ("Unable to find executable", SKIP_RETURN_CODE=77).
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# The reasons that mean "no GPU here", the only skips CI accepts (its machines have none): a CUDA
# device absent (tests/cuda/main.cpp, examples/engine_cuda.cu, bench/, tests/dist/), GPGPU-Sim, which
# stands in for one, not installed (tools/test.sh), and NCCL, which comes with a GPU machine's stack.
NO_GPU = re.compile(r"no CUDA device|see no GPU|\(no GPU\)|no GPU simulator|no NCCL")
# What ctest reports as not run that is a skip; anything else not run (a missing executable, a
# failed fixture) is a failure.
SKIPS = ("SKIP_RETURN_CODE", "SKIP_REGULAR_EXPRESSION_MATCHED", "Disabled")


def reason(case):
    out = case.findtext("system-out") or ""
    lines = [line.strip() for line in out.splitlines() if "SKIPPED" in line]
    if lines:
        return lines[-1]
    skipped = case.find("skipped")
    return (skipped.get("message") if skipped is not None else "") or "no reason printed"


def collect(directory):
    """(run, entry, status, reason) for every ctest entry and skipped phase under directory."""
    rows = []
    for junit in sorted(Path(directory).glob("*.xml")):
        for case in ET.parse(junit).getroot().iter("testcase"):
            status = case.get("status")
            if status == "run":
                rows.append((junit.stem, case.get("name"), "passed", ""))
            elif status == "fail":
                rows.append((junit.stem, case.get("name"), "failed", ""))
            elif status in ("notrun", "disabled"):
                skipped = case.find("skipped")
                message = skipped.get("message", "") if skipped is not None else ""
                skip = status == "disabled" or message.startswith(SKIPS)
                rows.append((junit.stem, case.get("name"), "skipped" if skip else "failed", reason(case) if skip else message))
            else:
                sys.exit(f"test_results: {junit}: entry {case.get('name')} has status {status!r}")
    phases = Path(directory) / "phases.tsv"
    if phases.exists():
        for line in phases.read_text().splitlines():
            name, why = line.split("\t", 1)
            rows.append(("phase", name, "skipped", why))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ci", action="store_true", help="fail on any skip not caused by the absence of a GPU")
    ap.add_argument("directory")
    args = ap.parse_args()
    rows = collect(args.directory)
    if not rows:
        sys.exit(f"test_results: no ctest results under {args.directory}")
    counts = {s: sum(1 for r in rows if r[2] == s) for s in ("passed", "failed", "skipped")}
    print(f"== test.sh: entries: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    for run, name, status, why in rows:
        if status != "passed":
            print(f"   {status:8s} [{run}] {name}: {why}")
    refused = [r for r in rows if r[2] == "skipped" and not NO_GPU.search(r[3])]
    if args.ci and refused:
        print(f"ci: FAILED: {len(refused)} entries skipped for a reason other than the absence of a GPU "
              "(CI reaches PyPI: a skip here is a set-up that failed):", file=sys.stderr)
        for run, name, _, why in refused:
            print(f"   [{run}] {name}: {why}", file=sys.stderr)
        return 1
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
