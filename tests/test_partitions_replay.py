"""The synthetic corpus as partitions: each scenario's audit runs through the replay runner.

Nothing runs (no child process, no torch): the profile is the scenario's
recording, labelled replayed or modelled; the sketch and benchmark stages say
they are not observable instead of failing or inventing numbers; rules are
checked in the scenario's recorded environment; the report says what the
numbers are.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import dagster as dg
import pytest

from goblin_assets.audit.corpus import scenarios
from goblin_assets.cli import main
from goblin_assets.defs.agent import AGENT_ASSETS
from goblin_assets.defs.audit import AUDIT_ASSETS
from goblin_assets.defs.checks import read_back
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.defs.resources import LocalRunnerResource
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.replay import ReplayRunner, not_observable
from goblin_assets.runners.workload import list_workloads, load_workload
from goblin_assets.redact import redact
from goblin_assets.warehouse.db import query
from tests.conftest import WORKLOADS, dagster_resources

MODELLED, MEASURED = "synthetic/fp32_on_mi300x", "synthetic/no_loader_workers"


def test_scenario_folders_load_as_replay_workloads():
    folders = [p for p in list_workloads(WORKLOADS) if p.parent.name == "synthetic"]
    assert len(folders) == 10
    for f in folders:
        wl = load_workload(f)
        assert wl.replay and wl.config_file.is_file() and wl.recorded_environment()["cores"]
    runnable = load_workload(WORKLOADS / "digits_mlp")
    assert not runnable.replay and runnable.recorded_environment() is None


def test_runner_is_chosen_per_workload():
    res = LocalRunnerResource()
    assert isinstance(res.get_runner(load_workload(WORKLOADS / MODELLED)), ReplayRunner)
    assert isinstance(res.get_runner(load_workload(WORKLOADS / "digits_mlp")), LocalRunner)


def test_not_observable_names_the_recording_and_its_label():
    wl = load_workload(WORKLOADS / MODELLED)
    runner = ReplayRunner(recording=wl.root / wl.recording)
    assert not_observable(wl, runner, "profile") is None
    reason = not_observable(wl, runner, "benchmark")
    assert reason.startswith("not observable: fp32_on_mi300x is modelled (on AMD Instinct MI300X)")
    assert "cached_metrics.json" in reason
    assert not_observable(wl, LocalRunner(), "benchmark") is None


#: Every shipped scenario, as its partition key.
SCENARIOS = [f"synthetic/{f.name}" for f in scenarios()]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Every scenario audited through Dagster, in one instance and one warehouse."""
    tmp = tmp_path_factory.mktemp("replay")
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp / "home"))
    db = tmp / "wh.duckdb"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, SCENARIOS)
    resources = dagster_resources(db)
    assets = [*AUDIT_ASSETS, *AGENT_ASSETS]
    assert dg.materialize(assets, selection=["kb_rules", "kb_index"], instance=instance, resources=resources).success
    partitioned = [k for a in [*AUDIT_ASSETS, *AGENT_ASSETS] if a.partitions_def is not None for k in a.keys]
    results = {p: dg.materialize(assets, selection=partitioned, partition_key=p, instance=instance,
                                 resources=resources) for p in SCENARIOS}
    yield results, db, instance, resources
    mp.undo()


@pytest.fixture(scope="module")
def cli_replayed(tmp_path_factory):
    """Every scenario audited with ``goblin audit PATH --json --html R.html`` (in process), in its own home."""
    tmp = tmp_path_factory.mktemp("cli_replay")
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp / "home"))
    out = {}
    for part in SCENARIOS:
        html = tmp / f"{part.replace('/', '-')}.html"
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["audit", str(WORKLOADS / part), "--json", "--html", str(html)])
        assert code == 0, part
        out[part] = (json.loads(buf.getvalue()), html)
    yield out, tmp / "home"
    mp.undo()


def test_cli_replays_every_scenario_as_dagster_does(replayed, cli_replayed):
    """Same fired rules, same patch, same report text through ``goblin audit`` and the Dagster partition; nothing runs."""
    results = replayed[0]
    cli, home = cli_replayed
    for part in SCENARIOS:
        res, (doc, html) = results[part], cli[part]
        assert res.success, part
        assert doc["fired_rules"] == _meta(res, "kb_matches")["fired"].value, part
        assert doc["rules"] == _meta(res, "audit_report")["rules"].value, part
        assert doc["diff"] == redact(res.output_for_node("patch").diff), part
        assert Path(doc["report_path"]).read_text(encoding="utf-8") == _meta(res, "audit_report")["report"].value, part
        assert doc["patched"] is None and doc["benchmark"] == {} and doc["measured_speedup"] is None, part
        assert doc["provenance"] in ("replayed", "modelled") and doc["host"]["source"] == "recorded", part
        assert "a replay runs nothing" in doc["not_observable"]["benchmarks"], part
        assert "Measured speedup: not observable" in html.read_text(encoding="utf-8"), part
    assert not (home / "runs").exists()  # no child process was ever started


def _meta(res, asset):
    return res.asset_materializations_for_node(asset)[-1].metadata


