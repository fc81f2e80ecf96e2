"""headroom_batch is bounded: by the dataset's size when the harness reports it, else "memory is not the limit"."""
from __future__ import annotations

import pytest

from goblin_assets.contracts import RunMetrics
from goblin_assets.measure import profile as P
from goblin_assets.runners.result import HarnessResult, StepRecord
from goblin_assets.runners.trace import TraceSummary


def _result(micro: int = 64, dataset: int | None = None) -> HarnessResult:
    per = [StepRecord(samples=micro, tokens=0, nonpad_tokens=0, data_wait_s=0.0, batches=1, step_time_s=0.01,
                      t_start_s=i * 0.01, t_end_s=(i + 1) * 0.01) for i in range(4)]
    r = HarnessResult(reached_budget=True, steps_seen=6, per_step=per, device="cpu", torch_version="x",
                      num_threads=1, max_rss_gb=0.5)
    if dataset is not None:  # the harness's dataset size (a field the harness may report; read with getattr)
        object.__setattr__(r, "dataset_samples", dataset)
    return r


def _summary(act_bytes_per_step: float) -> TraceSummary:
    return TraceSummary(alloc_step_bytes={i: (1e8, 1e8 + act_bytes_per_step) for i in range(4)})


def _headroom(headroom_gb: float, act_bytes: float, micro: int = 64, dataset: int | None = None) -> RunMetrics:
    m = RunMetrics(memory_headroom_gb=headroom_gb)
    P._headroom_batch(m, _result(micro, dataset), _summary(act_bytes))
    return m


def test_a_plausible_estimate_is_printed_with_how_it_was_obtained():
    m = _headroom(1.0, 64e6)                      # 1 MB per sample, 1 GB free: 64 + 1000 samples
    assert m.headroom_batch == 1064 and "headroom_batch" not in m.not_observable
    assert any("is estimated" in w and "linearly" in w for w in m.warnings)


def test_twelve_million_is_never_printed_memory_is_not_the_limit():
    m = _headroom(20.0, 64 * 1.6e3)                # 1.6 kB per sample: about 12.5 million samples
    assert m.headroom_batch is None
    why = m.not_observable["headroom_batch"]
    assert why.startswith("memory is not the limit") and "12,500,064" in why
    assert f"{P.MAX_BATCH_EXTRAPOLATION}x the measured micro-batch of 64" in why and "dataset's size" in why


def test_the_dataset_bounds_it():
    m = _headroom(1.0, 64e6, dataset=500)          # 1064 fit in memory, the data has 500 samples
    assert m.headroom_batch == 500
    assert any("dataset's size: memory is not the limit" in w for w in m.warnings)
    big = _headroom(20.0, 64 * 1.6e3, dataset=1797)  # digits: memory would hold millions, the data 1797
    assert big.headroom_batch == 1797
    huge = _headroom(20.0, 64 * 1.6e3, dataset=10_000_000)  # a dataset past the extrapolation bound
    assert huge.headroom_batch is None and "the dataset has 10000000 samples" in huge.not_observable["headroom_batch"]


@pytest.mark.parametrize("headroom, act", [(None, 64e6), (1.0, 0.0)])
def test_unmeasured_inputs_say_why(headroom, act):
    m = _headroom(headroom, act)
    assert m.headroom_batch is None and m.not_observable["headroom_batch"]
