"""The replay runner: a recorded RunMetrics comes back labelled as replayed, never as measured."""
from __future__ import annotations

import json

import pytest

from goblin_assets.contracts import KernelShare, RunMetrics, RunProvenance, WasteBucket
from goblin_assets.runners.base import Runner, RunnerError
from goblin_assets.runners.factory import make_runner
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.replay import RECORDING_NAME, ReplayError, ReplayRunner, load_recording, record_metrics
from goblin_assets.runners.workload import load_workload


def _recorded(kind: str = "measured", workload: str = "wl") -> RunMetrics:
    return RunMetrics(
        workload=workload, steps=10, step_time_s=0.182, step_times_s=[0.18, 0.182, 0.19], unit="tokens",
        tokens_per_sec=45_000.0, padding_share=0.31, mfu_pct=21.5, mem_peak_gb=61.2, util_pct=88.0,
        top_kernels=[KernelShare(name="Cijk_Alik_Bljk_BBS_BH_MT256x256x64", pct_time=41.0)],
        attention_kernel_loaded=True,
        waste_budget={"useful": WasteBucket(seconds=0.16, status="measured"),
                      "host_gap": WasteBucket(seconds=0.022, status="measured")},
        provenance=RunProvenance(kind=kind, device="AMD Instinct MI300X", profiler="rocprofv3",
                                 source="/runs/2026-11-02-wl-profile", measured_at="2026-11-02T10:00:00+0000",
                                 hip_version="6.4.1"),
    )


@pytest.fixture
def workload(tmp_path):
    root = tmp_path / "wl"
    root.mkdir()
    (root / "train.py").write_text("print('never run by a replay')\n")
    (root / "workload.yaml").write_text("entry: train.py\nunit: tokens\nbatch_field: input_ids\n")
    return load_workload(root)


def test_profile_replays_the_recording_labelled(workload):
    rec = record_metrics(_recorded(), workload.root)
    assert rec.name == RECORDING_NAME
    raw = ReplayRunner().run(workload, "profile", steps=10)
    assert raw.ok and raw.result is None  # nothing ran: no harness result, the RunMetrics travels typed
    m = raw.metrics
    assert m.provenance.kind == "replayed"
    assert m.provenance.source.startswith(str(rec.resolve()))
    assert "recorded as measured on AMD Instinct MI300X with rocprofv3 at 2026-11-02" in m.provenance.source
    assert "/runs/2026-11-02-wl-profile" in m.provenance.source
    assert any("not measured by this run" in w for w in m.warnings)
    # the numbers are the recording's, unchanged
    assert (m.step_time_s, m.tokens_per_sec, m.mfu_pct) == (0.182, 45_000.0, 21.5)
    assert m.waste_budget["useful"].seconds == 0.16
    assert m.provenance.device == "AMD Instinct MI300X" and m.provenance.hip_version == "6.4.1"
    # nothing ran: the entry script's output is absent and no run folder was made
    assert raw.run_dir == workload.root


def test_modelled_recording_stays_modelled(workload):
    record_metrics(_recorded(kind="modelled"), workload.root)
    m = ReplayRunner().metrics(workload)
    assert m.provenance.kind == "modelled"
    assert m.provenance.kind != "measured"


def test_a_replayed_recording_is_never_relabelled_measured(workload):
    """Replaying a replay keeps it replayed (no laundering through a second file)."""
    record_metrics(_recorded(), workload.root)
    again = record_metrics(ReplayRunner().metrics(workload), workload.root)
    m = ReplayRunner(recording=again).metrics(workload)
    assert m.provenance.kind == "replayed"
    assert "recorded as replayed" in m.provenance.source


def test_other_workload_recording_warns(workload):
    record_metrics(_recorded(workload="digits_mlp"), workload.root)
    m = ReplayRunner().metrics(workload)
    assert m.workload == "wl"
    assert any("recording is of workload 'digits_mlp'" in w for w in m.warnings)


def test_benchmark_and_patched_script_are_not_replayed(workload, tmp_path):
    record_metrics(_recorded(), workload.root)
    r = ReplayRunner()
    raw = r.run(workload, "benchmark", steps=20)
    assert not raw.ok and "only replays profile runs" in raw.failure
    patched = tmp_path / "patched_train.py"
    patched.write_text("")
    raw = r.run(workload, "profile", steps=10, script=patched)
    assert not raw.ok and "patched_train.py" in raw.failure
    failed = raw.metrics
    assert not failed.ok and failed.failure == raw.failure
    assert failed.provenance.kind == "replayed" and failed.workload == "wl" and failed.unit == "tokens"


