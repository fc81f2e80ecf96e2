"""Warehouse ingest rate of tidy sketch rows: our write path vs DuckDB's raw Arrow path vs row by row.

    .venv/bin/python benchmarks/ingest_rate.py [--rows 2000000] [--repeats 3] [--row-by-row 3000] [--json]

All in the same run, on the same rows: a frame shaped like a real opscope run
(``sketches`` columns, low-cardinality text, vector stats with ``idx``), with
text columns as the drivers hand them over (Arrow strings,
:func:`goblin_assets.warehouse.frames.text`):

* ``ours``: :func:`goblin_assets.warehouse.db.write_frames` (the pandera
  schema, then Arrow, then ``INSERT ... SELECT`` in one transaction);
* ``raw_ctas``: ``CREATE TABLE ... AS SELECT * FROM arrow_table`` from the
  same rows converted to Arrow beforehand (DuckDB's fastest path, no checks);
* ``insert_only``: our ``INSERT ... SELECT`` from that Arrow table into the
  typed table, in one transaction, without validation;
* ``validate`` and ``arrow_convert``: the two parts of ``ours`` before the
  insert, timed on their own;

each repeated ``--repeats`` times, interleaved (a fresh DuckDB file each
time), so that a busy neighbour on a shared machine slows every arm alike;
best and median are reported, and ``ours / raw`` per repeat.  Once each:

* ``ours_python_str``: ``write_frames`` on the same rows with text columns
  of Python ``str`` objects (a writer that does not use ``text``): the
  schema converts them cell by cell;
* ``row_by_row``: ``executemany`` INSERT of the first ``--row-by-row`` rows
  only (it runs at a few hundred rows/s), rate extrapolated to all rows: said so
  in the output;
* ``parquet``: pyarrow ``write_table`` of the same Arrow table.

Source of the reference numbers: ``docs/measured_facts.md`` "Warehouse ingest" (1.9 M rows/s
raw, 290 rows/s row by row, measured while planning).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from goblin_assets.opscope.record import SKETCH_COLUMNS
from goblin_assets.warehouse.db import connect, validate, write_frames
from goblin_assets.warehouse.tables import columns, ddl

_SITES = [f"encoder.layer.{k // 9}.attention.self.{'qkv'[k % 3]}" for k in range(55)]
_ROLES = ["lhs", "rhs", "out"]
_STATS = ["min", "max", "mean", "l1", "sumsq", "nnz", "kurtosis", "chan_outlier", "hist", "chan_maxabs",
          "pos_sumsq", "adj_sumsq", "sample"]
_TEXT_CONSTANTS = {"run_id": "bench-run", "workload": "minilm", "model": "sentence-transformers/all-MiniLM-L6-v2",
                   "backend": "cpu", "dist": "stdlib-docstrings"}


def sketch_frame(n: int, seed: int = 0, python_str: bool = False) -> pd.DataFrame:
    """``n`` tidy sketch rows shaped like a MiniLM run (55 sites, 3 roles, 13 stats, vector idx).

    Text columns are Arrow strings (:data:`goblin_assets.warehouse.tables.TEXT`,
    as the drivers emit them), or Python ``str`` objects with ``python_str``.

    Shapes: ``(n, 15)`` with the columns of the ``sketches`` table.
    """
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    codes = {"site": (_SITES, (i // 2000) % 55), "role": (_ROLES, (i // 700) % 3), "stat": (_STATS, (i // 384) % 13)}
    df = pd.DataFrame({
        **_TEXT_CONSTANTS,
        "step": i // 200_000, "M": 4096, "K": 384, "N": 1536, "numel": 4096 * 384,
        **{c: np.array(vals, dtype=object)[k] for c, (vals, k) in codes.items()},
        "idx": i % 384, "value": rng.standard_normal(n),
    })[SKETCH_COLUMNS]
    if not python_str:
        for c in list(_TEXT_CONSTANTS) + list(codes):
            df[c] = pd.arrays.ArrowExtensionArray(pa.array(df[c].to_numpy(), pa.string()))
    return df


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _fresh(tmp: Path, name: str, typed: bool) -> duckdb.DuckDBPyConnection:
    """A new DuckDB file in ``tmp``; with ``typed`` the ``sketches`` table exists (as the warehouse creates it)."""
    con = duckdb.connect(str(tmp / f"{name}.duckdb"))
    if typed:
        con.execute(ddl("sketches"))
    return con


def measure_ingest(n: int = 2_000_000, repeats: int = 3, row_by_row: int = 3000) -> dict:
    """Seconds and rows/s of each path on the same ``n`` rows (see the module docstring).

    Returns
    -------
    dict
        ``rows``, ``repeats``; ``times_s`` (arm -> list of seconds, one per
        repeat; single-run arms have one), ``best_s``, ``median_s``,
        ``rows_per_s`` (from the best), ``ours_vs_raw`` (best rate / best rate),
        ``ours_vs_raw_per_repeat`` and ``ours_vs_raw_median``,
        ``row_by_row_measured_rows`` (the rows actually inserted one by one)
        and ``row_by_row_extrapolated_s``.  Units: seconds, rows per second.
        Source: measured.
    """
    df = sketch_frame(n)
    arrow = pa.Table.from_pandas(df, preserve_index=False)
    validate("sketches", df.head(1000))          # pandera's lazy imports: not part of any arm
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def ours(con):
            write_frames(con, {"sketches": df})

        def raw(con):
            con.register("arrow_table", arrow)
            con.execute("CREATE TABLE raw AS SELECT * FROM arrow_table")

        def insert_only(con):
            con.execute("BEGIN TRANSACTION")
            con.register("_a", arrow)
            con.execute("INSERT INTO sketches SELECT * FROM _a")
            con.execute("COMMIT")

        arms = {"ours": (ours, True), "raw_ctas": (raw, False), "insert_only": (insert_only, True)}
        for rep in range(repeats):
            names = list(arms)
            for arm in names[rep % len(names):] + names[:rep % len(names)]:   # rotate: no arm always first
                fn, typed = arms[arm]
                con = _fresh(tmp, f"{arm}{rep}", typed)
                times.setdefault(arm, []).append(_timed(lambda: fn(con)))
                if arm != "raw_ctas":
                    assert con.execute("SELECT count(*) FROM sketches").fetchone()[0] == n
                con.close()
            times.setdefault("validate", []).append(_timed(lambda: validate("sketches", df)))
            times.setdefault("arrow_convert", []).append(
                _timed(lambda: pa.Table.from_pandas(df, preserve_index=False)))
        slow = sketch_frame(n, python_str=True)
        with connect(tmp / "python_str.duckdb") as con:
            times["ours_python_str"] = [_timed(lambda: write_frames(con, {"sketches": slow}))]
        rb = _fresh(tmp, "rows", True)
        cols = columns("sketches")
        few = list(slow.head(row_by_row).itertuples(index=False, name=None))
        sql = (f"INSERT INTO sketches ({', '.join(chr(34) + c + chr(34) for c in cols)}) "
               f"VALUES ({', '.join('?' * len(cols))})")
        times["row_by_row"] = [_timed(lambda: rb.executemany(sql, few))]
        rb.close()
        times["parquet"] = [_timed(lambda: pq.write_table(arrow, tmp / "rows.parquet"))]
    best = {k: min(v) for k, v in times.items()}
    rows_per_s = {k: n / v for k, v in best.items()}
    rows_per_s["row_by_row"] = len(few) / best["row_by_row"]
    per_rep = [r / o for r, o in zip(times["raw_ctas"], times["ours"])]
    return {
        "rows": n, "repeats": repeats, "times_s": times, "best_s": best,
        "median_s": {k: statistics.median(v) for k, v in times.items()}, "rows_per_s": rows_per_s,
        "ours_vs_raw": best["raw_ctas"] / best["ours"], "ours_vs_raw_per_repeat": per_rep,
        "ours_vs_raw_median": statistics.median(per_rep),
        "row_by_row_measured_rows": len(few), "row_by_row_extrapolated_s": n / rows_per_s["row_by_row"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the interleaved arms")
    ap.add_argument("--row-by-row", type=int, default=3000, help="rows inserted one by one (then extrapolated)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure_ingest(a.rows, a.repeats, a.row_by_row)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    n, b, rate = r["rows"], r["best_s"], r["rows_per_s"]
    print(f"ingest of {n:,} tidy sketch rows (same rows, same run; best of {r['repeats']} interleaved repeats, "
          f"this machine may be shared)")
    lines = [
        ("ours (pandera schema + Arrow + INSERT, one transaction)", "ours"),
        ("  of which: pandera validation alone", "validate"),
        ("  of which: conversion to Arrow alone", "arrow_convert"),
        ("INSERT from the Arrow table only (no validation)", "insert_only"),
        ("DuckDB raw CREATE TABLE AS from the same Arrow table", "raw_ctas"),
    ]
    for label, k in lines:
        print(f"  {label:58s} {rate[k]:>12,.0f} rows/s  best {b[k]:6.2f} s  median {r['median_s'][k]:6.2f} s")
    print(f"  {'ours, text columns as Python str (converted per cell)':58s} {rate['ours_python_str']:>12,.0f} rows/s  "
          f"{b['ours_python_str']:6.2f} s (once)")
    print(f"  {'row-by-row executemany INSERT':58s} {rate['row_by_row']:>12,.0f} rows/s  measured on "
          f"{r['row_by_row_measured_rows']:,} rows only ({b['row_by_row']:.2f} s); extrapolated to {n:,} rows: "
          f"{r['row_by_row_extrapolated_s'] / 3600:.1f} h")
    print(f"  {'Parquet write (pyarrow)':58s} {rate['parquet']:>12,.0f} rows/s")
    per = ", ".join(f"{x:.2f}" for x in r["ours_vs_raw_per_repeat"])
    print(f"  ours / raw = {r['ours_vs_raw']:.2f} from the best times (target >= 0.90); per repeat: {per}; "
          f"median {r['ours_vs_raw_median']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
