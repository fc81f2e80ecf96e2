"""The mining driver's one definition of "the latest run", its run-id checks and its result (no torch needed)."""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta

import pandas as pd
import pytest

from goblin_assets.opscope.mining import MATMUL_ROLES, Mined, MiningInputError, latest_run, read_sketches, \
    resolve_runs
from goblin_assets.warehouse.db import query as db_query, write
from goblin_assets.warehouse.tables import columns


def _sketch(run_id: str, role: str = "lhs") -> dict:
    return {"run_id": run_id, "workload": "w", "model": "m", "step": 0, "backend": "cpu", "dist": "d", "M": 2,
            "K": 2, "N": 2, "numel": 4, "site": "s", "role": role, "stat": "nnz", "idx": 0, "value": 1.0}


def _run(run_id: str, created_at: datetime) -> dict:
    return {c: None for c in columns("runs")} | {
        "run_id": run_id, "workload": "w", "label": "profile", "created_at": created_at, "ok": True,
        "provenance": "measured", "device": "cpu", "steps": 1, "metrics_json": "{}"}


@pytest.fixture
def query(tmp_path):
    """The CLI's query function on a private warehouse, and a writer for it."""
    db = tmp_path / "w.duckdb"

    def q(sql, params=None):
        return db_query(sql, db, params=params)

    q.write = lambda **frames: write({t: pd.DataFrame(rows)[columns(t)] for t, rows in frames.items()}, db)
    return q


def test_latest_is_the_newest_created_at_then_the_newest_insertion(query):
    now = datetime.now()
    query.write(sketches=[_sketch("old-known"), _sketch("new-known")],
                runs=[_run("new-known", now), _run("old-known", now - timedelta(hours=1))])
    query.write(sketches=[_sketch("old-known")])           # inserted again, later: created_at still decides
    assert latest_run(query, "sketches") == "new-known"
    query.write(sketches=[_sketch("unknown-1"), _sketch("unknown-2")])
    assert latest_run(query, "sketches") == "new-known"      # runs unknown to `runs` come after known ones
    assert latest_run(query, "sketches", "run_id LIKE ?", ["unknown%"]) == "unknown-2"   # then: last inserted
    query.write(sketches=[_sketch("unknown-1")])
    assert latest_run(query, "sketches", "run_id LIKE ?", ["unknown%"]) == "unknown-1"


def test_roles_restrict_the_choice_and_the_check(query):
    query.write(sketches=[_sketch("mm"), _sketch("attn", role="probs")])
    assert resolve_runs(query, "sketches", None, ("probs",)) == (["attn"], "latest")
    assert resolve_runs(query, "sketches", None, MATMUL_ROLES) == (["mm"], "latest")
    assert resolve_runs(query, "sketches", ["mm", "mm"], MATMUL_ROLES) == (["mm"], "given")
    with pytest.raises(MiningInputError, match=r"table sketches: no rows for run_id 'attn' of role lhs/rhs/out"):
        resolve_runs(query, "sketches", "attn", MATMUL_ROLES)
    ids, source, rows = read_sketches(query, ["mm", "attn"], ())
    assert (ids, source, sorted(rows["run_id"])) == (["mm", "attn"], "given", ["attn", "mm"])


def test_empty_warehouse_names_the_table_and_how_to_record(query):
    with pytest.raises(MiningInputError, match=r"table sketches: no recorded rows .*goblin opscope sweep"):
        resolve_runs(query, "sketches", None, MATMUL_ROLES)
    with pytest.raises(MiningInputError, match="no run ids given"):
        resolve_runs(query, "sketches", [], MATMUL_ROLES)


def test_findings_json_is_the_cli_contract():
    pat = pd.DataFrame([{"run_id": "r", "workload": "w", "site": "s", "role": "lhs", "finding": "sparse_gemm",
                         "score": 0.5, "evidence_json": '{"density": 0.2}'}], columns=columns("patterns"))
    m = Mined("mine", ["r"], pat, {"patterns": pat})
    assert m.findings_json() == [{"run_id": "r", "site": "s", "role": "lhs", "finding": "sparse_gemm", "score": 0.5,
                                  "evidence": {"density": 0.2}}]
    assert m.title == "mine: r"


def test_the_driver_imports_neither_torch_nor_the_warehouse():
    code = ("import sys, goblin_assets.opscope.mining; "
            "print(sorted(m for m in ('torch', 'duckdb', 'dagster') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
