"""Sketch storage and ingest: rows and bytes per audited step, tidy table vs per-tensor lists, and write rates.

    .venv/bin/python benchmarks/ingest_rate.py [--rows 2000000] [--repeats 3] [--row-by-row 3000]
                                               [--no-minilm] [--json]

One run, on real recorded sketches (nothing synthetic):

* ``digits_mlp``: the audit's own recorder
  (:func:`goblin_assets.opscope.record.record_workload`, 3 steps of
  ``workloads/digits_mlp``, full sketch set);
* ``minilm``: the pretrained all-MiniLM-L6-v2 driver
  (:func:`goblin_assets.opscope.drivers.minilm`, 3 steps, batch 32 x 128,
  CPU: 37 linear, 12 matmul and 6 softmax sites); ``--no-minilm`` skips it.

**Storage (before / after).**  Each recording is written to a fresh DuckDB
file twice: *before*, as the tidy physical table the warehouse had until now
(``tables.ddl("sketches")``: one row per value); *after*, through the
warehouse writer (:func:`goblin_assets.warehouse.db.write_frames`: one row per
tensor and statistic in ``sketch_stats``, the ``sketches`` view over it;
``warehouse/storage.py``).  Rows per audited step are the physical table's
rows over the recorded steps.  Bytes per step are the growth of the database
file (after ``CHECKPOINT``, over the same file holding only the empty schema)
over the steps written; DuckDB allocates 256 KiB blocks, so the recording is
written ``--copies`` times under distinct run ids (enough for about
``--rows`` tidy rows) and the growth divided by all their steps.  The same
queries (per-site max|x| per step, density, histogram sums, the
``site_sketch_summary`` SQL model, and every row: ``EXCEPT ALL`` both ways)
run on both files and must agree; the script asserts it and that the rows per
step drop at least 5x.

**Ingest rates**, on the MiniLM rows (digits with ``--no-minilm``) copied to
about ``--rows`` rows, text columns as the drivers hand them over (Arrow
strings, :func:`goblin_assets.warehouse.frames.text`):

* ``ours``: ``write_frames`` (pandera schema, conversion to per-tensor lists,
  ``INSERT`` into ``sketch_stats``, one transaction);
* ``tidy``: the write path before the list layout (pandera schema, Arrow,
  ``INSERT`` into the tidy table, one transaction);
* ``raw_ctas``: ``CREATE TABLE ... AS SELECT * FROM arrow_table`` of the tidy
  rows converted to Arrow beforehand (DuckDB's fastest path, no checks);
* ``insert_only``: ``INSERT`` of that Arrow table into the tidy table, no
  validation;
* ``validate``, ``arrow_convert`` and ``to_lists``: the parts on their own;

each repeated ``--repeats`` times, interleaved (a fresh DuckDB file each
time), so that a busy neighbour on a shared machine slows every arm alike;
best and median are reported.  Rates are tidy rows per second for every arm
(the same rows).  Once each: ``ours_python_str`` (text columns as Python
``str``: the schema converts them cell by cell), ``row_by_row``
(``executemany`` INSERT of the first ``--row-by-row`` rows into the tidy
table, extrapolated: said so), ``parquet`` (pyarrow ``write_table``).

Source of the reference numbers: ``docs/measured_facts.md`` "Warehouse ingest" (1.9 M rows/s
raw, 290 rows/s row by row, measured while planning).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from goblin_assets.warehouse import storage
from goblin_assets.warehouse.db import connect, validate, write_frames
from goblin_assets.warehouse.sql_models import build_model, load_models
from goblin_assets.warehouse.tables import TEXT, columns, ddl, dtypes

#: Queries that must return the same result on both layouts (the view on one, the tidy table on the other).
QUERIES: dict[str, str] = {
    "per-site max|x| per step": (
        "SELECT run_id, site, role, step, max(abs(value)) AS amax FROM sketches "
        "WHERE stat IN ('min', 'max') GROUP BY ALL ORDER BY ALL"),
    "density (nnz / numel)": (
        "SELECT run_id, site, role, avg(value / numel) AS density FROM sketches WHERE stat = 'nnz' "
        "GROUP BY ALL ORDER BY ALL"),
    "histogram sums": (
        "SELECT run_id, site, role, step, sum(value) AS mass, count(*) AS bins FROM sketches WHERE stat = 'hist' "
        "GROUP BY ALL ORDER BY ALL"),
    "rows per stat, idx sum, NULL values": (
        "SELECT stat, count(*) AS n, sum(idx) AS idx_sum, count(*) - count(value) AS nulls FROM sketches "
        "GROUP BY ALL ORDER BY ALL"),
    "one tensor's channel maxima": (
        "SELECT idx, value FROM sketches WHERE stat = 'chan_maxabs' AND role = 'lhs' AND step = 0 "
        "AND site = (SELECT min(site) FROM sketches) ORDER BY run_id, idx"),
}


# ---------------------------------------------------------------- recordings
def record_digits(steps: int = 3) -> pd.DataFrame:
    """The audit recorder's rows for ``workloads/digits_mlp`` (``steps`` recorded steps, full sketch set)."""
    from goblin_assets.opscope.record import record_workload
    from goblin_assets.runners.local import LocalRunner
    from goblin_assets.runners.workload import load_workload

    root = Path(__file__).resolve().parents[1] / "workloads" / "digits_mlp"
    with tempfile.TemporaryDirectory() as home:
        old = os.environ.get("GOBLIN_HOME")
        os.environ["GOBLIN_HOME"] = home          # the run's files go to a scratch home, not the user's
        try:
            return record_workload(load_workload(root), LocalRunner(timeout_s=300), steps=steps, run_id="bench-digits")
        finally:
            if old is None:
                os.environ.pop("GOBLIN_HOME", None)
            else:
                os.environ["GOBLIN_HOME"] = old


