"""The benchmark's verdict agrees with its pairs, its time budget holds, and a replay from the cache is said.

No real run: a fake runner returns scripted throughputs and advances a fake clock by a known time per run
(measure/benchmark.py, "Planned looks", "The sign test beside it", "The time budget", "Cache").
"""
from __future__ import annotations

import argparse
import math

import pytest

from goblin_assets.measure import benchmark as B
from goblin_assets.runners.workload import load_workload
from tests.conftest import WORKLOADS
from tests.test_benchmark_cache import NoiseRunner, _arms


class ScriptedRunner(NoiseRunner):
    """Each arm's repeats run at the given throughputs, in order (samples/s); each run takes ``run_s[i]``
    fake seconds (cycled)."""

    def __init__(self, speeds: dict[str, list[float]], run_s: list[float]):
        super().__init__({}, sd=0.0)
        self.speeds, self.times, self.starts = {k: list(v) for k, v in speeds.items()}, run_s, []

    def throughput(self, arm: str) -> float:
        return self.speeds[arm].pop(0)

    def run(self, workload, mode, steps, label="", **kw):
        if label.startswith("bench-baseline"):
            self.starts.append(self.clock.t)          # a pair starts with its baseline run
        self.run_s = self.times[(self.calls) % len(self.times)]
        return super().run(workload, mode, steps, label=label, **kw)


@pytest.fixture(scope="module")
def wl():
    return load_workload(WORKLOADS / "digits_mlp")


def _bench(wl, tmp_path, runner, **kw):
    lines: list[str] = []
    res = B.benchmark(wl, runner, _arms(tmp_path, noop=kw.pop("noop", False)), steps=5, log=lines.append,
                      clock=runner.clock, **kw)
    return res, lines


def test_six_of_six_clearly_faster_pairs_read_faster(goblin_home, tmp_path, wl):
    """The report of issue 25 ("6 of 6 pairs faster, yet no significant change") reads faster now."""
    ratios = [1.2, 1.9, 1.1, 1.6, 1.3, 1.5]
    runner = ScriptedRunner({"baseline": [1000.0] * 12, "patched": [1000.0 * r for r in ratios] + [1000.0] * 6},
                            run_s=[4.0])
    res, lines = _bench(wl, tmp_path, runner, repeats=3, budget_s=60.0)
    b = res["baseline"]
    assert len(b.throughputs) == 6 and b.looks == 2 and b.stop_reason.startswith("decided after 6 pairs")
    assert "look 1 at 3 pairs: no significant change" in "\n".join(lines)   # 3 pairs did not decide
    iv = B.bench_interval(res)
    assert iv.verdict == "faster" and iv.low > 1.0 and (iv.pairs_faster, iv.pairs_slower) == (6, 0)
    assert iv.sign_test_p == pytest.approx(2 / 2 ** 6)
    assert B.verdict_line(iv) == (f"faster: {iv.point:.2f}x (95% interval {iv.low:.2f}x–{iv.high:.2f}x; 6 of 6 "
                                  "pairs faster, sign test p=0.03; 6 pairs in 48 s of a 60 s budget)")
    # the confidence sequence used before (look 4 at 99.8 %) straddled 1.0 on these very pairs
    from scipy.stats import t

    logs = [math.log(r) for r in ratios]
    mean, sd = sum(logs) / 6, math.sqrt(sum((x - sum(logs) / 6) ** 2 for x in logs) / 5)
    old = 1 - 0.05 * 6 / (math.pi ** 2 * 4 ** 2)
    assert math.exp(mean - t.ppf(0.5 + old / 2, 5) * sd / math.sqrt(6)) < 1.0


def test_mixed_pairs_read_no_significant_change(goblin_home, tmp_path, wl):
    patched = [1100.0, 900.0, 1050.0, 950.0, 1020.0, 980.0] * 2
    runner = ScriptedRunner({"baseline": [1000.0] * 12, "patched": patched}, run_s=[1.0])
    res, _ = _bench(wl, tmp_path, runner, repeats=3, budget_s=None)
    iv = B.bench_interval(res)
    assert iv.verdict == "no significant change" and iv.low < 1.0 < iv.high and iv.pairs == 12
    assert (iv.pairs_faster, iv.pairs_slower, iv.sign_test_p) == (6, 6, 1.0) and iv.sign_test_direction is None
    assert B.verdict_line(iv).startswith(f"no significant change: {iv.point:.2f}x (95% interval ")
    assert "6 of 12 pairs" in B.verdict_line(iv) and "the last of the planned looks" in res["baseline"].stop_reason


def test_a_sign_test_the_interval_does_not_share_is_said_in_words():
    """One wild pair widens the t interval across 1.0; the sign test still sees 6 of 6 faster, and the line
    says so instead of a flat "no significant change" (the stored verdict stays the interval's)."""
    iv = B.speedup_interval([100.0] * 6, [101.0, 102.0, 500.0, 101.0, 800.0, 103.0])
    assert iv.verdict == "no significant change" and iv.low < 1.0 and iv.sign_test_direction == "faster"
    line = B.verdict_line(iv)
    assert line.startswith("no significant change by the interval, but 6 of 6 pairs faster (sign test p=0.03): ")
    assert "sign test" not in line.split(": ", 1)[1].split("(", 1)[1]      # said once, in the lead
    # ties vote neither way; a pair the other way counts against
    assert B.sign_test([1.0, 1.0, 1.0], [2.0, 1.0, 0.5]) == (1, 1, 1.0)
    assert B.sign_test([1.0] * 7, [2.0] * 7)[2] == pytest.approx(2 / 2 ** 7)
    with pytest.raises(ValueError, match="not pairs"):
        B.sign_test([1.0], [1.0, 2.0])


