"""Warehouse ingest rate of tidy sketch rows: our write path vs DuckDB's raw Arrow path vs row by row.

    .venv/bin/python benchmarks/ingest_rate.py [--rows 2000000] [--row-by-row 3000] [--json]

All in the same run, on the same rows (a frame shaped like a real opscope run:
``sketches`` columns, low-cardinality strings, vector stats with ``idx``):

* ``ours``: :func:`goblin_assets.warehouse.db.write_frames` (pandera
  validation, then Arrow, then ``INSERT ... SELECT`` in one transaction), with
  its two parts also timed on their own;
* ``raw_ctas``: ``CREATE TABLE ... AS SELECT * FROM arrow_table`` from the
  same Arrow table, built beforehand (DuckDB's fastest path, no validation);
* ``row_by_row``: ``executemany`` INSERT of the first ``--row-by-row`` rows
  only (it runs at a few hundred rows/s), rate extrapolated to all rows: said so
  in the output;
* ``parquet``: pyarrow ``write_table`` of the same Arrow table;
* ``candidate``: the same validation with the VARCHAR columns declared as
  Arrow strings (``pd.ArrowDtype(pa.string())``) instead of Python ``str``,
  then the same INSERT: what the write path would cost if
  ``goblin_assets.warehouse.tables`` made that change (pandera checks an
  object column's type element by element, ~8 M Python calls per million
  rows; Arrow strings are checked per column and convert to Arrow for free),
  once from the driver's object-string rows and once from rows that already
  hold Arrow strings.

Each DuckDB measurement uses a fresh database file in a temporary folder.
Source of the reference numbers: ``../shared/measured_facts.md`` (1.9 M rows/s
raw, 290 rows/s row by row, measured while planning).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pandera.pandas as pandera
import pyarrow as pa
import pyarrow.parquet as pq

from goblin_assets.opscope.record import SKETCH_COLUMNS
from goblin_assets.warehouse.db import connect, validate, write_frames
from goblin_assets.warehouse.tables import TABLES, columns, ddl, schema


def sketch_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` tidy sketch rows shaped like a MiniLM run (55 sites, 3 roles, 13 stats, vector idx).

    Shapes: ``(n, 15)`` with the columns of the ``sketches`` table.
    """
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    sites = np.array([f"encoder.layer.{k // 9}.attention.self.{'qkv'[k % 3]}" for k in range(55)], dtype=object)
    stats = np.array(["min", "max", "mean", "l1", "sumsq", "nnz", "kurtosis", "chan_outlier", "hist",
                      "chan_maxabs", "pos_sumsq", "adj_sumsq", "sample"], dtype=object)
    return pd.DataFrame({
        "run_id": "bench-run", "workload": "minilm", "model": "sentence-transformers/all-MiniLM-L6-v2",
        "step": i // 200_000, "backend": "cpu", "dist": "stdlib-docstrings",
        "M": 4096, "K": 384, "N": 1536, "numel": 4096 * 384,
        "site": sites[(i // 2000) % 55], "role": np.array(["lhs", "rhs", "out"], dtype=object)[(i // 700) % 3],
        "stat": stats[(i // 384) % 13], "idx": i % 384, "value": rng.standard_normal(n),
    })[SKETCH_COLUMNS]


def arrow_string_schema(table: str = "sketches") -> pandera.DataFrameSchema:
    """The table's pandera schema with VARCHAR columns as Arrow strings (the measured candidate)."""
    base = schema(table)
    cols = {name: pandera.Column(pd.ArrowDtype(pa.string()) if typ == "VARCHAR" else base.columns[name].dtype,
                                 nullable=nullable, checks=base.columns[name].checks, coerce=True)
            for name, typ, nullable in TABLES[table]}
    return pandera.DataFrameSchema(cols, strict=True, ordered=True, name=table)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure_ingest(n: int = 2_000_000, row_by_row: int = 3000) -> dict:
    """Rows/s of each path on the same ``n`` rows (see the module docstring).

    Returns
    -------
    dict
        ``rows``, seconds and rows/s per path, ``ours_vs_raw`` (ratio of rates),
        and ``row_by_row_measured_rows`` (the rows actually inserted one by one).
        Units: seconds, rows per second.  Source: measured.
    """
    df = sketch_frame(n)
    out: dict = {"rows": n}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with connect(tmp / "ours.duckdb") as con:
            out["ours_s"] = _timed(lambda: write_frames(con, {"sketches": df}))
            assert con.execute("SELECT count(*) FROM sketches").fetchone()[0] == n
        out["ours_validate_s"] = _timed(lambda: validate("sketches", df))
        t = time.perf_counter()
        arrow = pa.Table.from_pandas(df, preserve_index=False)
        out["arrow_convert_s"] = time.perf_counter() - t
        with connect(tmp / "insert_only.duckdb") as con:
            def insert():
                con.execute("BEGIN TRANSACTION")
                con.register("_a", arrow)
                con.execute(f"INSERT INTO sketches SELECT * FROM _a")
                con.execute("COMMIT")
            out["ours_insert_only_s"] = _timed(insert)
        raw = duckdb.connect(str(tmp / "raw.duckdb"))
        raw.register("arrow_table", arrow)
        out["raw_ctas_s"] = _timed(lambda: raw.execute("CREATE TABLE raw AS SELECT * FROM arrow_table"))
        raw.close()
        rb = duckdb.connect(str(tmp / "rows.duckdb"))
        rb.execute(ddl("sketches"))
        cols = columns("sketches")
        few = list(df.head(row_by_row).itertuples(index=False, name=None))
        sql = f"INSERT INTO sketches ({', '.join(chr(34) + c + chr(34) for c in cols)}) VALUES ({', '.join('?' * len(cols))})"
        out["row_by_row_measured_rows"] = len(few)
        out["row_by_row_s_measured"] = _timed(lambda: rb.executemany(sql, few))
        rb.close()
        out["parquet_s"] = _timed(lambda: pq.write_table(arrow, tmp / "rows.parquet"))
        cand = arrow_string_schema()
        with connect(tmp / "candidate.duckdb") as con:
            def candidate():
                checked = cand.validate(df, lazy=True)
                con.execute("BEGIN TRANSACTION")
                con.register("_c", pa.Table.from_pandas(checked, preserve_index=False))
                con.execute("INSERT INTO sketches SELECT * FROM _c")
                con.execute("COMMIT")
            out["candidate_s"] = _timed(candidate)
        df_arrow = cand.validate(df)          # the rows as a driver would hand them over: Arrow strings already
        with connect(tmp / "candidate2.duckdb") as con:
            def candidate_native():
                checked = cand.validate(df_arrow, lazy=True)
                con.execute("BEGIN TRANSACTION")
                con.register("_c", pa.Table.from_pandas(checked, preserve_index=False))
                con.execute("INSERT INTO sketches SELECT * FROM _c")
                con.execute("COMMIT")
            out["candidate_native_s"] = _timed(candidate_native)
    rate = lambda s, k=n: k / s if s > 0 else float("inf")  # noqa: E731
    out["ours_rows_per_s"] = rate(out["ours_s"])
    out["ours_insert_only_rows_per_s"] = rate(out["ours_insert_only_s"])
    out["raw_ctas_rows_per_s"] = rate(out["raw_ctas_s"])
    out["row_by_row_rows_per_s"] = rate(out["row_by_row_s_measured"], out["row_by_row_measured_rows"])
    out["row_by_row_extrapolated_s"] = n / out["row_by_row_rows_per_s"]
    out["parquet_rows_per_s"] = rate(out["parquet_s"])
    out["candidate_rows_per_s"] = rate(out["candidate_s"])
    out["candidate_native_rows_per_s"] = rate(out["candidate_native_s"])
    out["candidate_native_vs_raw"] = out["candidate_native_rows_per_s"] / rate(out["raw_ctas_s"])
    out["ours_vs_raw"] = out["ours_rows_per_s"] / out["raw_ctas_rows_per_s"]
    out["candidate_vs_raw"] = out["candidate_rows_per_s"] / out["raw_ctas_rows_per_s"]
    out["ours_insert_only_vs_raw"] = out["ours_insert_only_rows_per_s"] / out["raw_ctas_rows_per_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--row-by-row", type=int, default=3000, help="rows inserted one by one (then extrapolated)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure_ingest(a.rows, a.row_by_row)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    n = r["rows"]
    print(f"ingest of {n:,} tidy sketch rows (same rows, same run)")
    print(f"  ours (pandera validate + Arrow + INSERT, one transaction) {r['ours_rows_per_s']:>12,.0f} rows/s "
          f"({r['ours_s']:.2f} s; validation alone {r['ours_validate_s']:.2f} s)")
    print(f"  ours, INSERT from Arrow only (no validation)             {r['ours_insert_only_rows_per_s']:>12,.0f} rows/s "
          f"({r['ours_insert_only_s']:.2f} s; Arrow conversion {r['arrow_convert_s']:.2f} s not included)")
    print(f"  DuckDB raw CREATE TABLE AS from the same Arrow table     {r['raw_ctas_rows_per_s']:>12,.0f} rows/s "
          f"({r['raw_ctas_s']:.2f} s)")
    print(f"  row-by-row executemany INSERT                             {r['row_by_row_rows_per_s']:>12,.0f} rows/s "
          f"(measured on {r['row_by_row_measured_rows']:,} rows only, {r['row_by_row_s_measured']:.2f} s; "
          f"extrapolated to {n:,} rows: {r['row_by_row_extrapolated_s'] / 3600:.1f} h)")
    print(f"  Parquet write (pyarrow)                                  {r['parquet_rows_per_s']:>12,.0f} rows/s")
    print(f"  candidate: same checks, VARCHAR as Arrow strings, + INSERT {r['candidate_rows_per_s']:>12,.0f} rows/s "
          f"({r['candidate_s']:.2f} s, incl. converting the object strings once)")
    print(f"  candidate, rows already holding Arrow strings              {r['candidate_native_rows_per_s']:>12,.0f} rows/s "
          f"({r['candidate_native_s']:.2f} s)")
    print(f"  ours / raw = {r['ours_vs_raw']:.2f} (target >= 0.90); insert path alone / raw = "
          f"{r['ours_insert_only_vs_raw']:.2f}; candidate / raw = {r['candidate_vs_raw']:.2f}; "
          f"candidate with Arrow-string rows / raw = {r['candidate_native_vs_raw']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
