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
