#!/usr/bin/env python3
"""Kernel time of one call, from Nsight Compute's kernel list: the `gpu__time_duration.sum` of every
kernel launched between two marker kernels, summed (ncu flushes the caches before each kernel and,
by default, fixes the clocks at base: the same for every engine timed this way).

The profiled program launches a marker, the call, a marker, for each labelled call in order
(kvpolicy_bench_cuda --once, bench/torch_reference.py --once). Prints one JSON object per call:
{"label": ..., "us": ..., "kernels": [[name, us], ...]}.

  ncu --metrics gpu__time_duration.sum -o run PROGRAM ...
  ncu --import run.ncu-rep --csv --page raw --metrics gpu__time_duration.sum --print-units base > run.csv
  ncu_kernel_time.py run.csv --marker ncu_marker_kernel --labels 256,512,...
  ncu_kernel_time.py run.csv --marker spin_kernel --labels-json order.json   (torch_reference.py's "once")
"""
import argparse
import csv
import json
import re
import sys


def kernel_rows(path):
    """(kernel name, duration in ns) for every profiled kernel, in launch order."""
    rows = list(csv.reader(open(path, newline="")))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "gpu__time_duration.sum" in r)
    cols = rows[head]
    name_at, time_at, id_at = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum"), cols.index("ID")
    out = []
    for r in rows[head + 1:]:
        if len(r) <= time_at or not r[id_at].strip().isdigit():
            continue  # the units row, or ncu's own lines
        value = r[time_at].replace(",", "")
        unit_row = rows[head + 1] if len(rows) > head + 1 else []
        unit = unit_row[time_at] if len(unit_row) > time_at and not unit_row[id_at].strip().isdigit() else "ns"
        scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1.0)
        out.append((int(r[id_at]), r[name_at], float(value) * scale))
    out.sort()
    return [(name, ns) for _, name, ns in out]


def calls(kernels, marker):
    """The kernels between each pair of markers (1st-2nd, 3rd-4th, ...)."""
    is_marker = re.compile(marker).search
    out, inside, current = [], False, []
    for name, ns in kernels:
        if is_marker(name):
            if inside:
                out.append(current)
            inside, current = not inside, []
        elif inside:
            current.append((name, ns))
    if inside:
        sys.exit(f"ncu_kernel_time: an unmatched marker ({marker}): the kernel list was cut short")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--marker", required=True, help="regex naming the marker kernel")
    ap.add_argument("--labels", help="comma-separated labels of the calls, in order")
    ap.add_argument("--labels-json", help="a file whose JSON has {'once': [label, ...]} (torch_reference.py --once)")
    args = ap.parse_args()
    if args.labels_json:
        text = open(args.labels_json).read()
        labels = next(json.loads(line)["once"] for line in text.splitlines() if line.startswith('{"once"'))
    else:
        labels = args.labels.split(",")
    found = calls(kernel_rows(args.csv), args.marker)
    if len(found) != len(labels):
        sys.exit(f"ncu_kernel_time: {len(found)} marked calls in {args.csv}, {len(labels)} labels")
    for label, ks in zip(labels, found):
        if not ks:
            sys.exit(f"ncu_kernel_time: the call {label} launched no kernel between its markers")
        print(json.dumps({"label": label, "us": sum(ns for _, ns in ks) / 1e3,
                          "kernels": [[name[:120], ns / 1e3] for name, ns in ks]}))


if __name__ == "__main__":
    main()
