"""A recording of a failed run is audited like a live failure: exit 0, a report whose diagnosis names its class.

Every ``cached_metrics.json`` with ``ok: false`` in the project's corpora (``workloads/`` and ``tests/data/``) is
found and audited through ``goblin audit FOLDER --json``; the failure's own lines are the evidence the rules
match on.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from goblin_assets.cli import main
from goblin_assets.measure.failure import FAILURE_SIGNALS, diagnose_failure
from goblin_assets.runners.workload import RECORDING_NAME
from goblin_assets.warehouse.db import query

REPO = Path(__file__).resolve().parents[1]


def failed_recordings() -> list[Path]:
    """Folders of every recording of a failed run in the corpora."""
    out = []
    for base in (REPO / "workloads", REPO / "tests" / "data"):
        for rec in sorted(base.rglob(RECORDING_NAME)):
            if json.loads(rec.read_text(encoding="utf-8")).get("ok") is False:
                out.append(rec.parent)
    return out


FAILED = failed_recordings()


def test_the_corpora_hold_failed_recordings_of_each_class():
    classes = {yaml.safe_load((f / "expected_findings.yaml").read_text())["failure_class"] for f in FAILED}
    assert {"out_of_memory", "invalid_device_function", "hang", "library_error"} <= classes


@pytest.mark.parametrize("folder", FAILED, ids=[f.name for f in FAILED])
def test_a_failed_recording_ends_in_a_report_that_names_its_class(folder, goblin_home, capsys):
    spec = yaml.safe_load((folder / "expected_findings.yaml").read_text()) if (
        folder / "expected_findings.yaml").is_file() else {}
    assert main(["audit", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    v, diag = doc["verdict"], doc["failure_diagnosis"]
    assert v["status"] == "failed" and not v["healthy"] and not v["patch_offered"]
    assert diag["failure_class"] not in ("unknown", "exit_status")
    if "failure_class" in spec:
        assert diag["failure_class"] == spec["failure_class"]
    if "device_oom_kind" in spec:
        assert diag["device_oom"]["kind"] == spec["device_oom_kind"]
        assert f"(`{spec['device_oom_kind']}`)" in Path(doc["report_path"]).read_text(encoding="utf-8")
    assert f"({diag['label']})" in v["headline"]
    assert set(spec.get("must_fire", [])) <= set(doc["fired_rules"])
    assert not set(spec.get("must_not_fire", [])) & set(doc["fired_rules"])
    report = Path(doc["report_path"]).read_text(encoding="utf-8")
    assert "## Diagnosis" in report and f"class `{diag['failure_class']}`" in report
    # the failure is in the warehouse too: its run_failures row and the audit's row with its verdict
    row = query("SELECT f.failure_class, f.fired_rules, a.verdict, a.measured_speedup FROM run_failures f "
                "JOIN audits a USING (audit_id) WHERE audit_id = ?", params=[doc["audit_id"]])
    assert row.shape[0] == 1 and row.failure_class[0] == diag["failure_class"]
    assert row.verdict[0] == "failed" and pd.isna(row.measured_speedup[0])
    assert set(filter(None, row.fired_rules[0].split(","))) == set(doc["fired_rules"])
    for rid in spec.get("must_fire", []):
        assert f"**{rid}**" in report


def test_each_class_is_named_from_its_own_words():
    cases = {
        "train.py: exited with code 1: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes":
            "out_of_memory",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device": "invalid_device_function",
        "train.py: timed out after 90 s (wall-clock limit)": "hang",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, ncclSystemError": 
            "collective_error",
        "x.py: exited with code 1: ValueError: expected sequence of length 128 at dim 1 (got 97)": "library_error",
        "x.py: killed by SIGKILL": "killed",
        "x.py: exited with code 3": "exit_status",
        "train.py: ran out of memory in forward at step 2: an allocation of 1.0 GiB failed": "out_of_memory",
        "": "unknown",
    }
    for text, cls in cases.items():
        assert diagnose_failure(text).failure_class == cls, text
    assert {c for c, _, _ in FAILURE_SIGNALS} <= set(cases.values())
    d = diagnose_failure("x.py: exited with code 1: ValueError: bad shape")
    assert (d.exit_status, d.evidence) == (1, "ValueError: bad shape")


def test_a_trace_whose_run_left_an_elastic_error_file_is_audited_as_that_failure(goblin_home, tmp_path, capsys):
    """A recorded trace with TorchElastic's error file beside it (the JSON ``@record`` writes to
    TORCHELASTIC_ERROR_FILE): the failure is the evidence, the trace gives the steps reached."""
    import shutil

    trace = tmp_path / "mi250.json.gz"
    shutil.copy(REPO.parent / "shared" / "traces" / "mi250_minitoy_train_rocm6.2.json.gz", trace)
    stack = ('Traceback (most recent call last):\n  File "train.py", line 40, in main\n    loss.backward()\n'
             "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.")
    (tmp_path / "error.json").write_text(json.dumps({"message": {
        "message": "OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.",
        "extraInfo": {"py_callstack": stack, "timestamp": "1733150000"}, "errorCode": 1}}))
    assert main(["audit", "--trace", str(trace), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    diag = doc["failure_diagnosis"]
    assert doc["verdict"]["status"] == "failed" and diag["failure_class"] == "out_of_memory"
    assert "TorchElastic error file error.json, exit code 1" in doc["failure"]
    assert diag["last_step"] and "memory.out_of_memory_failure" in doc["fired_rules"]
    report = Path(doc["report_path"]).read_text(encoding="utf-8")
    assert f"{diag['last_step']} steps completed" in report and "loss.backward()" in report
    from goblin_assets.runners.replay import load_recording
    from goblin_assets.trace.workload import trace_workload

    (tmp_path / "error.json").unlink()  # the same trace without it: the recording of a run that succeeded
    wl, _ = trace_workload(trace)
    assert load_recording(wl.root / RECORDING_NAME).ok


def test_a_memory_snapshot_beside_a_failed_recording_joins_its_report(goblin_home, tmp_path, capsys):
    """The failure report reads a snapshot in the folder (goblin memory's analysis); a pickle that is not a
    snapshot is not observable (the reason in the JSON) and the audit still ends in its report."""
    import shutil

    folder = tmp_path / "oom"
    shutil.copytree(REPO / "tests" / "data" / "failed_runs" / "lora_vit_6_oom", folder)
    shutil.copy(REPO / "tests" / "data" / "memory_snapshots" / "digits_mlp_oom.pickle", folder / "oom.pickle")
    assert main(["audit", str(folder), "--json"]) == 0
    report = Path(json.loads(capsys.readouterr().out)["report_path"]).read_text(encoding="utf-8")
    assert "## Memory snapshot (oom.pickle)" in report and "a request of 16.0 MiB failed" in report
    assert "generated, not recorded on a device" in report
    (folder / "oom.pickle").write_bytes(b"not a pickle")
    assert main(["audit", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "## Memory snapshot" not in Path(doc["report_path"]).read_text(encoding="utf-8")
    assert doc["failure_diagnosis"]["failure_class"] == "out_of_memory"
    assert "oom.pickle: not a memory snapshot pickle" in doc["not_observable"]["memory_snapshot"]


#: The cheapest failed original: a recording (nothing runs) of a run that ran out of memory.
OOM = REPO / "tests" / "data" / "failed_runs" / "lora_vit_6_oom"


def _check_failure_run(uri: str, run_id: str, audit_id: str, dl: Path) -> None:
    """The MLflow run of OOM's failed original, read back with MLflow's own client: the parsed config as parameters,
    the failure's class and the verdict as tags, its report and the ``--json`` result as artifacts."""
    from mlflow import MlflowClient

    from goblin_assets.contracts import CONFIG_FIELDS

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    params, tags = run.data.params, run.data.tags
    assert run.info.status == "FINISHED" and set(params) == set(CONFIG_FIELDS)
    assert tags["goblin.audit_id"] == audit_id and tags["goblin.workload"] == OOM.name
    assert tags["goblin.failure_class"] == "out_of_memory" and tags["goblin.verdict_status"] == "failed"
    assert tags["goblin.healthy"] == "false" and "memory.out_of_memory_failure" in tags["goblin.rules"].split(",")
    assert tags["goblin.verdict"].startswith("the original program failed as written")
    assert {a.path for a in client.list_artifacts(run_id)} == {"report.md", "result.json"}
    dl.mkdir(parents=True, exist_ok=True)
    result = json.loads(Path(client.download_artifacts(run_id, "result.json", str(dl))).read_text(encoding="utf-8"))
    assert result["audit_id"] == audit_id and result["failure_diagnosis"]["failure_class"] == "out_of_memory"
    assert result["verdict"]["headline"] == tags["goblin.verdict"]
    report = Path(client.download_artifacts(run_id, "report.md", str(dl))).read_text(encoding="utf-8")
    assert "## Diagnosis" in report and "class `out_of_memory`" in report


def test_goblin_audit_logs_a_failed_original_to_mlflow(goblin_home, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["audit", str(OOM), "--json", "--mlflow", uri]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["status"] == "failed" and doc["mlflow_run_id"]
    _check_failure_run(uri, doc["mlflow_run_id"], doc["audit_id"], tmp_path / "dl")


def test_the_dagster_profile_run_logs_a_failed_original_the_same_way(tmp_path, monkeypatch):
    """``$GOBLIN_MLFLOW_TRACKING_URI`` and the Dagster profile_run step on OOM's partition: the step succeeds (the
    failure is the audit's finding), its observation carries the MLflow run id, and the run is goblin audit's."""
    import dagster as dg

    from goblin_assets.definitions import defs
    from goblin_assets.defs.partitions import workloads_partitions
    from tests.conftest import dagster_resources

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GOBLIN_WORKLOADS", str(OOM.parent))
    monkeypatch.setenv("GOBLIN_MLFLOW_TRACKING_URI", uri)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, [OOM.name])
    res = dg.materialize(list(defs.assets), selection=["workload_source", "profile_run"], partition_key=OOM.name,
                         instance=instance, resources=dagster_resources(tmp_path / "wh.duckdb"))
    assert res.success
    (obs,) = res.asset_observations_for_node("profile_run")
    meta = obs.metadata
    assert meta["verdict_status"].value == "failed" and meta["failure_class"].value == "out_of_memory"
    audit_id = Path(meta["report_path"].value).parent.name    # $GOBLIN_HOME/audits/<audit_id>/report.md
    _check_failure_run(uri, meta["mlflow_run_id"].value, audit_id, tmp_path / "dl")
