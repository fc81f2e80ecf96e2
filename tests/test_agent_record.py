"""``goblin chat`` records its audits in the warehouse, as ``goblin audit`` records its own (agent/record.py).

The offline planner on a replay scenario (nothing runs: seconds): the chat's audit lands in every table
``goblin audit`` writes, row for row as an audit of the same scenario; its what-if of a replay measured
nothing and is not recorded.  A session whose what-if measured a run records that child too, with
only the stages that ran, and recording runs no stage.  The Dagster ``audit_conversation`` asset records
its measured what-ifs the same way (tests/data/tiny_workload: a few one-step runs).
"""
from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
from dagster_duckdb import DuckDBResource

from goblin_assets.agent.record import audits_of, conversation_frames, what_if_frames
from goblin_assets.audit.session import AuditSession
from goblin_assets.cli import main
from goblin_assets.defs.agent import ConversationConfig, audit_conversation
from goblin_assets.defs.resources import LocalRunnerResource, WarehouseResource
from goblin_assets.kb.rules import load_kb
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse.db import query
from goblin_assets.warehouse.tables import TABLES
from tests.conftest import REPO, WORKLOADS, conversation_inputs

SCENARIO = WORKLOADS / "synthetic" / "no_loader_workers"
TINY = REPO / "tests" / "data" / "tiny_workload"


def _rows_per_table(audit_id: str) -> dict[str, int]:
    """Rows of one audit per table (its ``audit_id``, or a run id derived from it); tables without any left out."""
    out = {}
    for t in TABLES:
        cols = set(query(f'SELECT * FROM "{t}" LIMIT 0').columns)
        key = "audit_id" if "audit_id" in cols else "run_id" if "run_id" in cols else None
        if key is None:
            continue
        n = int(query(f'SELECT count(*) AS n FROM "{t}" WHERE {key} = ? OR {key} LIKE ?',
                      params=[audit_id, f"{audit_id}-%"]).n[0])
        if n:
            out[t] = n
    return out


def test_goblin_chat_records_its_audit_as_goblin_audit_does(goblin_home, capsys, monkeypatch):
    monkeypatch.delenv("GOBLIN_LLM_BASE_URL", raising=False)
    assert main(["chat", str(SCENARIO), "-q", "what if I double the batch?", "--json"]) == 0
    out = capsys.readouterr()
    final = [json.loads(line) for line in out.out.splitlines()][-1]
    chat_id = Path(final["report_path"]).parent.name      # $GOBLIN_HOME/audits/<audit_id>/report.md
    assert "What if batch_size = " in final["text"]         # the what-if ran (and was not measured: a replay)
    assert "warehouse:" in out.err and "(1 audit(s))" in out.err
    assert query("SELECT audit_id, workload, report_path FROM audits").values.tolist() == [
        [chat_id, SCENARIO.name, final["report_path"]]]
    assert query("SELECT count(*) AS n FROM runs WHERE run_id LIKE '%whatif%'").n[0] == 0
    # the same scenario through goblin audit: the same tables, the same number of rows in each
    assert main(["audit", str(SCENARIO), "--json"]) == 0
    audit_id = json.loads(capsys.readouterr().out)["audit_id"]
    chat = _rows_per_table(chat_id)
    assert {"configs", "runs", "kernels", "waste_budget", "kb_matches", "audits"} <= set(chat)
    assert chat == _rows_per_table(audit_id)
    # and the SQL models summarising audits read it
    assert chat_id in query("SELECT audit_id FROM audit_lineage").audit_id.tolist()


class _Refuse:
    """A runner that fails the test if anything runs."""

    kind = "local"

    def run(self, *a, **kw):
        raise AssertionError("recording a conversation ran a stage")


def test_a_measured_what_if_is_recorded_with_the_stages_it_ran(tmp_path):
    """digits_mlp with its profiled runs seeded (a replayed RunMetrics stands in): the root and its what-if child
    each record their config and profiled run; stages neither ran (benchmarks, the report) write nothing."""
    measured = AuditSession.open(load_workload(SCENARIO), kb=load_kb(), out_dir=tmp_path / "rec").profile_run()
    root = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), kb=load_kb(), runner=_Refuse(),
                             out_dir=tmp_path / "out", profile_run=measured)
    child = root.what_if({"batch_size": 128})
    assert child is not root and audits_of(root) == [root]   # the child has measured nothing yet
    child.training_config()                    # the what-if's own stages: its config parsed, its run "profiled"
    child.results["profile_run"] = measured
    assert audits_of(root) == [root, child]
    frames = conversation_frames(root)
    assert set(frames) == {"configs", "runs", "kernels", "waste_budget", "observed_settings", "compile_events"}
    assert sorted(frames["runs"].run_id) == sorted([f"{root.audit_id}-profile", f"{child.audit_id}-profile"])
    assert set(frames["configs"].audit_id) == {root.audit_id, child.audit_id}
    assert set(frames["waste_budget"].run_id) == set(frames["runs"].run_id)
    assert "benchmarks" not in root.results and "audit_report" not in child.results   # nothing more ran


def test_the_conversation_asset_records_its_measured_what_if(goblin_home, tmp_path, monkeypatch):
    """The Dagster asset over a finished audit of tiny_workload, asked a what-if: the child it measured is written
    to the warehouse as ``goblin chat`` writes it (:func:`what_if_frames`), the seeded audit is not written again."""
    monkeypatch.delenv("GOBLIN_LLM_BASE_URL", raising=False)
    runner = LocalRunnerResource(warmup_steps=1, profiled_steps=1, sketch_steps=1, bench_steps=2, bench_repeats=1,
                                 bench_budget_s=2, timeout_s=120)
    root = AuditSession.open(load_workload(TINY), settings=runner.settings())
    root.results["kb_matches"] = root.rule_checks()   # the rules checked without retrieval scores: one embedding
    root.run_all()                                    # of the KB (the asset's own session's), not two
    db = tmp_path / "wh.duckdb"
    captured: list[AuditSession] = []
    monkeypatch.setattr("goblin_assets.defs.agent.what_if_frames",
                        lambda s: captured.append(s) or what_if_frames(s))
    out = audit_conversation(dg.build_asset_context(partition_key="tiny_workload"),
                             config=ConversationConfig(question="what if I double the batch?"), runner=runner,
                             warehouse=WarehouseResource(duckdb=DuckDBResource(database=str(db))),
                             **conversation_inputs(root))
    (session,) = captured
    child = session.what_if({"batch_size": 64})
    assert child is not session and audits_of(session) == [session, child]
    assert out.metadata["what_if_audits"].value == [child.audit_id]
    assert "What if batch_size = 64" in out.metadata["transcript"].value
    # read back: the child's config (batch 64) and its profiled run, under the child's audit id only
    cfg = query("SELECT audit_id, value_json FROM configs WHERE field = 'batch_size'", db)
    assert cfg.values.tolist() == [[child.audit_id, "64"]]
    runs = query("SELECT run_id, audit_id FROM runs", db)
    assert f"{child.audit_id}-profile" in runs.run_id.tolist() and set(runs.audit_id) == {child.audit_id}
    assert set(query("SELECT DISTINCT run_id FROM waste_budget", db).run_id) == {f"{child.audit_id}-profile"}
    assert out.metadata["dagster/row_count"].value == sum(len(f) for f in what_if_frames(session).values())
    for t in ("audits", "benchmarks"):     # the seeded audit's report and benchmarks were its own steps' to write
        assert query(f"SELECT count(*) AS n FROM {t}", db).n[0] == 0
