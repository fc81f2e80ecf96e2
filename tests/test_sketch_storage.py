"""Sketches stored as per-tensor lists (sketch_stats), read through the tidy ``sketches`` view: same rows, fewer."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from goblin_assets.errors import WarehouseError
from goblin_assets.warehouse import storage
from goblin_assets.warehouse.db import connect, query, write
from goblin_assets.warehouse.frames import text
from goblin_assets.warehouse.tables import columns, ddl

COLS = columns("sketches")
KEY = ["run_id", "workload", "model", "step", "backend", "dist", "M", "K", "N", "numel", "site", "role"]


def _tidy(parts: list[tuple[dict, str, list[int], list[float]]]) -> pd.DataFrame:
    """Tidy rows from ``(tensor fields, stat, idx, values)`` runs, in the order given (text as Arrow strings)."""
    base = {"run_id": "r1", "workload": "w", "model": "m", "step": 0, "backend": "cpu", "dist": "d", "M": 4, "K": 8,
            "N": 2, "numel": 32, "site": "linear_0", "role": "lhs"}
    rows = [{**base, **t, "stat": s, "idx": i, "value": v} for t, s, idx, vals in parts for i, v in zip(idx, vals)]
    df = pd.DataFrame(rows)[COLS]
    for c in ("run_id", "workload", "model", "backend", "dist", "site", "role", "stat"):
        df[c] = text(df[c].tolist())
    return df


def _mixed() -> pd.DataFrame:
    """Every shape of run the producers emit: scalars, 0..n-1 vectors, sampled idx, NaN/inf, probs, a split run."""
    return _tidy([
        ({}, "min", [0], [-2.0]),
        ({}, "max", [0], [np.inf]),
        ({}, "hist", list(range(32)), list(np.linspace(0, 1, 32))),
        ({}, "chan_maxabs", list(range(8)), [1.0, np.nan, 3.0, -np.inf, 0.0, 2.0, np.nan, 1.5]),
        ({}, "pos_sumsq", [0, 1, 3], [4.0, 5.0, 6.0]),                 # sampled rows: idx not 0..n-1
        ({}, "sample", [0, 10, 21, 31], [0.5, -0.5, np.nan, 0.25]),
        ({}, "nonfinite", [0, 1, 2], [2.0, 1.0, 1.0]),
        ({"role": "rhs", "numel": 16}, "nnz", [0], [16.0]),
        ({"step": 1}, "hist", [3, 1, 2], [7.0, 8.0, 9.0]),            # out of order: kept as written
        ({"step": 1}, "hist", [0, 0], [1.0, 1.0]),                    # same run continued, idx 0 twice: all kept
        ({"role": "probs", "site": "softmax_0", "M": 0, "K": 0, "N": 0}, "key_mass", [0, 1, 2], [1.0, 0.5, 1.5]),
        ({}, "min", [0], [-3.0]),                                     # the same tensor and stat, not adjacent
    ])


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    """Order-insensitive form: text as str, rows sorted on every column (NaN last)."""
    out = df[COLS].astype({c: str for c in ("run_id", "workload", "model", "backend", "dist", "site", "role", "stat")})
    out = out.astype({c: "int64" for c in ("step", "M", "K", "N", "numel", "idx")}).astype({"value": "float64"})
    return out.sort_values(COLS, na_position="last", kind="stable").reset_index(drop=True)


def assert_same_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Same multiset of rows; NaN equals NaN, inf equals inf (assert_frame_equal is NaN-aware)."""
    assert list(got.columns) == COLS
    pd.testing.assert_frame_equal(_sorted(got), _sorted(want), check_exact=True)


