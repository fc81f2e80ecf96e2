"""The one host-facts object and the one settings model: how they are read, set and validated."""
from __future__ import annotations

import json

import dagster as dg
import pytest

from goblin_assets.defs.resources import ReplayRunnerResource, runner_from_env
from goblin_assets.host import HOST_FACTS_ENV, HostError, HostFacts, current_host, host_overrides, reset_host, use_host
from goblin_assets.runners.replay import ReplayRunner
from goblin_assets.settings import AuditSettings, SettingsError
from tests.conftest import TEST_HOST, TEST_HOST_KIND, WORKLOADS


def test_the_suite_runs_on_the_test_host_whatever_the_machine():
    host = current_host()
    assert host.source == "set"
    assert {k: getattr(host, k) for k in TEST_HOST} == TEST_HOST
    assert host.cpu_bf16_matmul is (TEST_HOST_KIND == "bf16")   # GOBLIN_TEST_HOST_KIND decides, not the machine


@pytest.mark.parametrize("amx,avx512,want", [(True, False, True), (False, True, True), (False, False, False),
                                             (None, False, None), (None, True, True)])
def test_bf16_matmul_has_one_definition(amx, avx512, want):
    assert HostFacts(amx_bf16=amx, avx512_bf16=avx512).cpu_bf16_matmul is want
    assert HostFacts(amx_bf16=amx, avx512_bf16=avx512).host_context()["cpu_bf16_matmul"] is want


def test_use_host_sets_the_facts_inside_the_block_only():
    with use_host({"amx_bf16": True, "cores": 96}) as h:
        assert current_host() is h and h.cores == 96 and h.cpu_bf16_matmul and h.source == "set"
        assert h.online_cpus == TEST_HOST["online_cpus"]  # the rest stays
    assert current_host().cores == TEST_HOST["cores"]


def test_overrides_from_json_or_a_file(tmp_path, monkeypatch):
    assert host_overrides('{"cores": 8}') == {"cores": 8}
    f = tmp_path / "host.yaml"
    f.write_text("cores: 16\namx_bf16: true\npackages: {torch: 2.7.1+rocm6.4}\n")
    assert host_overrides(str(f))["packages"] == {"torch": "2.7.1+rocm6.4"}
    with pytest.raises(HostError, match="unknown host fact"):
        host_overrides('{"cpus": 8}')
    with pytest.raises(HostError, match="not a JSON object and not a readable file"):
        host_overrides("/nonexistent/host.yaml")
    # a child process started with GOBLIN_HOST_FACTS sees the same facts (detected once per process)
    monkeypatch.setenv(HOST_FACTS_ENV, str(f))
    reset_host()
    try:
        h = current_host()
        assert h.cores == 16 and h.amx_bf16 and h.package("torch") == "2.7.1+rocm6.4"
    finally:
        monkeypatch.setenv(HOST_FACTS_ENV, json.dumps(TEST_HOST))
        reset_host()
    monkeypatch.setenv(HOST_FACTS_ENV, '{"cores": "many"}')
    reset_host()
    try:
        with pytest.raises(HostError, match=f"{HOST_FACTS_ENV}: field 'cores'"):
            current_host()
    finally:
        monkeypatch.setenv(HOST_FACTS_ENV, json.dumps(TEST_HOST))
        reset_host()


def test_a_recorded_host_answers_only_from_the_recording():
    from goblin_assets.runners.workload import load_workload

    wl = load_workload(WORKLOADS / "synthetic" / "two_gpus_of_eight")
    h = HostFacts.from_recording(wl.recorded_environment())
    assert h.source == "recorded" and h.cores == 24 and h.online_cpus == 192 and h.env["LOCAL_WORLD_SIZE"] == "2"
    assert h.package("torch") == "2.7.1+rocm6.4" and h.package("transformers") == "4.55.0"
    assert h.package("numpy") is None  # never this machine's
    with pytest.raises(HostError, match="field 'cores'"):
        HostFacts.from_recording({"cores": "lots"})


def test_settings_from_the_environment_then_options():
    env = {"GOBLIN_RUNNER_PROFILED_STEPS": "5", "GOBLIN_RUNNER_KIND": "replay", "GOBLIN_RUNNER_MEM_CAP_GB": "none"}
    s = AuditSettings.from_env(env, bench_repeats=2, timeout_s=None)
    assert (s.profiled_steps, s.kind, s.mem_cap_gb, s.bench_repeats, s.timeout_s) == (5, "replay", None, 2, 600.0)
    assert AuditSettings.from_env({}) == AuditSettings()
    with pytest.raises(SettingsError, match="GOBLIN_RUNNER_BENCH_STEPS='0'"):
        AuditSettings.from_env({"GOBLIN_RUNNER_BENCH_STEPS": "0"})
    with pytest.raises(SettingsError, match="GOBLIN_RUNNER_KIND='nvprof'"):
        AuditSettings.from_env({"GOBLIN_RUNNER_KIND": "nvprof"})
    with pytest.raises(SettingsError, match="unknown setting"):
        AuditSettings().with_overrides(steps=3)


def test_runner_resource_from_the_environment(monkeypatch):
    monkeypatch.setenv("GOBLIN_RUNNER_KIND", "replay")
    monkeypatch.setenv("GOBLIN_RUNNER_PROFILED_STEPS", "4")
    monkeypatch.setenv("GOBLIN_RUNNER_TIMEOUT_S", "30")
    res = runner_from_env()
    assert isinstance(res, ReplayRunnerResource)

    @dg.asset
    def probe(runner: ReplayRunnerResource) -> dict:
        return {**runner.settings().model_dump(), "runner": type(runner.get_runner()).__name__}

    got = dg.materialize([probe], resources={"runner": res}).output_for_node("probe")
    assert got["kind"] == "replay" and got["profiled_steps"] == 4 and got["timeout_s"] == 30.0
    assert got["runner"] == ReplayRunner.__name__
    monkeypatch.setenv("GOBLIN_RUNNER_PROFILED_STEPS", "zero")
    with pytest.raises(SettingsError, match="GOBLIN_RUNNER_PROFILED_STEPS"):
        runner_from_env()
