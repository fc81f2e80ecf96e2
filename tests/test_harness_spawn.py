"""The harness leaves a program's DataLoader start method working: ``spawn`` and ``forkserver`` workers.

A worker started that way is a fresh interpreter that unpickles its target by name; the harness's hooked
worker loop (runners/stall.py: stack dumps of forked workers) must pickle as torch's own ``_worker_loop``.
Before it did, every such DataLoader stopped with "Can't pickle local object" under the harness while the
program ran fine alone.
"""
from __future__ import annotations

import pytest

from goblin_assets.config.observed import observed_values
from goblin_assets.contracts import CONFIG_FIELDS
from goblin_assets.measure.profile import profile_run
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from tests.conftest import REPO

WORKLOAD = REPO / "tests" / "data" / "spawn_workload"


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_loader_with_fresh_interpreter_workers_runs_and_is_observed(context, tmp_path, monkeypatch):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    wl = load_workload(WORKLOAD).model_copy(update={"args": ["--context", context]})
    m = profile_run(wl, LocalRunner(timeout_s=180), steps=3, warmup=1)
    assert m.ok, m.failure
    assert m.samples_per_step == 32
    obs = {f: v for f, (v, _) in observed_values(m.observed).items()}
    assert set(obs) == set(CONFIG_FIELDS)     # every field observed (issue 27)
    assert (obs["batch_size"], obs["dataloader_workers"]) == (32, 1)


@pytest.mark.slow
def test_a_hung_spawn_worker_is_dumped_with_its_waiting_line(tmp_path, monkeypatch):
    """From item 160 on the spawn worker waits for ever: after 5 steps the stall watch stops the run, and the
    dump holds the worker's stack too (its target imports spawn_hook/goblin_stall_worker.py, which registers
    it), with the line it waits in."""
    from goblin_assets.measure.hang import read_hang_state

    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    wl = load_workload(WORKLOAD).model_copy(update={"args": ["--hang-after", "160"]})
    raw = LocalRunner(device="cpu", timeout_s=90, mem_cap_gb=None, stall_min_s=3.0).run(wl, "profile", steps=10,
                                                                                        warmup=2)
    assert not raw.ok and "hung: no optimizer step finished" in raw.failure, raw.failure
    assert "after step 5 " in raw.failure
    state = read_hang_state(raw.run_dir)
    assert sorted(p.role for p in state.processes) == ["DataLoader worker", "training process"]
    worker = next(p for p in state.processes if p.role == "DataLoader worker")
    assert any(t.user_line == "train.py:25" and t.wait == "lock" for t in worker.threads), worker
    assert "DataLoader worker" in raw.failure and "train.py:25" in raw.failure, raw.failure