def test_round_trip_through_the_view_is_the_tidy_frame(goblin_home):
    df = _mixed()
    assert write({"sketches": df}) == {"sketches": len(df)}
    back = query("SELECT * FROM sketches")
    assert_same_rows(back, df)
    # the view returns the rows in the order they were written, too
    assert back["idx"].tolist() == df["idx"].tolist()
    # NaN is NULL in the view (as the tidy table always stored it), NaN in the stored lists; inf is inf
    assert query("SELECT count(*) - count(value) AS n FROM sketches").n[0] == 3
    stored = query("SELECT idx IS NULL AS implicit, value FROM sketch_stats WHERE stat = 'chan_maxabs'")
    vals = np.asarray(stored.value[0], dtype=float)
    assert np.isnan(vals[[1, 6]]).all() and vals[3] == -np.inf and stored.implicit[0]
    # fewer rows: one per run of adjacent rows of one (tensor, stat); explicit idx only where it is not 0..n-1
    phys = query("SELECT stat, idx IS NULL AS implicit FROM sketch_stats")
    assert len(phys) == 11                                             # 12 runs given, the two step-1 hist adjacent
    assert set(phys[~phys.implicit].stat) == {"pos_sumsq", "sample", "hist"}   # sampled / out of order / doubled
    # a second write appends
    write({"sketches": df.assign(run_id=text("r2", len(df)))})
    assert query("SELECT count(*) AS n FROM sketches").n[0] == 2 * len(df)


def test_the_view_has_the_old_columns_and_types(goblin_home):
    with connect() as con:
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
        assert kinds["sketches"] == "VIEW" and kinds["sketch_stats"] == "BASE TABLE"
        view = [(r[0], r[1]) for r in con.execute('DESCRIBE "sketches"').fetchall()]
        old = duckdb.connect()
        old.execute(ddl("sketches"))
        assert view == [(r[0], r[1]) for r in old.execute('DESCRIBE "sketches"').fetchall()]


def _old_warehouse(path, df: pd.DataFrame, value_not_null: bool = False) -> None:
    """A warehouse file as it was before the list layout: the tidy physical ``sketches`` table with ``df``'s rows."""
    with duckdb.connect(str(path)) as con:
        sql = ddl("sketches")
        con.execute(sql.replace('"value" DOUBLE', '"value" DOUBLE NOT NULL') if value_not_null else sql)
        con.execute(ddl("runs"))
        con.register("old_rows", df.astype({c: object for c in df.columns if df[c].dtype != "float64"
                                            and df[c].dtype.kind not in "iu"}))
        con.execute("INSERT INTO sketches SELECT * FROM old_rows")    # NaN arrives as NULL, as the writer stored it


def test_an_old_tidy_warehouse_is_migrated_in_place_rows_kept(tmp_path):
    df = _mixed()
    db = tmp_path / "old.duckdb"
    _old_warehouse(db, df)
    with duckdb.connect(str(db)) as con:
        before = con.execute("SELECT * FROM sketches").df()
        assert before.value.isna().sum() == 3                          # NULL in the old table is the NaN
    with connect(db) as con:                                           # opening migrates
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
        assert kinds["sketches"] == "VIEW" and kinds["sketch_stats"] == "BASE TABLE"
        assert not any(k.startswith("_sketches") for k in kinds)       # the old table is gone
        assert con.execute("SELECT count(*) FROM sketch_stats").fetchone()[0] < len(df)
        nan = con.execute("SELECT value FROM sketch_stats WHERE stat = 'chan_maxabs'").fetchone()[0]
        assert np.isnan(np.asarray(nan, dtype=float)[[1, 6]]).all()      # stored as NaN now, read back as NULL
    assert_same_rows(query("SELECT * FROM sketches", db), df)
    assert_same_rows(query("SELECT * FROM sketches", db), before)
    with connect(db):                                                  # a second open changes nothing
        pass
    write({"sketches": df.assign(run_id=text("new", len(df)))}, db)    # and the writer appends to it
    assert query("SELECT run_id, count(*) AS n FROM sketches GROUP BY 1 ORDER BY 1", db).n.tolist() == [len(df)] * 2


def test_a_warehouse_from_before_nan_was_nullable_is_migrated_too(tmp_path):
    df = _mixed().dropna(subset=["value"])
    db = tmp_path / "older.duckdb"
    _old_warehouse(db, df, value_not_null=True)
    assert_same_rows(query("SELECT * FROM sketches", db), df)