def record_minilm(steps: int = 3) -> pd.DataFrame:
    """The MiniLM driver's rows: ``steps`` batches of 32 x 128 docstring tokens on the CPU."""
    from goblin_assets.opscope.drivers import minilm

    return minilm(steps=steps, batch=32, seq_len=128).rows


def copies(df: pd.DataFrame, k: int) -> pd.DataFrame:
    """``k`` copies of a recording under run ids ``<run>-0 .. <run>-{k-1}`` (text columns stay Arrow strings)."""
    df = df.astype({c: t for c, t in dtypes("sketches").items() if df[c].dtype != t})
    run = pa.array(df["run_id"])
    parts = []
    for i in range(k):
        part = df.copy(deep=False)
        part["run_id"] = pd.arrays.ArrowExtensionArray(pc.binary_join_element_wise(run, f"-{i}", ""))
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


# ---------------------------------------------------------------- the two layouts
def _write_tidy(con: duckdb.DuckDBPyConnection, df: pd.DataFrame) -> None:
    """The write path before the list layout: validate, Arrow, INSERT into the tidy table, one transaction."""
    checked = validate("sketches", df)
    arrow = pa.Table.from_pandas(checked, preserve_index=False)
    con.execute("BEGIN TRANSACTION")
    con.register("_tidy", arrow)
    cols = ", ".join(f'"{c}"' for c in columns("sketches"))
    con.execute(f'INSERT INTO sketches ({cols}) SELECT {cols} FROM _tidy')
    con.unregister("_tidy")
    con.execute("COMMIT")


