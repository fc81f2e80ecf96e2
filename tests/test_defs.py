"""The Dagster code location: loads, has the stages with their lineage, materializes digits_mlp."""
from __future__ import annotations

import json

import dagster as dg
import pandas as pd
import pytest

from goblin_assets.audit.corpus import scenarios
from goblin_assets.cli import main
from goblin_assets.definitions import defs
from goblin_assets.defs.partitions import workload_folders_sensor, workload_names, workloads_partitions
from goblin_assets.warehouse.db import connect, query
from goblin_assets.warehouse.sql_models import build_model, load_models
from tests.conftest import WORKLOADS, dagster_resources

STAGES = ["workload_source", "training_config", "profile_run", "waste_budget", "tensor_sketches", "mined_patterns",
          "kb_rules", "kb_index", "kb_matches", "patch", "benchmark_baseline", "benchmark_patched", "audit_report"]


def _graph():
    return defs.resolve_asset_graph()


def test_forkserver_preload_modules_all_import():
    """The forkserver silently skips a preload module that fails to import: a rename would only show as slow steps."""
    import importlib

    from goblin_assets.definitions import FORKSERVER_PRELOAD

    for name in FORKSERVER_PRELOAD:
        importlib.import_module(name)


def test_every_stage_is_an_asset():
    keys = {k.to_user_string() for k in _graph().get_all_asset_keys()}
    assert set(STAGES) <= keys


@pytest.mark.parametrize("child,parents", [
    ("training_config", {"workload_source"}),
    ("profile_run", {"workload_source", "rocm_image"}),
    ("waste_budget", {"profile_run", "workload_source"}),
    ("tensor_sketches", {"workload_source", "profile_run"}),
    ("mined_patterns", {"tensor_sketches", "workload_source"}),
    ("kb_index", {"kb_rules"}),
    # workload_source: a replay's rules are checked in its recorded environment (environment.yaml)
    # tensor_sketches: graded into tensor findings from the upstream rows (the sketch stage runs once)
    ("kb_matches", {"training_config", "profile_run", "waste_budget", "tensor_sketches", "mined_patterns", "kb_rules",
                    "kb_index", "workload_source"}),
    ("patch", {"training_config", "kb_rules", "kb_matches", "profile_run", "workload_source"}),
    ("benchmark_baseline", {"training_config", "workload_source", "rocm_image"}),
    ("benchmark_patched", {"patch", "workload_source", "rocm_image"}),
    ("audit_report", {"profile_run", "benchmark_baseline", "benchmark_patched", "patch", "training_config", "kb_matches",
                      "tensor_sketches", "mined_patterns", "workload_source"}),
])
def test_lineage(child, parents):
    node = _graph().get(dg.AssetKey(child))
    assert {k.to_user_string() for k in node.parent_keys} == parents


def test_sensor_adds_workload_partitions():
    """One partition per workload folder: the 2 runnable ones and each synthetic scenario (replayed)."""
    instance = dg.DagsterInstance.ephemeral()
    res = workload_folders_sensor(dg.build_sensor_context(instance=instance))
    added = [p for r in res.dynamic_partitions_requests for p in getattr(r, "partition_keys", [])]
    synthetic = [f"synthetic/{p.name}" for p in scenarios()]
    assert len(synthetic) == 10
    assert added == sorted(["digits_mlp", "minilm_lora_cls", *synthetic]) == workload_names()