def test_missing_and_invalid_recordings_name_the_file(workload):
    raw = ReplayRunner().run(workload, "profile", steps=10)
    assert not raw.ok and str(workload.root / RECORDING_NAME) in raw.failure
    p = workload.root / RECORDING_NAME
    p.write_text("{not json")
    with pytest.raises(ReplayError, match="not a JSON file"):
        load_recording(p)
    p.write_text(json.dumps({"steps": "many"}))
    with pytest.raises(ReplayError, match=r"cached_metrics\.json: field 'steps'"):
        load_recording(p)
    assert "field 'steps'" in ReplayRunner().run(workload, "profile", steps=10).failure


def test_explicit_recording_path(workload, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    rec = record_metrics(_recorded(), other)
    runner = make_runner("replay", recording=rec, device="cpu", timeout_s=5, mem_cap_gb=1)
    assert runner.recording_for(workload) == rec
    assert runner.run(workload, "profile", steps=1).metrics.tokens_per_sec == 45_000.0


def test_make_runner_kinds_and_settings():
    assert isinstance(make_runner("local", device="cpu", timeout_s=5), LocalRunner)
    assert isinstance(make_runner("replay"), ReplayRunner)
    for r in (make_runner("local"), make_runner("replay")):
        assert isinstance(r, Runner)
    with pytest.raises(RunnerError, match="runner kind 'nvprof': unknown"):
        make_runner("nvprof")
    with pytest.raises(RunnerError, match="unknown setting.*image_tagg"):
        make_runner("local", image_tagg="rocm/pytorch:latest")


def test_a_measured_run_carries_no_finished_metrics(tmp_path):
    from goblin_assets.runners.result import RawRun

    assert RawRun(ok=True, run_dir=tmp_path, mode="profile").metrics is None


def test_profile_run_returns_the_replay_as_is(workload):
    """profile_run short-circuits on RawRun.metrics: a replay never reaches the trace readers."""
    from goblin_assets.measure.profile import profile_run

    record_metrics(_recorded(), workload.root)
    m = profile_run(workload, ReplayRunner(), steps=10)
    assert m.provenance.kind == "replayed" and m.step_time_s == 0.182 and m.trace_path is None
    failed = profile_run(workload, ReplayRunner(recording=workload.root / "absent.json"), steps=10)
    assert not failed.ok and "absent.json" in failed.failure and failed.provenance.kind == "replayed"


def test_a_replay_folder_is_replayed_whatever_the_runner():
    """A scenario of the synthetic corpus (cached_metrics.json, no workload.yaml) never runs its config file."""
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.runners.factory import runner_for
    from tests.conftest import WORKLOADS

    wl = load_workload(WORKLOADS / "synthetic" / "fp32_on_mi300x")
    assert wl.replay and wl.entry == "config.yml" and wl.unit == "tokens"
    r = runner_for(wl, LocalRunner(device="cpu", timeout_s=7))
    assert isinstance(r, ReplayRunner) and r.recording == wl.root / RECORDING_NAME and r.timeout_s == 7
    local = LocalRunner()
    assert runner_for(load_workload(WORKLOADS / "digits_mlp"), local) is local
    lines = []
    m = AuditSession.open(wl, runner=LocalRunner(), log=lines.append).profile_run()
    assert m.provenance.kind == "modelled" and m.step_time_s == 14.7
    assert lines[0].startswith("profile: fp32_on_mi300x") and "(replay runner)" in lines[0]
    assert "done in" in lines[1] and "(modelled)" in lines[1]


def test_a_folder_with_neither_file_names_both(tmp_path):
    from goblin_assets.errors import WorkloadError

    with pytest.raises(WorkloadError, match="workload.yaml: missing .*or cached_metrics.json to replay"):
        load_workload(tmp_path)
    (tmp_path / RECORDING_NAME).write_text("{}")
    with pytest.raises(WorkloadError, match="expected_findings.yaml: field 'config'"):
        load_workload(tmp_path)


def test_a_workload_pickled_before_the_replay_fields_still_loads(workload):
    """Dagster keeps materialized Workloads pickled: an older one, re-read by a re-run stage, is a runnable one."""
    state = workload.__getstate__()
    old = {k: v for k, v in state["__dict__"].items() if k not in ("recording", "environment")}
    wl = type(workload).__new__(type(workload))
    wl.__setstate__({**state, "__dict__": old})
    assert wl == workload and not wl.replay and wl.recorded_environment() is None
