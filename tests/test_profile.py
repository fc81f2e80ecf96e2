"""profile_run and the waste budget on the real digits workload (real trace, real values)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from goblin_assets.audit.waste import evidence_coverage, shares
from goblin_assets.contracts import WASTE_BUCKETS
from goblin_assets.runners.trace import read_trace


def test_throughput_counts_real_batches(digits_profile):
    m = digits_profile
    assert m.steps == 6
    assert m.samples_per_step == 64  # the script's --batch-size default, counted from the real batches
    assert m.samples_per_sec == pytest.approx(64 / (sum(m.step_times_s) / 6), rel=1e-6)
    assert m.provenance.kind == "measured" and m.provenance.profiler == "torch.profiler"


def test_data_loader_is_the_bottleneck(digits_profile):
    sh = shares(digits_profile.waste_budget)
    assert sh["data_wait"] > 0.30


def test_waste_buckets_add_up_to_step_time(digits_profile):
    m = digits_profile
    assert list(m.waste_budget) == list(WASTE_BUCKETS)
    total = sum(b.seconds for b in m.waste_budget.values())
    assert total == pytest.approx(m.step_time_s, rel=0.05)
    for k in ("useful", "data_wait", "host_gap"):
        assert m.waste_budget[k].status == "measured"
        assert m.waste_budget[k].seconds >= 0
    for k in ("precision_path", "kernel_shape"):
        assert m.waste_budget[k].status == "not_observable" and m.waste_budget[k].note
    assert 0 < evidence_coverage(m.waste_budget) < 1


def test_chrome_trace_is_written_and_readable(digits_profile):
    trace = Path(digits_profile.trace_path)
    doc = json.loads(trace.read_text())
    assert "traceEvents" in doc
    summary = read_trace(trace)
    assert len(summary.steps) == 6
    assert not summary.has_device
    names = {e.get("name", "") for e in doc["traceEvents"]}
    assert any(n.startswith("enumerate(DataLoader)#") for n in names)


def test_top_ops_and_other_fields(digits_profile):
    m = digits_profile
    assert 1 <= len(m.top_kernels) <= 5
    assert all(0 <= k.pct_time <= 100 for k in m.top_kernels)
    assert any(k.name in ("aten::mm", "aten::addmm") for k in m.top_kernels)
    assert m.attention_kernel_loaded is False
    assert m.mem_peak_gb and 0.05 < m.mem_peak_gb < 8
    assert m.mfu_pct is not None and 0 < m.mfu_pct < 100
    assert "tokens_per_sec" in m.not_observable
