"""The warehouse: pandera validation first, one transaction, all rows or none."""
from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from goblin_assets.errors import WarehouseError
from goblin_assets.warehouse.db import connect, query, validate, write, write_frames
from goblin_assets.warehouse.tables import TABLES, columns, ddl


def _waste_rows(n=2, share=0.5):
    return pd.DataFrame([{"run_id": "r1", "workload": "w", "label": "profile", "bucket": f"b{i}", "time_per_step_s": 0.1,
                          "share": share, "status": "measured", "note": ""} for i in range(n)])


def test_all_tables_created(goblin_home):
    with connect() as con:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    for t in ("runs", "kernels", "waste_budget", "sketches", "patterns", "kb_matches", "benchmarks"):
        assert t in names
    assert (goblin_home / "warehouse.duckdb").is_file()


def test_invalid_frame_is_rejected_before_writing(goblin_home):
    good = _waste_rows()
    bad = _waste_rows(share=1.7)
    write({"waste_budget": good, "kernels": pd.DataFrame(columns=columns("kernels"))})
    with pytest.raises(WarehouseError, match="waste_budget"):
        write({"kernels": pd.DataFrame([{"run_id": "r2", "rank": 1, "name": "x", "pct_time": 1.0}]),
               "waste_budget": bad})
    assert len(query("SELECT * FROM waste_budget")) == 2  # only the good write landed
    assert len(query("SELECT * FROM kernels")) == 0       # the valid frame of the rejected write did not


def test_failed_insert_rolls_back_every_table(goblin_home):
    with connect() as con:
        con.execute("DROP TABLE kernels")
        con.execute('CREATE TABLE kernels ("run_id" VARCHAR, "rank" BIGINT, "name" VARCHAR, '
                    '"pct_time" DOUBLE CHECK (pct_time < 0))')  # every insert will fail
        kern = pd.DataFrame([{"run_id": "r1", "rank": 1, "name": "aten::mm", "pct_time": 10.0}])
        with pytest.raises(WarehouseError, match="rolled back"):
            write_frames(con, {"waste_budget": _waste_rows(), "kernels": kern})
        assert con.execute("SELECT count(*) FROM waste_budget").fetchone()[0] == 0


def test_schema_and_ddl_agree():
    for t in TABLES:
        con = duckdb.connect()
        con.execute(ddl(t))
        cols = [r[0] for r in con.execute(f'DESCRIBE "{t}"').fetchall()]
        assert cols == columns(t)
        assert list(validate(t, pd.DataFrame(columns=columns(t))).columns) == columns(t)


def test_a_warehouse_from_before_the_unit_suffixes_keeps_its_rows(tmp_path):
    """Columns renamed to carry their unit (seconds -> time_per_step_s, ...) are renamed in place, rows kept."""
    db = tmp_path / "old.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute('CREATE TABLE waste_budget ("run_id" VARCHAR NOT NULL, "workload" VARCHAR NOT NULL, '
                    '"label" VARCHAR NOT NULL, "bucket" VARCHAR NOT NULL, "seconds" DOUBLE NOT NULL, '
                    '"share" DOUBLE NOT NULL, "status" VARCHAR NOT NULL, "note" VARCHAR NOT NULL)')
        con.execute("INSERT INTO waste_budget VALUES ('old', 'w', 'profile', 'useful', 0.25, 1.0, 'measured', '')")
    write({"waste_budget": _waste_rows()}, db)
    got = query("SELECT run_id, time_per_step_s FROM waste_budget ORDER BY run_id", db)
    assert got.to_dict("records") == [{"run_id": "old", "time_per_step_s": 0.25}] + \
        [{"run_id": "r1", "time_per_step_s": 0.1}] * 2


def test_a_warehouse_from_before_the_added_columns_gains_them_and_keeps_its_rows(tmp_path):
    """An audits table without the interval and calibration columns gains them (NULL in its rows), in order."""
    from goblin_assets.warehouse.tables import ADDED_COLUMNS, column_type

    old_cols = [c for c in TABLES["audits"] if ("audits", c[0]) not in ADDED_COLUMNS]
    db = tmp_path / "old.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute('CREATE TABLE audits (' + ", ".join(f'"{n}" {t}{"" if null else " NOT NULL"}'
                                                       for n, t, null in old_cols) + ")")
        con.execute("INSERT INTO audits (audit_id, workload, created_at, profile_run_id, unit, rules, diff, "
                    "measured_speedup) VALUES ('old', 'w', now(), 'p', 'samples', 'r1', '', 1.3)")
    with connect(db) as con:
        assert [r[0] for r in con.execute('DESCRIBE "audits"').fetchall()] == columns("audits")
    got = query("SELECT audit_id, measured_speedup, speedup_low, speedup_verdict, calibration_audits FROM audits", db)
    assert got.audit_id.tolist() == ["old"] and got.measured_speedup.tolist() == [1.3]
    assert got[["speedup_low", "speedup_verdict", "calibration_audits"]].isna().all(axis=None)
    assert all(column_type(t, c)[1] for t, c in ADDED_COLUMNS)          # only nullable columns can be added
    with connect(db) as con:                                              # a second open adds nothing twice
        assert len(con.execute('DESCRIBE "audits"').fetchall()) == len(columns("audits"))


def test_query_error_is_typed(goblin_home):
    with pytest.raises(WarehouseError, match="query failed"):
        query("SELECT * FROM no_such_table")