@pytest.mark.slow
def test_materialize_digits_partition_in_process_and_the_cli_agrees(tmp_path, monkeypatch, capsys, plain_host):
    """digits_mlp through Dagster, then through ``goblin audit``: same config rows, fired rules and patch.

    The benchmark cache key's runner-code hash is pinned: someone editing goblin_assets/runners meanwhile
    would (rightly) make the second audit miss the cache.
    """
    from goblin_assets.measure import benchmark as benchmark_module

    monkeypatch.setattr(benchmark_module, "runner_code_hash", lambda h=benchmark_module.runner_code_hash(): h)
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    db = tmp_path / "wh.duckdb"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, ["digits_mlp"])
    resources = dagster_resources(db, profiled_steps=3, bench_steps=8, bench_repeats=1, sketch_steps=2)
    assets = list(defs.assets)
    assert dg.materialize(assets, selection=["kb_rules", "kb_index"], instance=instance, resources=resources).success
    graph = _graph()
    partitioned = [k for k in graph.get_all_asset_keys()    # the audit's stages (recorded traces: tests/test_trace_cli.py)
                   if graph.get(k).partitions_def == workloads_partitions and graph.get(k).is_materializable]
    res = dg.materialize(assets, selection=partitioned, partition_key="digits_mlp", instance=instance,
                         resources=resources)
    assert res.success
    checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
    assert checks == {
        "configs_schema": True, "kernels_schema": True, "waste_budget_schema": True, "sketches_schema": True, "patterns_schema": True,
        "benchmarks_schema": True, "waste_budget_sums_to_step_time": True,
        "scenario_recording": True, "scenario_expected_findings": True}   # not a scenario: nothing to judge
    meta = res.asset_materializations_for_node("audit_report")[-1].metadata
    dg_fired = res.asset_materializations_for_node("kb_matches")[-1].metadata["fired"].value
    if dg_fired:  # the loader rule fires on the profiled data-wait share (measured: a loaded machine moves it)
        assert "Measured speedup" in meta["report"].value and "```diff" in meta["report"].value
        assert meta["measured_speedup"].value > 0 and meta["verdict"].value.startswith("patch measured")
    else:
        assert meta["verdict_status"].value == "no patch"
    assert meta["report"].value.splitlines()[2] == f"**Verdict: {meta['verdict'].value}**"   # the verdict first
    # each stage ran once: the sketches were recorded by tensor_sketches alone, and kb_matches and audit_report
    # graded the upstream rows (the run's own event log: the session logs each recording once)
    logs = [e.user_message for e in instance.all_logs(res.run_id)]
    assert sum("tensor_sketches: tapping forward matmuls" in m for m in logs) == 1, \
        [m for m in logs if "tensor_sketches" in m]
    benchmarked = ("benchmarks",) if dg_fired else ()  # a patch that changes nothing is not benchmarked
    for t in ("configs", "runs", "kernels", "waste_budget", "sketches", "patterns", "kb_matches", *benchmarked,
              "audits"):
        assert query(f"SELECT count(*) n FROM {t}", db).n[0] > 0, t
    # config -> runs -> sketches -> patterns -> kb_matches -> benchmarks is one lineage in SQL
    with connect(db) as con:
        for model in load_models():
            build_model(con, model)
    # the suite's host has no CPU bf16 units: bf16 would save nothing (tests/test_host_kinds.py: the other kind)
    profile = json.loads(query("SELECT metrics_json FROM runs WHERE label = 'profile'", db).metrics_json[0])
    prec = profile["waste_budget"]["precision_path"]
    assert prec["status"] == "estimated" and prec["seconds"] == 0 and "no bf16" in prec["note"]
    row = query("SELECT * FROM audit_lineage", db).iloc[0]
    assert row.config_fields == 15 and row.sketch_rows > 0 and row.patterns > 0 and row.rules_fired == len(dg_fired)
    assert row.sketch_run_id.endswith("-sketch") and row.provenance == "measured"
    # a benchmark's median when a rule fired, none (NULL) when nothing was benchmarked
    assert row.baseline_median_per_s > 0 if dg_fired else pd.isna(row.baseline_median_per_s)

    # the same audit through the CLI (same settings, same GOBLIN_HOME: its benchmark is a cache hit)
    assert main(["audit", str(WORKLOADS / "digits_mlp"), "--steps", "3", "--bench-steps", "8", "--repeats", "1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cli_db = tmp_path / "home" / "warehouse.duckdb"
    config_rows = "SELECT * EXCLUDE (audit_id) FROM configs ORDER BY field"
    assert query(config_rows, cli_db).equals(query(config_rows, db))
    # each front door stores the rules it fired; which rules fire is measured (the loader rule reads the
    # profiled data-wait share, which a loaded machine moves), so the two audits' profiles may differ: the
    # same fired rules must then give the same patch, and the same patch a cache hit
    fired = "SELECT rule_id FROM kb_matches WHERE fired ORDER BY rule_id"
    assert query(fired, cli_db).rule_id.tolist() == sorted(doc["fired_rules"])
    assert query(fired, db).rule_id.tolist() == sorted(dg_fired)
    dg_audit = query("SELECT rules, diff FROM audits", db).iloc[0]
    assert doc["rules"] == [r for r in (dg_audit["rules"] or "").split(",") if r] or sorted(doc["fired_rules"]) != \
        sorted(dg_fired)
    if doc["rules"] == [r for r in (dg_audit["rules"] or "").split(",") if r]:
        assert doc["diff"] == dg_audit["diff"]
        if doc["rules"]:   # no rule applied in either: nothing was benchmarked by either
            assert doc["benchmark"]["baseline"]["cache_hit"] and doc["benchmark"]["patched"]["cache_hit"]
        else:
            assert doc["benchmark"] == {} and doc["measured_speedup"] is None


@pytest.mark.parametrize("lab", [False, True])
def test_the_demo_selection_resolves_as_one_job(lab):
    """``make demo`` materializes its partitioned stages in one run per workload: they must share one
    partitions definition (the recorded traces' own partitions stay out), and every selection must resolve."""
    from goblin_assets.definitions import defs
    from goblin_assets.defs.partitions import workloads_partitions
    from goblin_assets.demo import demo_selection

    graph = defs.resolve_asset_graph()
    before, partitioned, after = demo_selection(graph, lab)
    assert {graph.get(k).partitions_def for k in partitioned} == {workloads_partitions}
    assert dg.AssetKey("audit_report") in partitioned and dg.AssetKey("recorded_trace") not in partitioned
    for i, sel in enumerate((before, partitioned, list(after))):   # resolving a job of mixed partitions raises
        job = dg.define_asset_job(f"demo_{i}", selection=sel)
        dg.Definitions(assets=defs.assets, jobs=[job],
                       resources=defs.resources).resolve_job_def(f"demo_{i}")


def test_audit_workload_job_audits_one_partition(tmp_path, monkeypatch):
    """The UI's one-click audit: the ``audit_workload`` job on one (replayed) partition runs every partitioned stage
    once, the same stages the scaled-out stack materializes, and the audit lands in the warehouse."""
    from goblin_assets.defs.audit import AUDIT_STAGES
    from goblin_assets.stack import AUDIT_SELECTION

    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"   # the audit_report step logs one MLflow run (issue 30)
    monkeypatch.setenv("GOBLIN_MLFLOW_TRACKING_URI", mlflow_uri)
    job = defs.resolve_job_def("audit_workload")
    stages = {k.to_user_string() for a in AUDIT_STAGES for k in a.keys}
    assert stages == set(AUDIT_SELECTION.split(",")) == set(STAGES) - {"kb_rules", "kb_index"}
    assert job.partitions_def == workloads_partitions
    db, part = tmp_path / "wh.duckdb", "synthetic/fp32_on_mi300x"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, [part])
    resources = dagster_resources(db)
    assert dg.materialize(list(defs.assets), selection=["kb_rules", "kb_index"], instance=instance,
                          resources=resources).success
    res = job.execute_in_process(partition_key=part, instance=instance, resources=resources)
    assert res.success
    assert {e.asset_key.to_user_string() for e in res.get_asset_materialization_events()} == stages
    assert query("SELECT workload FROM audits", db).workload.tolist() == ["fp32_on_mi300x"]
    from mlflow import MlflowClient

    run_id = res.asset_materializations_for_node("audit_report")[-1].metadata["mlflow_run_id"].value
    client = MlflowClient(tracking_uri=mlflow_uri)
    run = client.get_run(run_id)
    assert run.data.tags["goblin.workload"] == "fp32_on_mi300x" and run.data.params["precision"]
    assert "measured_speedup" not in run.data.metrics and "waste_useful_ms" in run.data.metrics  # replayed only
    assert "report.md" in {a.path for a in client.list_artifacts(run_id)}
    assert client.get_experiment(run.info.experiment_id).artifact_location == (tmp_path / "mlruns").as_uri()


def test_a_new_workload_folder_becomes_a_partition(tmp_path, monkeypatch):
    """README's "audit a new workload from the UI": a folder copied under $GOBLIN_WORKLOADS is a partition after one
    sensor tick, keyed by its path under that root."""
    import shutil

    instance = dg.DagsterInstance.ephemeral()
    monkeypatch.setenv("GOBLIN_WORKLOADS", str(tmp_path))
    shutil.copytree(WORKLOADS / "synthetic" / "fp32_on_mi300x", tmp_path / "team" / "my_finetune")
    res = workload_folders_sensor(dg.build_sensor_context(instance=instance))
    assert [p for r in res.dynamic_partitions_requests for p in r.partition_keys] == ["team/my_finetune"]