@pytest.mark.parametrize("budget_s", [35.0, 61.0, 70.0])
def test_the_budget_is_never_overrun_by_more_than_one_pairs_estimate(goblin_home, tmp_path, wl, budget_s):
    """A pair starts only when the mean pair time so far still fits; runs take 1-6 fake seconds each."""
    runner = ScriptedRunner({"baseline": [1000.0] * 12, "patched": [1150.0, 870.0] * 6},
                            run_s=[3.0, 1.0, 6.0, 2.0, 5.0])
    res, _ = _bench(wl, tmp_path, runner, repeats=3, budget_s=budget_s)
    b = res["baseline"]
    n = len(b.throughputs)
    assert 3 <= n < 12 and "no room for another pair" in b.stop_reason
    ends = runner.starts[1:] + [b.elapsed_s]
    durations = [e - s for s, e in zip(runner.starts, ends)]
    for k in range(3, n):                            # every pair past the minimum fitted when it started
        assert runner.starts[k] + sum(durations[:k]) / k <= budget_s
    assert b.elapsed_s + b.elapsed_s / n > budget_s   # and one more would not have
    assert b.elapsed_s <= budget_s + max(durations) - min(durations)
    assert B.bench_interval(res).looks == b.looks <= B.PLANNED_LOOKS


def test_a_minimum_that_does_not_fit_runs_and_says_so(goblin_home, tmp_path, wl):
    runner = ScriptedRunner({"baseline": [1000.0] * 3, "patched": [1010.0, 990.0, 1000.0]}, run_s=[5.0])
    res, _ = _bench(wl, tmp_path, runner, repeats=3, budget_s=25.0)
    b = res["baseline"]
    assert len(b.throughputs) == 3 and b.elapsed_s == 30.0
    assert b.stop_reason == ("undecided after 3 pairs: the minimum of 3 pairs took 30 s, over the time budget of "
                             "25 s")
    assert B.verdict_line(B.bench_interval(res)).endswith("; 3 pairs in 30 s, over the 25 s budget)")


def test_a_replay_is_logged_and_marked_and_no_cache_measures_again(goblin_home, tmp_path, wl):
    runner = NoiseRunner({"baseline": 1000.0, "patched": 1500.0}, run_s=2.0)
    first, _ = _bench(wl, tmp_path, runner, repeats=3, budget_s=60.0)
    assert runner.calls == 6 and not any(r.cache_hit for r in first.values()) and first["baseline"].measured_at
    again, lines = _bench(wl, tmp_path, runner, repeats=3, budget_s=60.0)
    assert runner.calls == 6 and all(r.cache_hit for r in again.values())
    replayed = [ln for ln in lines if "replayed from the cache, not measured now" in ln]
    assert len(replayed) == 2 and first["baseline"].measured_at in replayed[0] and "--no-cache" in replayed[0]
    assert B.bench_interval(again).cache_hit and B.verdict_line(B.bench_interval(again)).endswith(
        "of a 60 s budget, replayed from the cache)")
    fresh, lines = _bench(wl, tmp_path, runner, repeats=3, budget_s=60.0, use_cache=False)
    assert runner.calls == 12 and not any(r.cache_hit for r in fresh.values())
    assert any("cache off: measuring afresh" in ln for ln in lines)
    assert fresh["patched"].throughputs != first["patched"].throughputs
    replaced, _ = _bench(wl, tmp_path, runner, repeats=3, budget_s=60.0)       # the entries were replaced
    assert runner.calls == 12 and replaced["patched"].throughputs == fresh["patched"].throughputs


def test_no_cache_option_and_variable_turn_the_replay_off(monkeypatch):
    from goblin_assets.cli_common import add_settings_options, settings_from_args
    from goblin_assets.settings import AuditSettings

    p = argparse.ArgumentParser()
    add_settings_options(p)
    monkeypatch.delenv("GOBLIN_RUNNER_BENCH_CACHE", raising=False)
    assert settings_from_args(p.parse_args([])).bench_cache is True
    assert settings_from_args(p.parse_args(["--no-cache"])).bench_cache is False
    monkeypatch.setenv("GOBLIN_RUNNER_BENCH_CACHE", "0")
    assert settings_from_args(p.parse_args([])).bench_cache is False
    assert AuditSettings.from_env({"GOBLIN_RUNNER_BENCH_CACHE": "true"}).bench_cache is True


def test_the_runner_resource_reads_the_cache_setting(monkeypatch):
    from goblin_assets.defs.resources import runner_from_env

    monkeypatch.setenv("GOBLIN_RUNNER_KIND", "replay")
    monkeypatch.setenv("GOBLIN_RUNNER_BENCH_CACHE", "false")
    assert runner_from_env().settings().bench_cache is False
