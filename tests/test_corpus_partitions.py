"""One bad scenario never blocks another: each corpus scenario is judged in its own partition.

A temporary ``GOBLIN_WORKLOADS`` holds a good scenario (a copy of a shipped
one) and a recording of a failed run (``ok: false``).  Through Dagster, the
good partition materializes through its report; the failed recording's
partition is audited as the failure it records (its profile_run observes the
verdict and the failure report, the stages that need a run are skipped, the
run succeeds); the corpus summary on ``kb_rules`` names the failed scenario
(its tuning rules cannot be judged on a failed run) without raising or
blocking anything.
Without a ``synthetic/`` folder the summary passes.
"""
from __future__ import annotations

import json
import shutil

import dagster as dg
import duckdb
import pytest

from goblin_assets.audit.corpus import corpus_recall, judge_scenario, recording_problem
from goblin_assets.defs.audit import AUDIT_ASSETS
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.kb.rules import load_kb
from goblin_assets.runners.replay import RECORDING_NAME
from tests.conftest import WORKLOADS, dagster_resources

GOOD, BAD = "synthetic/good_scenario", "synthetic/failed_recording"


def _corpus(root):
    """``root/synthetic`` with a good scenario and a failed recording (copies of shipped scenarios)."""
    shutil.copytree(WORKLOADS / "synthetic" / "no_loader_workers", root / GOOD)
    shutil.copytree(WORKLOADS / "synthetic" / "fp32_on_mi300x", root / BAD)
    rec = json.loads((root / BAD / RECORDING_NAME).read_text())
    rec.update(ok=False, failure="the script exited with code 1 (CUDA out of memory)")
    (root / BAD / RECORDING_NAME).write_text(json.dumps(rec))
    return root


def test_a_failed_recording_fails_alone_in_the_corpus_verdicts(tmp_path):
    root = _corpus(tmp_path)
    assert "a recording of a failed run (ok: false)" in recording_problem(root / BAD)
    assert recording_problem(root / GOOD) is None
    kb = load_kb()
    bad = judge_scenario(root / BAD, kb)
    assert not bad["passed"] and "CUDA out of memory" in bad["error"] and bad["error"].startswith("ScenarioError")
    res = corpus_recall(kb, root / "synthetic")
    assert res["scenarios"] == 2 and res["per_scenario"]["good_scenario"]["passed"]
    assert list(res["failed"]) == ["failed_recording"] and "ok: false" in res["failed"]["failed_recording"]
    (root / GOOD / "expected_findings.yaml").write_text("must_fire: not-a-list\n")
    assert "non-empty must_fire list" in judge_scenario(root / GOOD, kb)["error"]
    assert corpus_recall(kb, tmp_path / "nowhere") == {"scenarios": 0, "expected": 0, "hits": 0, "recall": None,
                                                       "per_scenario": {}, "failed": {}}


def _checks(res) -> dict[str, bool]:
    return {e.check_name: e.passed for e in res.get_asset_check_evaluations()}


@pytest.fixture
def corpus_instance(tmp_path, monkeypatch):
    root = _corpus(tmp_path / "workloads")
    monkeypatch.setenv("GOBLIN_WORKLOADS", str(root))
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, [GOOD, BAD])
    return root, instance, dagster_resources(tmp_path / "wh.duckdb")


