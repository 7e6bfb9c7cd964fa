#!/usr/bin/env python3
"""Plots kvpolicy-quality's results: perplexity against the budget M, one line per policy
(solid: no protected sinks, dashed: 4 sinks), the full cache as a horizontal line; and prints them
as docs/quality.md's Markdown table.

    kvpolicy-quality-plot results.csv quality.png ["2,048 tokens of GPL-3"]

The learned policies (trimkv, dbtrimkv, wgkv) are drawn thicker. wgkv's M is its ring W_local.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


LEARNED = {"trimkv", "dbtrimkv", "wgkv"}


def plot(path, out, text="2,048 tokens of GPL-3"):
    rows = list(csv.DictReader(open(path)))
    full = [float(r["ppl"]) for r in rows if r["policy"] == "full"]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    policies = [p for p in dict.fromkeys(r["policy"] for r in rows) if p != "full"]
    colors = plt.get_cmap("tab20").colors  # one colour per policy: there are more than ten
    for i, p in enumerate(policies):
        for sinks, style in (("0", "-"), ("4", "--")):
            pts = sorted((int(r["budget"]), float(r["ppl"])) for r in rows if r["policy"] == p and r["sinks"] == sinks)
            if pts:
                ax.plot([m for m, _ in pts], [v for _, v in pts], style, marker="o", color=colors[i % len(colors)],
                        linewidth=2.6 if p in LEARNED else 1.2,
                        label=p + (" + 4 sinks" if sinks == "4" else "") + (" (ring = M)" if p == "wgkv" else ""))
    if full:
        ax.axhline(full[0], color="black", linewidth=1, label=f"full cache ({full[0]:.2f})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("budget M (entries per layer and kv head)")
    ax.set_ylabel(f"perplexity ({text})")
    ax.set_title("SmolLM2-135M through kvpolicy-lm: perplexity at a fixed KV budget")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"quality_plot: {out}")
    budgets = sorted({int(r["budget"]) for r in rows if r["policy"] != "full"})
    print("| policy | sinks | " + " | ".join(f"M = {m}" for m in budgets) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in budgets) + " |")
    if full:
        print(f"| full cache | — | " + " | ".join(f"{full[0]:.2f}" for _ in budgets) + " |")
    for p in policies:
        for sinks in ("0", "4"):
            vals = {int(r["budget"]): float(r["ppl"]) for r in rows if r["policy"] == p and r["sinks"] == sinks}
            if vals:
                print(f"| {p} | {sinks} | " + " | ".join(f"{vals[m]:.2f}" if m in vals else "—" for m in budgets) + " |")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.split("\n\n")[1])
    plot(*sys.argv[1:])


if __name__ == "__main__":
    main()
