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
    missing = [p for p in ("copy", "decode", "attention", "evict") if not cycles.get(p)]
    if missing:
        sys.exit(f"gpusim_ratios: no simulated cycles for {', '.join(missing)} in {sys.argv[1]} "
                 "(was it run in timing mode, PTX_SIM_MODE_FUNC=0?)")
    copy_bpc = size["copy"] / cycles["copy"]  # read + write bytes per cycle
    decode_bpc = size["decode"] / cycles["decode"]  # K + V bytes read per cycle
    print(f"| phase | simulated cycles | bytes | bytes / cycle |")
    print(f"| --- | ---: | ---: | ---: |")
    for p in ("copy", "decode", "attention", "evict"):
        bpc = f"{size[p] / cycles[p]:.1f}" if size[p] else "–"
        print(f"| {p} | {cycles[p]:,} | {size[p]:,} | {bpc} |")
    print(f"\ndecode attention bytes/cycle / copy bytes/cycle (read + write): {decode_bpc / copy_bpc:.2f} (goal >= 0.8)")
    print(f"one eviction step / one decode step's attention (all layers): {cycles['evict'] / cycles['attention']:.1%} "
          "(goal <= 5%)")


if __name__ == "__main__":
    main()
