"""The trade a user picks from: prose perplexity against pass-key accuracy, one point per policy and
gate, per head and token level, at each budget M (docs/quality.md's frontier).

    python -m kvpolicy_tools.eval.frontier docs/frontier.csv docs/frontier.png

The CSV holds one row per (policy, gate, layout, budget): `ppl` (kvpolicy-quality: 2,048 tokens of
GPL-3, 4 sinks, B = 16) and `passkeys` and `instances` (kvpolicy-retrieval --tasks single, 1K
context, the same settings); `layout` is per-head or token (--mode union); `gate` names the learned
policies' gate (empty for a heuristic). A row whose pass keys were not measured (empty) is printed
and not drawn. Prints the rows as a Markdown table, one column pair per budget; draws one panel per
budget, pass-key accuracy across, perplexity up (lower is better, so the best trade sits bottom
right).
"""
import argparse
import csv
import sys

FIELDS = ("policy", "gate", "layout", "budget", "ppl", "passkeys", "instances")
LAYOUTS = ("per-head", "token")


def read(path):
    """The rows, checked: every field present, a known layout, numbers where numbers go."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [k for k in FIELDS if k not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"frontier: {path} lacks the column(s) {', '.join(missing)} (need {', '.join(FIELDS)})")
        rows = []
        for n, r in enumerate(reader, start=2):
            try:
                if r["layout"] not in LAYOUTS:
                    raise ValueError(f"layout '{r['layout']}' is not {' or '.join(LAYOUTS)}")
                row = {"policy": r["policy"], "gate": r["gate"], "layout": r["layout"], "budget": int(r["budget"]),
                       "ppl": float(r["ppl"]), "passkeys": int(r["passkeys"]) if r["passkeys"] else None,
                       "instances": int(r["instances"]) if r["instances"] else None}
                if (row["passkeys"] is None) != (row["instances"] is None) or \
                        (row["instances"] is not None and not 0 <= row["passkeys"] <= row["instances"]) or \
                        row["instances"] == 0:
                    raise ValueError(f"passkeys {r['passkeys']} of instances {r['instances']}")
            except (ValueError, TypeError) as e:  # TypeError: a short row (a missing field reads None)
                raise SystemExit(f"frontier: {path} line {n}: {e}")
            rows.append(row)
    return rows


def label(r):
    return r["policy"] + (f" ({r['gate']})" if r["gate"] else "") + (", token level" if r["layout"] == "token" else "")


def table(rows):
    """Markdown: one line per (policy, gate, layout), perplexity and pass keys per budget."""
    budgets = sorted({r["budget"] for r in rows})
    keys = list(dict.fromkeys((r["policy"], r["gate"], r["layout"]) for r in rows))
    cell = {(r["policy"], r["gate"], r["layout"], r["budget"]): r for r in rows}
    head = "| policy (gate, layout) | " + " | ".join(f"ppl M = {m} | pass keys M = {m}" for m in budgets) + " |"
    lines = [head, "| --- |" + " ---: | ---: |" * len(budgets)]
    for k in keys:
        cells = []
        for m in budgets:
            r = cell.get(k + (m,))
            if r is None:
                cells += ["", ""]
                continue
            keys_cell = "" if r["passkeys"] is None else f"{100 * r['passkeys'] / r['instances']:.0f}% of {r['instances']}"
            cells += [f"{r['ppl']:.2f}", keys_cell]
        lines.append(f"| {label(dict(zip(('policy', 'gate', 'layout'), k)))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    budgets = sorted({r["budget"] for r in rows})
    fig, axes = plt.subplots(1, len(budgets), figsize=(6.5 * len(budgets), 5.5), squeeze=False)
    for ax, m in zip(axes[0], budgets):
        for r in (r for r in rows if r["budget"] == m and r["passkeys"] is not None):
            x = 100.0 * r["passkeys"] / r["instances"]
            learned = bool(r["gate"])
            ax.scatter(x, r["ppl"], marker="o" if r["layout"] == "per-head" else "s", s=70 if learned else 40,
                       color="tab:blue" if learned else "tab:gray", edgecolors="black" if learned else "none", zorder=3)
            ax.annotate(label(r), (x, r["ppl"]), textcoords="offset points", xytext=(5, 4), fontsize=7)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlim(-5, 105)
        ax.set_xlabel("pass keys kept and answered (%, 1K context)")
        ax.set_ylabel("perplexity (2,048 tokens of GPL-3)")
        ax.set_title(f"M = {m} per (layer, kv head), 4 sinks; circles per head, squares token level", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("png", nargs="?", help="where to draw the panels (omit: the table only)")
    a = ap.parse_args(argv)
    rows = read(a.csv)
    print(table(rows))
    if a.png:
        plot(rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
