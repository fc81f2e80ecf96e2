"""Hung runs: the stall watch stops them, every thread's stack is dumped, the report names the waiting line.

Three real CPU workloads run at once (one module fixture, a thread each): a
loop whose producer thread dies (tests/data/broken/dead_producer), a
DataLoader worker that deadlocks (tests/data/broken/worker_deadlock), and a
barrier nobody else reaches before the first step (stopped by the timeout).
"""
from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from goblin_assets.config.observed import observed_values
from goblin_assets.contracts import CONFIG_FIELDS

from goblin_assets.errors import RunFailed
from goblin_assets.measure.benchmark import _summarise, rate_text
from goblin_assets.measure.hang import hang_signals, read_hang_state
from goblin_assets.measure.profile import failed_metrics
from goblin_assets.report.verdict import audit_verdict
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload

BROKEN = Path(__file__).resolve().parents[1] / "tests" / "data" / "broken"
STALL_MIN_S = 3.0
BARRIER_TIMEOUT_S = 15.0
BARRIER = """\
import threading
import torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = threading.Barrier(2)
start.wait()  # the second party never comes
"""


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    root = tmp_path_factory.mktemp("hangs")
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(root / "home"))
    (root / "barrier.py").write_text(textwrap.dedent(BARRIER))
    jobs = {"dead_producer": (BROKEN / "dead_producer", 60.0), "worker_deadlock": (BROKEN / "worker_deadlock", 60.0),
            "barrier": (root / "barrier.py", BARRIER_TIMEOUT_S)}

    def one(name):
        path, timeout = jobs[name]
        wl = load_workload(path)
        runner = LocalRunner(device="cpu", timeout_s=timeout, mem_cap_gb=None, stall_min_s=STALL_MIN_S)
        return wl, runner.run(wl, "profile", steps=10, warmup=2)

    try:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            yield dict(zip(jobs, pool.map(one, jobs)))
    finally:
        mp.undo()


def test_dead_producer_is_stopped_by_the_stall_watch_with_the_waiting_line(hung):
    _, raw = hung["dead_producer"]
    assert not raw.ok and raw.result is None  # no throughput for a run that hung
    assert raw.failure.startswith("train.py: hung: no optimizer step finished in "), raw.failure
    assert "after step 5 (20 x the median step time of" in raw.failure  # the producer dies after 5 batches
    assert "the main thread waits on a queue at train.py:32 (`x, y = batches.get()`)" in raw.failure
    assert raw.wall_s < 60  # well inside the timeout
    state = read_hang_state(raw.run_dir)
    assert state.stopped_by == "stall" and state.steps_done == 5
    main = state.main_thread()
    assert main.wait == "queue" and main.wait_detail.startswith("queue.py:") and main.wait_detail.endswith(" in get")
    assert all(t.user_line != "train.py:26" for p in state.processes for t in p.threads)  # the producer is gone
    assert hang_signals(state)["hang_queue"] >= 1
    # it hung after its warm-up: the settings it ran with were written then, every field observed
    wl, _ = hung["dead_producer"]
    obs = observed_values(failed_metrics(raw, wl).observed)
    assert set(obs) == set(CONFIG_FIELDS)
    assert obs["batch_size"][0] == 16 and obs["optimizer"][0] == "sgd" and obs["dataloader_workers"][0] == 0


def test_a_deadlocked_loader_worker_is_dumped_too(hung):
    _, raw = hung["worker_deadlock"]
    assert not raw.ok and "hung: no optimizer step finished" in raw.failure
    # 48 items fine, batches of 8: 6 steps, then the worker blocks on its own lock
    assert "after step 6 " in raw.failure
    assert "the main thread waits on the DataLoader's worker queue at train.py:36" in raw.failure
    assert "DataLoader worker" in raw.failure and "waits on a lock at train.py:28 (`self.lock.acquire()" in raw.failure
    state = read_hang_state(raw.run_dir)
    roles = sorted(p.role for p in state.processes)
    assert roles == ["DataLoader worker", "training process"]
    counts = hang_signals(state)
    assert counts["hang_loader_queue"] >= 1 and counts["hang_lock"] >= 1
    wl, _ = hung["worker_deadlock"]
    obs = observed_values(failed_metrics(raw, wl).observed)   # written after the warm-up, before the hang
    assert set(obs) == set(CONFIG_FIELDS)
    assert (obs["batch_size"][0], obs["dataloader_workers"][0]) == (8, 1)


def test_a_wait_before_the_first_step_is_stopped_by_the_timeout_with_its_line(hung):
    _, raw = hung["barrier"]
    assert raw.failure.startswith(f"barrier.py: timed out after {BARRIER_TIMEOUT_S:.0f} s (wall-clock limit) after 0 "
                                  "optimizer steps; the main thread waits on a lock at barrier.py:6 "
                                  "(`start.wait()  # the second party never comes`)"), raw.failure
    assert raw.wall_s < BARRIER_TIMEOUT_S + 10


def test_the_failure_report_says_where_it_waited_and_the_verdict_is_hung(hung, tmp_path, monkeypatch):
    from goblin_assets.audit.session import AuditSession

    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    wl, raw = hung["worker_deadlock"]
    session = AuditSession.open(wl, runner=LocalRunner(device="cpu"), out_dir=tmp_path / "audit")
    path = session._failure_report("profile_run", RunFailed(f"profile_run: {raw.failure}",
                                                            failed_metrics(raw, wl)))
    text = path.read_text()
    assert "## Where it waited" in text and "No throughput is reported for a run that hung" in text
    assert "| DataLoader worker " in text and "train.py:28 `self.lock.acquire()" in text
    assert "`data.loader_worker_hang` (warning)" in text and "https://docs.pytorch.org/docs/stable/data.html" in text
    assert "## How it ran before the failure (observed)" in text and "dataloader_workers `1`" in text
    assert session.results["failure_config"].provenance["batch_size"].kind == "observed"
    v = session.verdict()
    assert v.status == "hung" and not v.healthy and not v.patch_offered
    assert v.headline.startswith("the original program hung as written: `profile_run`: profile_run: train.py: hung:")
    assert "samples/s" not in v.headline


def test_verdict_kind_hung_ranks_with_failed():
    v = audit_verdict(failure="x.py: hung: ...", failure_kind="hung")
    assert (v.status, v.healthy, v.patch_offered) == ("hung", False, False)
    assert audit_verdict(failure="x.py: exited").status == "failed"


def test_a_run_without_counted_samples_formats_and_summarises_without_a_number():
    """The crash of issue 26: a throughput of None formatted as a number (a loop without a DataLoader)."""
    from goblin_assets.contracts import RunMetrics

    assert rate_text(None, "samples").startswith("samples/s not observable")
    assert rate_text(12.345, "samples") == "12.3 samples/s"
    runs = [RunMetrics(workload="w", unit="samples", step_time_s=0.1) for _ in range(2)]
    res = _summarise("baseline", runs, "k", pair_id="p", stop_reason="r", elapsed_s=1.0, budget_s=None, looks=1,
                     measured_at="now")
    assert res.throughputs == [] and res.median == 0.0


def test_a_compile_patch_with_no_significant_change_says_why():
    from goblin_assets.measure.benchmark import speedup_interval

    iv = speedup_interval([10.0, 11.0, 9.0], [10.5, 9.5, 10.0])
    v = audit_verdict(interval=iv, no_change_because="the patched run compiled: 5 graphs, 1 distinct graph break")
    assert v.status == "no significant change"
    assert v.items[-1].text.endswith("; the patched run compiled: 5 graphs, 1 distinct graph break")
