"""Benchmark cache: sha256 of (config JSON, script hash, image tag, runner code hash)."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

from goblin_assets.measure import benchmark as B
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from tests.conftest import WORKLOADS

CFG = {"batch_size": 64, "dataloader_workers": 0}


def test_key_changes_with_each_of_the_four(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('a')\n")
    base = B.cache_key(CFG, script, steps=10)
    assert B.cache_key(dict(CFG), script, steps=10) == base                       # identical request
    assert B.cache_key({**CFG, "dataloader_workers": 2}, script, steps=10) != base  # config
    monkeypatch.setenv("GOBLIN_ROCM_IMAGE", "rocm/pytorch:other")
    assert B.cache_key(CFG, script, steps=10) != base                             # image tag
    monkeypatch.delenv("GOBLIN_ROCM_IMAGE")
    script.write_text("print('b')\n")
    assert B.cache_key(CFG, script, steps=10) != base                             # script
    script.write_text("print('a')\n")
    monkeypatch.setattr(B, "runner_code_hash", lambda: "0" * 64)
    assert B.cache_key(CFG, script, steps=10) != base                             # runner code
    assert B.cache_key(CFG, script, steps=10, python="/opt/envs/user/bin/python") != \
        B.cache_key(CFG, script, steps=10)                                        # the user's interpreter


class CountingRunner(LocalRunner):
    calls = 0

    def run(self, *a, **kw):
        CountingRunner.calls += 1
        return super().run(*a, **kw)


def test_identical_request_hits_and_changed_script_misses(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = CountingRunner(timeout_s=300)
    arms = {"baseline": {"config": CFG, "script": wl.script}}
    first = B.benchmark(wl, runner, arms, steps=3, repeats=1, log=lambda s: None)["baseline"]
    assert not first.cache_hit and CountingRunner.calls == 1 and first.median > 0
    again = B.benchmark(wl, runner, arms, steps=3, repeats=1, log=lambda s: None)["baseline"]
    assert again.cache_hit and CountingRunner.calls == 1
    assert again.median == first.median and again.cache_key == first.cache_key
    copy = tmp_path / "train.py"
    shutil.copy(wl.script, copy)
    copy.write_text(copy.read_text() + "\n# edited\n")
    changed = B.benchmark(wl, runner, {"baseline": {"config": CFG, "script": copy}}, steps=3, repeats=1,
                          log=lambda s: None)["baseline"]
    assert not changed.cache_hit and CountingRunner.calls == 2


# --------------------------------------------------------------------------- adaptive repeats and the interval

class FakeClock:
    """Seconds that pass only when a fake run says so (``benchmark(clock=...)``)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class NoiseRunner:
    """A runner that runs nothing: each benchmark repeat is 5 steps of 64 samples at ``throughput(arm)``
    samples/s (default ``speed[arm]`` times log-normal noise, seeded), so tests see real BenchmarkResults
    without a child process.  Each run advances ``clock`` (a :class:`FakeClock`) by ``run_s`` seconds."""

    kind = "fake"

    def __init__(self, speed: dict[str, float], sd: float = 0.03, seed: int = 0, run_s: float = 0.0,
                 clock: FakeClock | None = None):
        import random

        self.speed, self.sd, self.rng, self.calls = speed, sd, random.Random(seed), 0
        self.run_s, self.clock = run_s, clock or FakeClock()

    def throughput(self, arm: str) -> float:
        return self.speed[arm] * math.exp(self.rng.gauss(0.0, self.sd))

    def run(self, workload, mode, steps, warmup=2, script=None, env=None, unset_env=None, tap=None, label=""):
        from goblin_assets.runners.result import HarnessResult, RawRun, StepRecord

        self.calls += 1
        self.clock.t += self.run_s
        step = 64 / self.throughput("patched" if label.startswith("bench-patched") else "baseline")
        per = [StepRecord(samples=64, tokens=0, nonpad_tokens=0, data_wait_s=0.0, batches=1, step_time_s=step,
                          t_start_s=i * step, t_end_s=(i + 1) * step) for i in range(steps)]
        res = HarnessResult(reached_budget=True, steps_seen=steps, per_step=per, device="cpu", torch_version="x",
                            num_threads=1, max_rss_gb=0.1)
        return RawRun(ok=True, run_dir=Path("/nonexistent"), mode=mode, result=res)


def _arms(tmp_path, noop: bool = False):
    script = tmp_path / "train.py"
    script.write_text("print('a')\n")
    patched = {**CFG, "dataloader_workers": 0 if noop else 2}
    return {"baseline": {"config": CFG, "script": script}, "patched": {"config": patched, "script": script}}