@pytest.mark.parametrize("part,label", [(MODELLED, "modelled"), (MEASURED, "replayed")])
def test_replay_partition_audit(replayed, part, label):
    results, db, _, _ = replayed
    res = results[part]
    assert res.success
    checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
    assert checks == {"configs_schema": True, "kernels_schema": True, "waste_budget_schema": True,
                      "sketches_schema": True,
                      "patterns_schema": True, "benchmarks_schema": True, "waste_budget_sums_to_step_time": True,
                      "scenario_recording": True, "scenario_expected_findings": True}
    assert _meta(res, "workload_source")["runs_as"].value == "replay"
    assert _meta(res, "profile_run")["provenance"].value == label
    sk = _meta(res, "tensor_sketches")
    assert sk["status"].value == "not_observable" and "a replay runs nothing" in sk["reason"].value
    bench = [m for m in res.get_asset_materialization_events() if m.asset_key.to_user_string().startswith("benchmark_")]
    assert len(bench) == 2
    for ev in bench:
        md = ev.materialization.metadata
        assert md["status"].value == "not_observable" and "a benchmark needs" in md["reason"].value
    rep = _meta(res, "audit_report")
    assert rep["provenance"].value == label and rep["measured_speedup"].value is None
    assert f"({label}, nothing measured by this run)" in rep["report"].value
    assert "Measured speedup: not observable" in rep["report"].value
    name = part.split("/")[1]
    runs = query(f"SELECT provenance, label FROM runs WHERE workload = '{name}'", db)
    assert runs.to_dict("records") == [{"provenance": label, "label": "profile"}]  # the recording, labelled
    audit = query(f"SELECT measured_speedup, baseline_throughput_per_s, rules FROM audits WHERE workload = '{name}'", db)
    assert audit.measured_speedup.isna().all() and audit.baseline_throughput_per_s.isna().all()
    assert query(f"SELECT count(*) n FROM benchmarks WHERE workload = '{name}'", db).n[0] == 0  # nothing invented
    assert query(f"SELECT count(*) n FROM sketches WHERE workload = '{name}'", db).n[0] == 0
    conv = _meta(res, "audit_conversation")  # the agent has no measured benchmark to discuss: it says so
    assert conv["tool_calls"].value == 6 and "Measured speedup: not observable" in conv["transcript"].value


def test_replay_rules_use_the_recorded_environment(replayed):
    """fp32 on MI300X fires the MI300X bf16 rule: detection read environment.yaml, not this CPU machine."""
    results, db, _, _ = replayed
    fired = set(_meta(results[MODELLED], "kb_matches")["fired"].value)
    assert "precision.bf16_on_mi300x" in fired
    assert "data.loader_workers_with_threads" in set(_meta(results[MEASURED], "kb_matches")["fired"].value)
    rules = query("SELECT rules FROM audits WHERE workload = 'fp32_on_mi300x'", db).rules[0]
    assert "precision.bf16_on_mi300x" in rules
    # every table names the workload alike (the folder's name), so the SQL models join the replay's rows
    assert set(query("SELECT DISTINCT workload FROM kb_matches", db).workload) == {p.split("/")[1] for p in SCENARIOS}


def test_table_check_reads_the_warehouse(replayed):
    """Rows lost after the write: the waste_budget check, run alone, fails and says how many are missing."""
    results, db, instance, resources = replayed
    import duckdb

    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM waste_budget WHERE workload = 'fp32_on_mi300x'")
    ev = read_back(instance, MODELLED, "waste_budget", "waste_budget", resources["warehouse"])
    assert not ev.passed
    assert ev.metadata["rows"].value == 0 and ev.metadata["expected_rows"].value == 6
    kept = read_back(instance, MEASURED, "waste_budget", "waste_budget", resources["warehouse"])
    assert kept.passed and kept.metadata["rows"].value == 6


def test_demo_audits_only_the_runnable_workloads():
    from goblin_assets.demo import default_workloads

    assert default_workloads() == ["digits_mlp", "minilm_lora_cls"]


def test_goblin_chat_on_a_replay_folder_benchmarks_nothing_and_uses_the_recorded_host(goblin_home, capsys,
                                                                                     monkeypatch):
    for var in ("GOBLIN_LLM_BASE_URL", "GOBLIN_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    assert main(["chat", str(WORKLOADS / "synthetic" / "two_gpus_of_eight"), "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    results = {e["name"]: json.loads(e["content"]) for e in events if e["kind"] == "tool_result"}
    assert all(r["ok"] for r in results.values())
    assert results["benchmark"]["status"] == "not_observable" and "a replay runs nothing" in results["benchmark"]["reason"]
    assert results["compare_runs"]["measured_speedup"] is None
    # the rules were checked on the recorded 8-GPU node (LOCAL_WORLD_SIZE=2 of 8 GPUs), not on this 2-core test host
    assert "topology.partial_node_on_mi300x" in {f["rule"] for f in results["query_rocm_kb"]["fired"]}
    assert events[-1]["text"].startswith("Measured speedup: not observable")
    assert not (goblin_home / "runs").exists()
