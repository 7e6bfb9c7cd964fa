"""docs/quality.md's frontier (kvpolicy_tools.eval.frontier): the committed CSV reads, its table holds
every row's perplexity and pass keys in its budget's columns, and a malformed CSV is refused naming the
line; the plot is drawn where matplotlib is installed (SKIPPED where not).
usage: PYTHONPATH=python/tools python3 -m pytest -q -p no:cacheprovider tests/train/test_frontier.py
"""
import os

import pytest

from kvpolicy_tools.eval import frontier

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
committed = os.path.join(root, "docs", "frontier.csv")


def test_the_committed_csv_makes_the_table():
    rows = frontier.read(committed)
    assert {r["layout"] for r in rows} == {"per-head", "token"}
    assert {r["budget"] for r in rows} >= {64, 128}
    lines = frontier.table(rows).splitlines()
    budgets = sorted({r["budget"] for r in rows})
    for r in rows:  # each row's numbers sit in its budget's pair of columns on its policy's line
        line = next(l for l in lines if l.startswith(f"| {frontier.label(r)} |"))
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        at = 2 * budgets.index(r["budget"])
        assert cells[at] == f"{r['ppl']:.2f}"
        if r["passkeys"] is not None:
            assert cells[at + 1] == f"{100 * r['passkeys'] / r['instances']:.0f}% of {r['instances']}"


def test_a_malformed_csv_is_refused_by_line(tmp_path):
    path = tmp_path / "f.csv"
    head = ",".join(frontier.FIELDS)
    for body, why in (("trimkv,g,both,64,20.0,1,10", "line 2: layout 'both'"),
                      ("trimkv,g,token,64,20.0,11,10", "line 2: passkeys 11 of instances 10"),
                      ("trimkv,g,token,64,20.0,3,", "line 2: passkeys 3 of instances"),
                      ("trimkv,g,token,sixty,20.0,,", "line 2"),
                      ("trimkv,g,token,64,20.0,0,0", "line 2: passkeys 0 of instances 0"),
                      ("trimkv,g,token,64", "line 2")):
        path.write_text(f"{head}\n{body}\n")
        with pytest.raises(SystemExit, match=why):
            frontier.read(str(path))
    path.write_text("policy,budget,ppl\n")
    with pytest.raises(SystemExit, match="lacks the column"):
        frontier.read(str(path))


def test_the_plot_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "frontier.png"
    assert frontier.main([committed, str(out)]) == 0
    assert out.stat().st_size > 10_000
