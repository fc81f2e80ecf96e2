"""Score the kernel/op category table on real names it was not built from.

``benchmarks/data/kernel_names_heldout.yaml`` holds real kernel and op names
as they appear in profiler output (public test traces of Holistic Trace
Analysis and TraceLens other than the six the table was checked against,
GitHub issues and pull requests that paste profiler tables, library sources),
each with its source and the group a reader assigned from what the kernel is,
before looking at the table (``unsure`` marks labels the reader doubted).
The table (``goblin_assets/runners/categories.yaml``) never saw them: when
the table is tuned on some of them, move those to the tests' own name list
and keep the rest here, so this stays a held-out score.

    .venv/bin/python benchmarks/category_heldout.py [--misses]

Prints group and category accuracy over all held-out names, over the surely
labelled ones, per kind (GPU kernel, CPU op), and how many fell into
``other``; ``--misses`` lists every miss as expected -> predicted.
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import yaml

from goblin_assets.runners.categories import classify

DATA = Path(__file__).resolve().parent / "data" / "kernel_names_heldout.yaml"


def score(rows: list[dict], label: str) -> None:
    """Print accuracy of ``rows`` (each with expected and predicted group/category)."""
    n = len(rows)
    if not n:
        return
    group = sum(r["pred_group"] == r["expected_group"] for r in rows)
    cat = sum(r["pred_category"] == r.get("expected_category", r["pred_category"]) for r in rows)
    other = Counter(r["pred_group"] == "other" for r in rows)[True]
    print(f"{label:34s} N={n:4d}  group {group / n:6.1%}  category {cat / n:6.1%}  predicted other: {other}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--misses", action="store_true", help="list every miss")
    args = ap.parse_args(argv)
    rows = [r for r in yaml.safe_load(DATA.read_text()) if not r.get("also_in_training_names")]
    for r in rows:
        m = classify(r["name"])
        r["pred_group"], r["pred_category"] = m.group, m.category
    score(rows, "held-out, all")
    score([r for r in rows if not r.get("unsure")], "held-out, sure labels")
    for kind in sorted({r["kind"] for r in rows}):
        score([r for r in rows if r["kind"] == kind], f"held-out, {kind}")
    if args.misses:
        for r in rows:
            if r["pred_group"] != r["expected_group"]:
                print(f"  {r['expected_group']:>11s} -> {r['pred_group']:<11s} {r['name'][:90]}  ({r['source']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