def test_the_good_partition_materializes_and_the_failed_recording_is_audited_as_its_failure(corpus_instance):
    _, instance, resources = corpus_instance
    assets = [*AUDIT_ASSETS]
    top = dg.materialize(assets, selection=["kb_rules", "kb_index"], instance=instance, resources=resources)
    assert top.success                                   # the summary fails (WARN) without blocking kb_index
    summary = next(e for e in top.get_asset_check_evaluations() if e.check_name == "kb_corpus_recall")
    assert not summary.passed and summary.severity == dg.AssetCheckSeverity.WARN
    assert list(summary.metadata["failed"].value) == ["failed_recording"]
    assert top.asset_materializations_for_node("kb_index")
    partitioned = [k for a in AUDIT_ASSETS if a.partitions_def is not None for k in a.keys]
    good = dg.materialize(assets, selection=partitioned, partition_key=GOOD, instance=instance, resources=resources)
    assert good.success
    assert _checks(good)["scenario_recording"] and _checks(good)["scenario_expected_findings"]
    assert good.asset_materializations_for_node("audit_report")
    bad = dg.materialize(assets, selection=partitioned, partition_key=BAD, instance=instance, resources=resources,
                         raise_on_error=False)
    assert bad.success                           # a recording of a failed run is audited as that failure (exit 0)
    assert _checks(bad)["scenario_recording"]
    ev = next(e for e in bad.get_asset_check_evaluations() if e.check_name == "scenario_recording")
    assert ev.metadata["reason"].value == "a recording of a failed run: audited as the failure it records"
    mats = {m.asset_key.to_user_string(): m for e in bad.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
            for m in [e.event_specific_data.materialization]}
    assert "profile_run" not in mats                     # no run to hand on: the stages that need one are skipped
    obs = [e.event_specific_data.asset_observation for e in bad.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    meta = next(o.metadata for o in obs if o.asset_key == dg.AssetKey("profile_run"))
    assert meta["verdict_status"].value == "failed" and meta["failure_class"].value == "out_of_memory"
    assert "memory.out_of_memory_failure" in meta["fired_rules"].value
    assert "## Diagnosis" in meta["report"].value and "CUDA out of memory" in meta["report"].value
    # the report is the audit's result: audit_report is materialized for the partition, with the same verdict
    assert set(mats) == {"workload_source", "training_config", "audit_report"}
    rep = mats["audit_report"].metadata
    assert rep["verdict_status"].value == "failed" and rep["report"].value == meta["report"].value
    assert instance.get_latest_materialization_event(dg.AssetKey("audit_report"))
    with duckdb.connect(resources["warehouse"].duckdb.database, read_only=True) as con:
        fail = con.execute("SELECT failure_class, stage, fired_rules, hung FROM run_failures").fetchall()
        audits = con.execute("SELECT verdict, healthy, patch_offered, measured_speedup FROM audits "
                             "WHERE workload = 'failed_recording'").fetchall()
    assert len(fail) == 1 and fail[0][0] == "out_of_memory" and fail[0][1] == "profile_run" and not fail[0][3]
    assert "memory.out_of_memory_failure" in fail[0][2].split(",")
    assert audits == [("failed", False, False, None)]


def test_a_scenario_that_misses_its_rules_fails_its_own_kb_matches_check(corpus_instance):
    root, instance, resources = corpus_instance
    spec = (root / GOOD / "expected_findings.yaml").read_text()
    (root / GOOD / "expected_findings.yaml").write_text(spec.replace("must_fire:", "must_fire:\n  - no.such_rule", 1))
    assets = [*AUDIT_ASSETS]
    assert dg.materialize(assets, selection=["kb_rules", "kb_index"], instance=instance, resources=resources).success
    keys = ["workload_source", "training_config", "profile_run", "waste_budget", "tensor_sketches", "mined_patterns",
            "kb_matches"]
    res = dg.materialize(assets, selection=keys, partition_key=GOOD, instance=instance, resources=resources,
                         raise_on_error=False)
    ev = next(e for e in res.get_asset_check_evaluations() if e.check_name == "scenario_expected_findings")
    assert not ev.passed and ev.metadata["missing"].value == ["no.such_rule"]
    assert "must fire but did not: no.such_rule" in ev.metadata["reason"].value


def test_the_summary_passes_without_a_corpus_folder(tmp_path, monkeypatch):
    (tmp_path / "workloads").mkdir()
    monkeypatch.setenv("GOBLIN_WORKLOADS", str(tmp_path / "workloads"))
    res = dg.materialize([*AUDIT_ASSETS], selection=["kb_rules"],
                         instance=dg.DagsterInstance.ephemeral(), resources=dagster_resources(tmp_path / "wh.duckdb"))
    summary = next(e for e in res.get_asset_check_evaluations() if e.check_name == "kb_corpus_recall")
    assert res.success and summary.passed and summary.metadata["scenarios"].value == 0