def test_a_failed_migration_rolls_back_and_keeps_the_old_table(tmp_path, monkeypatch):
    df = _mixed()
    db = tmp_path / "old.duckdb"
    _old_warehouse(db, df)
    # a view that loses the vector rows: the migration's check must catch it and roll everything back
    broken = storage.view_sql("sketches").replace('FROM "sketch_stats"', 'FROM "sketch_stats" WHERE len("value") = 1')
    monkeypatch.setattr(storage, "view_sql", lambda table: broken)
    with pytest.raises(WarehouseError, match="rolled back"):
        with connect(db):
            pass
    with duckdb.connect(str(db)) as con:
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
        assert kinds.get("sketches") == "BASE TABLE" and "sketch_stats" not in kinds
        assert con.execute("SELECT count(*) FROM sketches").fetchone()[0] == len(df)


def test_a_real_recording_has_at_least_5x_fewer_rows_and_the_same_query_results(tmp_path):
    """digits_mlp through the audit's MatmulTap, 3 steps, full sketch set: the tidy table vs the list layout."""
    from tests.test_mining_miner import record_digits

    df, _, _ = record_digits(steps=3)
    db = tmp_path / "w.duckdb"
    write({"sketches": df}, db)
    steps = df.step.nunique()
    with connect(db) as con:
        physical = con.execute("SELECT count(*) FROM sketch_stats").fetchone()[0]
        distinct = f"SELECT DISTINCT {', '.join(KEY)} FROM sketch_stats"
        tensors = con.execute(f"SELECT count(*) FROM ({distinct})").fetchone()[0]
    assert len(df) / steps >= 5 * physical / steps, (len(df), physical)
    assert physical == df.groupby(KEY + ["stat"]).ngroups            # one row per tensor and statistic
    assert tensors == df.groupby(KEY).ngroups == 27                   # 3 sites x 3 roles x 3 steps
    assert_same_rows(query("SELECT * FROM sketches", db), df)
    # the queries the report and the checks run give the tidy table's answers
    tidy = duckdb.connect()
    tidy.execute(ddl("sketches"))
    tidy.register("rows", df)
    tidy.execute("INSERT INTO sketches SELECT * FROM rows")
    for sql in ("SELECT site, role, step, max(abs(value)) AS amax FROM sketches WHERE stat IN ('min', 'max') "
                "GROUP BY ALL ORDER BY ALL",
                "SELECT site, role, avg(value / numel) AS density FROM sketches WHERE stat = 'nnz' GROUP BY ALL "
                "ORDER BY ALL",
                "SELECT site, role, step, sum(value) AS mass FROM sketches WHERE stat = 'hist' GROUP BY ALL "
                "ORDER BY ALL",
                "SELECT stat, count(*) AS n, sum(idx) AS idx_sum FROM sketches GROUP BY ALL ORDER BY ALL"):
        want = tidy.execute(sql).df()
        got = query(sql, db)
        pd.testing.assert_frame_equal(got, want, rtol=1e-12)


def test_conversion_keeps_order_and_marks_implicit_idx():
    df = _mixed()
    from goblin_assets.warehouse.db import validate

    t = storage.sketch_stats_arrow(validate("sketches", df)).to_pandas()
    assert list(t.columns) == COLS
    assert t.value.map(len).sum() == len(df)
    assert t.stat.tolist()[:3] == ["min", "max", "hist"] and t.stat.tolist()[-1] == "min"
    assert t.idx[0] is None and list(t.idx[4]) == [0, 1, 3]


def test_a_sql_model_reading_the_stored_lists_depends_on_the_sketch_writers():
    from goblin_assets.defs.sql import TABLE_PRODUCERS, _deps
    from goblin_assets.warehouse.sql_models import SqlModel

    m = SqlModel("vec", "marts", None, "view", "SELECT list_max(value) FROM sketch_stats", ("sketch_stats",), "")
    assert {k.path[-1] for k in _deps(m, set())} == set(TABLE_PRODUCERS["sketches"])