def _sketch_rows(n=6):
    """Tidy sketch rows as the drivers hand them over: text columns are Arrow strings."""
    import numpy as np

    from goblin_assets.warehouse.frames import text

    df = pd.DataFrame({"step": np.arange(n) // 3, "M": 4, "K": 8, "N": 2, "numel": 32, "idx": np.arange(n) % 3,
                       "value": np.linspace(-1, 1, n)})
    for c, v in (("run_id", "r1"), ("workload", "w"), ("model", "m"), ("backend", "cpu"), ("dist", "d"),
                 ("site", "linear_0"), ("stat", "hist")):
        df[c] = text(v, n)
    df["role"] = text(["lhs", "rhs", "out"], n // 3)
    return df[columns("sketches")]


def test_arrow_string_rows_validate_without_copying_and_python_strings_are_converted():
    import numpy as np

    from goblin_assets.warehouse.tables import TEXT, dtypes

    df = _sketch_rows()
    out = validate("sketches", df)
    assert out.dtypes.to_dict() == dtypes("sketches")
    assert out["site"].array is df["site"].array                   # nothing converted or copied
    assert np.shares_memory(out["value"].to_numpy(), df["value"].to_numpy())
    legacy = df.astype({c: object for c, t in dtypes("sketches").items() if t == TEXT})
    got = validate("sketches", legacy)
    assert got.dtypes.to_dict() == dtypes("sketches")
    assert legacy["site"].dtype == object                          # the caller's frame is left as it was
    pd.testing.assert_frame_equal(got, out)


@pytest.mark.parametrize("breakage", ["bad_role", "null_text", "negative_numel", "text_in_double", "extra_column",
                                      "missing_column", "reordered"])
def test_arrow_string_rows_are_still_checked(breakage):
    import pyarrow as pa

    df = _sketch_rows()
    if breakage == "bad_role":
        df["role"] = pd.arrays.ArrowExtensionArray(pa.array(["lhs", "rhs", "bogus"] * 2))
    elif breakage == "null_text":
        df["site"] = pd.arrays.ArrowExtensionArray(pa.array(["a", None] * 3, pa.string()))
    elif breakage == "negative_numel":
        df["numel"] = -1
    elif breakage == "text_in_double":
        df["value"] = pd.arrays.ArrowExtensionArray(pa.array(["x"] * 6))
    elif breakage == "extra_column":
        df["extra"] = 1
    elif breakage == "missing_column":
        df = df.drop(columns="idx")
    else:
        df = df[list(reversed(df.columns))]
    with pytest.raises(WarehouseError, match="sketches"):
        validate("sketches", df)


def test_text_builds_arrow_strings():
    from goblin_assets.warehouse.frames import text
    from goblin_assets.warehouse.tables import TEXT

    assert list(text("a", 3)) == ["a", "a", "a"] and text("a", 3).dtype == TEXT
    assert list(text(["x", None], [1, 2]).isna()) == [False, True, True]
    assert len(text([], [])) == 0
    with pytest.raises(ValueError, match="counts"):
        text(["a"], [1, 2])
    with pytest.raises(ValueError, match="counts"):
        text(["a"], [-1])


def test_non_finite_sketch_values_are_data(tmp_path):
    """sketches.value: NaN reads as NULL (the schema says the column is nullable), ±inf as itself; the stored
    lists behind the view (sketch_stats) keep the NaN itself."""
    import numpy as np

    from goblin_assets.warehouse.tables import NAN_AS_NULL, column_type, relax_not_null

    df = _sketch_rows()
    df["value"] = [1.0, np.nan, np.inf, -np.inf, 0.0, np.nan]
    db = tmp_path / "w.duckdb"
    assert write({"sketches": df}, db) == {"sketches": 6}
    back = query("SELECT value, value IS NULL AS is_null FROM sketches", db)
    assert back.is_null.tolist() == [False, True, False, False, False, True]
    assert back.value.iloc[2] == np.inf and back.value.iloc[3] == -np.inf
    stored = query("SELECT list_count(list_filter(value, lambda v: isnan(v))) AS nan FROM sketch_stats", db)
    assert stored.nan.sum() == 2
    assert ("sketches", "value") in NAN_AS_NULL and column_type("sketches", "value") == ("DOUBLE", True)
    # a warehouse created while the column was NOT NULL: the constraint is dropped, the rows kept
    old = tmp_path / "old.duckdb"
    with duckdb.connect(str(old)) as con:
        con.execute(ddl("sketches").replace('"value" DOUBLE', '"value" DOUBLE NOT NULL'))
        not_null = {(t, c) for t, c, n in con.execute(
            "SELECT table_name, column_name, is_nullable FROM information_schema.columns").fetchall() if n == "NO"}
        stmts = relax_not_null(not_null)
        assert stmts == ['ALTER TABLE "sketches" ALTER COLUMN "value" DROP NOT NULL']
        for sql in stmts:
            con.execute(sql)
        assert relax_not_null({("sketches", "run_id")}) == []
    assert write({"sketches": df}, old) == {"sketches": 6}


def test_the_audits_verdict_check_allows_every_verdict_kind():
    """An audit's verdict is written to ``audits.verdict``: its schema check must take every kind
    report/verdict.py can give (a hung original's ``hung`` once failed the write)."""
    import typing

    from goblin_assets.report.verdict import Kind
    from goblin_assets.warehouse.tables import _CHECKS

    (check,) = _CHECKS[("audits", "verdict")]
    assert set(check.statistics["allowed_values"]) == set(typing.get_args(Kind))
