"""The warehouse: pandera validation first, one transaction, all rows or none."""
from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from goblin_assets.errors import WarehouseError
from goblin_assets.warehouse.db import connect, query, validate, write, write_frames
from goblin_assets.warehouse.tables import TABLES, columns, ddl


def _waste_rows(n=2, share=0.5):
    return pd.DataFrame([{"run_id": "r1", "workload": "w", "label": "profile", "bucket": f"b{i}", "seconds": 0.1,
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


def test_query_error_is_typed(goblin_home):
    with pytest.raises(WarehouseError, match="query failed"):
        query("SELECT * FROM no_such_table")