def test_a_clear_speedup_stops_at_the_minimum_with_an_interval(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = NoiseRunner({"baseline": 1000.0, "patched": 1500.0})
    res = B.benchmark(wl, runner, _arms(tmp_path), steps=5, repeats=3, budget_s=600, log=lambda s: None)
    b, p = res["baseline"], res["patched"]
    assert runner.calls == 6 and len(b.throughputs) == len(p.throughputs) == 3
    assert b.pair_id == p.pair_id and b.looks == 1 and "excludes 1.0" in b.stop_reason
    iv = B.bench_interval(res)
    assert iv.verdict == "faster" and 1.0 < iv.low < 1.5 < iv.high and iv.pairs == 3 and iv.paired


def test_a_noop_patch_adds_pairs_until_the_budget_and_reads_no_significant_change(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = NoiseRunner({"baseline": 1000.0, "patched": 1000.0}, run_s=5.0)   # a pair takes 10 s
    res = B.benchmark(wl, runner, _arms(tmp_path, noop=True), steps=5, repeats=3, budget_s=85.0,
                      log=lambda s: None, clock=runner.clock)
    b = res["baseline"]
    assert len(b.throughputs) == 8 and "time budget of 85 s has no room for another pair" in b.stop_reason
    assert b.looks == 3 and b.elapsed_s == 80.0 and b.budget_s == 85.0  # looks at 3 and 6, and at 8 (the budget's)
    iv = B.bench_interval(res)
    assert iv.verdict == "no significant change" and iv.low < 1.0 < iv.high and iv.looks == b.looks
    assert "no significant change" in iv.headline() and "faster" not in iv.headline()
    assert B.verdict_line(iv).startswith("no significant change: ") and "8 pairs in 80 s of a 85 s budget" in \
        B.verdict_line(iv)
    # the two arms of a no-op patch share a cache key but are two entries: the replay keeps both measurements
    again = B.benchmark(wl, runner, _arms(tmp_path, noop=True), steps=5, repeats=3, budget_s=85.0,
                        log=lambda s: None, clock=runner.clock)
    assert again["patched"].cache_hit and again["patched"].throughputs == res["patched"].throughputs
    assert again["baseline"].cache_key == again["patched"].cache_key
    assert again["baseline"].throughputs != again["patched"].throughputs


def test_adding_pairs_is_bounded_without_a_budget(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = NoiseRunner({"baseline": 1000.0, "patched": 1000.0}, sd=0.2)
    res = B.benchmark(wl, runner, _arms(tmp_path, noop=True), steps=5, repeats=1, budget_s=None, log=lambda s: None)
    assert B.look_schedule(1) == (3, 6, 12) and B.look_schedule(20) == (20, 30) and B.look_schedule(40) == (40,)
    assert len(res["baseline"].throughputs) == 12 and "the last of the planned looks" in res["baseline"].stop_reason
    assert res["baseline"].looks == B.PLANNED_LOOKS


def test_one_repeat_over_the_budget_stops_at_one_pair_and_says_so(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = NoiseRunner({"baseline": 1000.0, "patched": 2000.0}, sd=0.0, run_s=1.0)
    res = B.benchmark(wl, runner, _arms(tmp_path), steps=5, repeats=1, budget_s=1.5, log=lambda s: None,
                      clock=runner.clock)
    assert len(res["baseline"].throughputs) == 1                      # the minimum runs; the budget stops more
    assert "minimum of 1 pairs took 2.0 s, over the time budget of 1.5 s" in res["baseline"].stop_reason
    iv = B.bench_interval(res)
    assert iv.verdict == "no interval" and iv.low is None
    assert B.verdict_line(iv) == ("no interval: 2.00x (an interval needs two pairs; 1 of 1 pair "
                                  "faster, sign test p=1.00; 1 pair in 2.0 s, over the 1.5 s budget)")


def test_cache_replays_only_arms_measured_together(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = NoiseRunner({"baseline": 1000.0, "patched": 1500.0})
    arms = _arms(tmp_path)
    first = B.benchmark(wl, runner, arms, steps=5, repeats=3, budget_s=600, log=lambda s: None)
    assert runner.calls == 6
    again = B.benchmark(wl, runner, arms, steps=5, repeats=2, budget_s=600, log=lambda s: None)
    assert runner.calls == 6 and all(r.cache_hit for r in again.values())  # fewer repeats asked: replayed
    assert again["baseline"].throughputs == first["baseline"].throughputs
    more = B.benchmark(wl, runner, arms, steps=5, repeats=4, budget_s=600, log=lambda s: None)
    assert runner.calls == 14 and not any(r.cache_hit for r in more.values())  # more than cached: measured again
    # a new patch: the cached baseline is not compared with a patched arm measured at another time
    other = {**arms, "patched": {**arms["patched"], "config": {**CFG, "dataloader_workers": 3}}}
    mixed = B.benchmark(wl, runner, other, steps=5, repeats=3, budget_s=600, log=lambda s: None)
    assert not mixed["baseline"].cache_hit and mixed["baseline"].pair_id == mixed["patched"].pair_id


def test_speedup_interval_method_and_errors():
    import pytest

    iv = B.speedup_interval([100.0, 101.0, 99.0], [150.0, 152.0, 149.0])
    assert iv.per_look_level == pytest.approx(1 - 0.05 / 3) and "Student's t" in iv.method and "Bonferroni" in iv.method
    later = B.speedup_interval([100.0, 101.0, 99.0], [150.0, 152.0, 149.0], looks=3)
    assert (later.low, later.high) == (iv.low, iv.high)                   # every planned look at one level
    with pytest.raises(ValueError, match="> 0"):
        B.speedup_interval([100.0, 0.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="planned looks"):
        B.speedup_interval([1.0, 2.0], [1.0, 2.0], looks=0)
    with pytest.raises(ValueError, match="planned looks"):
        B.speedup_interval([1.0, 2.0], [1.0, 2.0], looks=B.PLANNED_LOOKS + 1)
