#!/usr/bin/env python3
"""Reads a GPGPU-Sim timing-mode log of kvpolicy_sim_ratios (bench/sim_ratios.cu) and prints the
simulated ratios docs/perf.md records: the cycles of every kernel ("gpu_sim_cycle = N") summed per
phase, between the program's "kvpolicy-sim: begin/end <phase>" lines. Simulated cycles of the
simulator's model (an SM75 RTX 2060 config), never a measurement.
  gpusim_ratios.py LOG"""
import re
import sys


def phases(path):
    cycles, size, current = {}, {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"kvpolicy-sim: begin (\w+) bytes (\d+)", line)
        if m:
            current = m.group(1)
            cycles[current], size[current] = 0, int(m.group(2))
            continue
        if re.match(r"kvpolicy-sim: end (\w+)", line):
            current = None
            continue
        m = re.match(r"\s*gpu_sim_cycle = (\d+)", line)
        if m and current:
            cycles[current] += int(m.group(1))
    return cycles, size


def main():
    cycles, size = phases(sys.argv[1])
    done = [p for p in ("copy", "decode", "attention", "evict") if cycles.get(p)]
    if not done:
        sys.exit(f"gpusim_ratios: no simulated cycles in {sys.argv[1]} (was it run in timing mode, PTX_SIM_MODE_FUNC=0?)")
    print("| phase | simulated cycles | bytes | bytes / cycle |")
    print("| --- | ---: | ---: | ---: |")
    for p in done:
        bpc = f"{size[p] / cycles[p]:.1f}" if size[p] else "–"
        print(f"| {p} | {cycles[p]:,} | {size[p]:,} | {bpc} |")
    if "copy" in done and "decode" in done:
        ratio = (size["decode"] / cycles["decode"]) / (size["copy"] / cycles["copy"])
        print(f"\ndecode attention bytes/cycle / copy bytes/cycle (read + write): {ratio:.2f} (goal >= 0.8)")
    if "attention" in done and "evict" in done:
        print(f"one eviction step / one decode step's attention (all layers): "
              f"{cycles['evict'] / cycles['attention']:.1%} (goal <= 5%)")
    missing = [p for p in ("copy", "decode", "attention", "evict") if p not in done]
    if missing:
        print(f"\n(phases not in this log: {', '.join(missing)})")


if __name__ == "__main__":
    main()