def _tidy_file(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    con.execute(ddl("sketches"))              # the tidy physical table warehouses had before
    return con


def _list_file(path: Path) -> duckdb.DuckDBPyConnection:
    with connect(path):                       # the warehouse's own schema: sketch_stats + the sketches view
        pass
    return duckdb.connect(str(path))


def _size(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    con.execute("CHECKPOINT")
    return path.stat().st_size


def storage_compare(name: str, df: pd.DataFrame, tmp: Path, target_rows: int) -> dict:
    """Rows and bytes per step of ``df`` on both layouts, and the queries compared (see the module docstring).

    Returns
    -------
    dict
        ``steps``, ``tidy_rows``, ``copies``; ``before``/``after`` each with
        ``rows`` (physical rows of one copy), ``rows_per_step``, ``bytes``
        (file growth for all copies), ``bytes_per_step``, ``query_s`` (the
        query set's seconds); ``rows_factor``, ``bytes_factor``; ``queries``
        (name -> result rows, all equal); ``differing_rows`` (``EXCEPT ALL``
        both ways: 0).  Units: rows, bytes, seconds.  Source: measured.
    """
    steps = int(df["step"].nunique() * df["run_id"].nunique())
    k = max(1, math.ceil(target_rows / len(df)))
    many = copies(df, k)
    out: dict = {"workload": name, "steps": steps, "tidy_rows": len(df), "copies": k}
    cons = {}
    for layout, opener, writer in (("before", _tidy_file, _write_tidy),
                                   ("after", _list_file, lambda c, d: write_frames(c, {"sketches": d}))):
        path = tmp / f"{name}-{layout}.duckdb"
        con = opener(path)
        empty = _size(con, path)
        writer(con, df)                                              # one copy: the rows of this recording
        rows = con.execute("SELECT count(*) FROM sketch_stats" if layout == "after"
                           else "SELECT count(*) FROM sketches").fetchone()[0]
        writer(con, many)                                            # k more: past the block granularity
        grown = _size(con, path) - empty
        t = time.perf_counter()
        results = {q: con.execute(sql).df() for q, sql in QUERIES.items()}
        query_s = time.perf_counter() - t
        out[layout] = {"rows": int(rows), "rows_per_step": rows / steps, "bytes": int(grown),
                       "bytes_per_step": grown / (steps * (k + 1)), "query_s": query_s}
        cons[layout] = (con, results)
    (tidy, before), (lists, after) = cons["before"], cons["after"]
    out["queries"] = {}
    for q in QUERIES:
        a, b = before[q], after[q]
        assert list(a.columns) == list(b.columns) and len(a) == len(b), q
        for c in a.columns:
            if a[c].dtype.kind == "f":
                assert np.allclose(a[c], b[c], rtol=1e-12, atol=0, equal_nan=True), (name, q, c)
            else:
                assert (a[c].to_numpy() == b[c].to_numpy()).all(), (name, q, c)
        out["queries"][q] = len(a)
    # the SQL model on top, and every row: the view and the tidy table hold the same multiset of rows
    model = next(m for m in load_models() if m.name == "site_sketch_summary")
    stg = next(m for m in load_models() if m.name == "stg_sketch_scalars")
    sums = []
    for con in (tidy, lists):
        build_model(con, stg)
        build_model(con, model)
        sums.append(con.execute("SELECT * FROM site_sketch_summary ORDER BY ALL").df())
    pd.testing.assert_frame_equal(sums[0], sums[1], rtol=1e-12)
    out["queries"]["site_sketch_summary (SQL model)"] = len(sums[0])
    tidy.close()
    lists.execute(f"ATTACH '{tmp / f'{name}-before.duckdb'}' AS tidy (READ_ONLY)")
    diff = lists.execute("SELECT (SELECT count(*) FROM (SELECT * FROM tidy.sketches EXCEPT ALL SELECT * FROM sketches))"
                         " + (SELECT count(*) FROM (SELECT * FROM sketches EXCEPT ALL SELECT * FROM tidy.sketches))"
                         ).fetchone()[0]
    lists.close()
    assert diff == 0, f"{name}: {diff} rows differ between the layouts"
    out["differing_rows"] = int(diff)
    out["rows_factor"] = out["before"]["rows_per_step"] / out["after"]["rows_per_step"]
    out["bytes_factor"] = out["before"]["bytes_per_step"] / out["after"]["bytes_per_step"]
    assert out["rows_factor"] >= 5, f"{name}: rows per step drop only {out['rows_factor']:.1f}x"
    return out


# ---------------------------------------------------------------- ingest rates
def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure_ingest(df: pd.DataFrame, repeats: int = 3, row_by_row: int = 3000, tmp: Path | None = None) -> dict:
    """Seconds and tidy rows/s of each write path on the same rows ``df`` (see the module docstring).

    Returns
    -------
    dict
        ``rows``, ``repeats``; ``times_s`` (arm -> seconds per repeat;
        single-run arms have one), ``best_s``, ``median_s``, ``rows_per_s``
        (tidy rows per second, from the best), ``ours_vs_raw`` and
        ``ours_vs_tidy`` (best rate / best rate), ``row_by_row_measured_rows``
        and ``row_by_row_extrapolated_s``.  Units: seconds, rows per second.
        Source: measured.
    """
    n = len(df)
    arrow = pa.Table.from_pandas(df, preserve_index=False)
    validate("sketches", df.head(1000))          # pandera's lazy imports: not part of any arm
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        d = Path(d)

        def raw(con):
            con.register("arrow_table", arrow)
            con.execute("CREATE TABLE raw AS SELECT * FROM arrow_table")

        def insert_only(con):
            con.execute("BEGIN TRANSACTION")
            con.register("_a", arrow)
            con.execute("INSERT INTO sketches SELECT * FROM _a")
            con.execute("COMMIT")

        arms = {"ours": (lambda con: write_frames(con, {"sketches": df}), _list_file, "list"),
                "tidy": (lambda con: _write_tidy(con, df), _tidy_file, "tidy"),
                "raw_ctas": (raw, lambda p: duckdb.connect(str(p)), None),
                "insert_only": (insert_only, _tidy_file, "tidy")}
        for rep in range(repeats):
            names = list(arms)
            for arm in names[rep % len(names):] + names[:rep % len(names)]:   # rotate: no arm always first
                fn, opener, layout = arms[arm]
                con = opener(d / f"{arm}{rep}.duckdb")
                times.setdefault(arm, []).append(_timed(lambda: fn(con)))
                if layout:
                    assert con.execute("SELECT count(*) FROM sketches").fetchone()[0] == n
                con.close()
            checked = validate("sketches", df)
            times.setdefault("validate", []).append(_timed(lambda: validate("sketches", df)))
            times.setdefault("arrow_convert", []).append(
                _timed(lambda: pa.Table.from_pandas(df, preserve_index=False)))
            times.setdefault("to_lists", []).append(_timed(lambda: storage.sketch_stats_arrow(checked)))
        slow = df.astype({c: object for c, t in dtypes("sketches").items() if t == TEXT})
        con = _list_file(d / "python_str.duckdb")
        times["ours_python_str"] = [_timed(lambda: write_frames(con, {"sketches": slow}))]
        con.close()
        rb = _tidy_file(d / "rows.duckdb")
        cols = columns("sketches")
        few = list(slow.head(row_by_row).itertuples(index=False, name=None))
        sql = (f"INSERT INTO sketches ({', '.join(chr(34) + c + chr(34) for c in cols)}) "
               f"VALUES ({', '.join('?' * len(cols))})")
        times["row_by_row"] = [_timed(lambda: rb.executemany(sql, few))]
        rb.close()
        times["parquet"] = [_timed(lambda: pq.write_table(arrow, d / "rows.parquet"))]
    best = {k: min(v) for k, v in times.items()}
    rows_per_s = {k: n / v for k, v in best.items()}
    rows_per_s["row_by_row"] = len(few) / best["row_by_row"]
    return {
        "rows": n, "repeats": repeats, "times_s": times, "best_s": best,
        "median_s": {k: statistics.median(v) for k, v in times.items()}, "rows_per_s": rows_per_s,
        "ours_vs_raw": best["raw_ctas"] / best["ours"], "ours_vs_tidy": best["tidy"] / best["ours"],
        "row_by_row_measured_rows": len(few), "row_by_row_extrapolated_s": n / rows_per_s["row_by_row"],
    }


def run(rows: int = 2_000_000, repeats: int = 3, row_by_row: int = 3000, minilm: bool = True) -> dict:
    """Record, compare the layouts, measure ingest; the whole result (see the module docstring)."""
    t = time.perf_counter()
    recordings = {"digits_mlp": record_digits()}
    if minilm:
        recordings["minilm"] = record_minilm()
    record_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        layouts = [storage_compare(name, df, tmp, rows) for name, df in recordings.items()]
        src = recordings["minilm" if minilm else "digits_mlp"]
        frame = copies(src, max(1, round(rows / len(src))))
        ingest = measure_ingest(frame, repeats, row_by_row, tmp)
        ingest["source"] = "minilm" if minilm else "digits_mlp"
    return {"record_s": record_s, "layouts": layouts, "ingest": ingest}


def _print(r: dict) -> None:
    print("sketch storage per audited step: before = tidy table (one row per value), after = sketch_stats "
          "(one row per tensor and statistic, lists) + the sketches view")
    hdr = (f"  {'recording':11s} {'steps':>5s} {'rows/step before':>17s} {'after':>8s} {'factor':>7s}   "
           f"{'bytes/step before':>17s} {'after':>10s} {'factor':>7s}   {'queries s before':>16s} {'after':>6s}")
    print(hdr)
    for x in r["layouts"]:
        b, a = x["before"], x["after"]
        print(f"  {x['workload']:11s} {x['steps']:>5d} {b['rows_per_step']:>17,.0f} {a['rows_per_step']:>8,.0f} "
              f"{x['rows_factor']:>6.1f}x   {b['bytes_per_step']:>17,.0f} {a['bytes_per_step']:>10,.0f} "
              f"{x['bytes_factor']:>6.1f}x   {b['query_s']:>16.3f} {a['query_s']:>6.3f}")
    for x in r["layouts"]:
        qs = ", ".join(f"{q} ({n} rows)" for q, n in x["queries"].items())
        print(f"  {x['workload']}: {x['tidy_rows']:,} tidy rows recorded; bytes over {x['copies'] + 1} copies "
              f"(file growth after CHECKPOINT); same results on both layouts: {qs}; rows differing "
              f"(EXCEPT ALL both ways): {x['differing_rows']}")
    g = r["ingest"]
    n, b, rate = g["rows"], g["best_s"], g["rows_per_s"]
    print(f"\ningest of {n:,} tidy sketch rows ({g['source']} recording copied; tidy rows/s; best of "
          f"{g['repeats']} interleaved repeats, this machine may be shared)")
    lines = [
        ("ours (pandera + per-tensor lists + INSERT, one transaction)", "ours"),
        ("  of which: pandera validation alone", "validate"),
        ("  of which: conversion to per-tensor lists alone", "to_lists"),
        ("before: pandera + Arrow + INSERT into the tidy table", "tidy"),
        ("  of which: conversion to Arrow alone", "arrow_convert"),
        ("INSERT of the tidy Arrow table only (no validation)", "insert_only"),
        ("DuckDB raw CREATE TABLE AS from the tidy Arrow table", "raw_ctas"),
    ]
    for label, k in lines:
        print(f"  {label:62s} {rate[k]:>12,.0f} rows/s  best {b[k]:6.2f} s  median {g['median_s'][k]:6.2f} s")
    print(f"  {'ours, text columns as Python str (converted per cell)':62s} {rate['ours_python_str']:>12,.0f} rows/s  "
          f"{b['ours_python_str']:6.2f} s (once)")
    print(f"  {'row-by-row executemany INSERT (tidy table)':62s} {rate['row_by_row']:>12,.0f} rows/s  measured on "
          f"{g['row_by_row_measured_rows']:,} rows only ({b['row_by_row']:.2f} s); extrapolated to {n:,} rows: "
          f"{g['row_by_row_extrapolated_s'] / 3600:.1f} h")
    print(f"  {'Parquet write (pyarrow)':62s} {rate['parquet']:>12,.0f} rows/s")
    print(f"  ours / raw tidy CTAS = {g['ours_vs_raw']:.2f}; ours / before = {g['ours_vs_tidy']:.2f} "
          f"(from the best times)")
    print(f"(recording took {r['record_s']:.1f} s, not counted)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="tidy rows for the ingest arms and the bytes copies")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the interleaved arms")
    ap.add_argument("--row-by-row", type=int, default=3000, help="rows inserted one by one (then extrapolated)")
    ap.add_argument("--no-minilm", action="store_true", help="digits_mlp only (no MiniLM recording)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.rows, a.repeats, a.row_by_row, minilm=not a.no_minilm)
    if a.json:
        print(json.dumps(r, indent=2, default=float))
        return 0
    _print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
