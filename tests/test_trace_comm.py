"""``goblin trace`` raises an exposed-communication finding when collectives are a large share of the step.

Fixtures: /work/shared/traces (see its README.md): the MI300X ResNet training trace (rank 0 of 8, RCCL) from
AMD-AGI/TraceLens@171dd747 and the MI250 toy training loop (one device, no collectives) from
facebookresearch/HolisticTraceAnalysis@f4d0062c, MIT license, copyright Meta Platforms, Inc. and affiliates;
Advanced Micro Devices, Inc.  The expected share is computed here from the raw JSON events.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from goblin_assets.kb.rules import load_kb
from goblin_assets.runners.trace import StepIntervals, TraceSummary
from goblin_assets.trace.analysis import analyze_trace, trace_frames
from goblin_assets.trace.comm import KB_RULE, comm_findings

TRACES = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "traces", Path("/work/shared/traces"))
               if p.is_dir()), None)
needs_traces = pytest.mark.skipif(TRACES is None, reason="the recorded GPU traces (../shared/traces) are not here")


def _union(iv: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(iv):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _exposed_share_from_raw(path: Path) -> float:
    """100 x sum over ProfilerStep windows of |collective ∪ other| - |other|, over the windows' summed length."""
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    exposed = 0.0
    for lo, hi in steps:
        clip = [(max(e["ts"], lo), min(e["ts"] + e["dur"], hi), e["name"].startswith("nccl")) for e in device
                if e["ts"] < hi and e["ts"] + e["dur"] > lo]
        other = [(a, b) for a, b, coll in clip if not coll]
        exposed += _union([(a, b) for a, b, _ in clip]) - _union(other)
    return 100.0 * exposed / sum(hi - lo for lo, hi in steps)


@needs_traces
def test_mi300x_training_trace_raises_exposed_communication(goblin_home):
    path = TRACES / "mi300x_resnet_act_checkpoint_train.json.gz"
    rep = analyze_trace(path)
    [f] = [f for f in rep.findings if f.kind == "exposed_communication"]
    assert f.analysis == "comm" and f.status == "measured" and f.unit == "% of step"
    assert f.value == pytest.approx(_exposed_share_from_raw(path), rel=1e-6)
    assert f.severity == "high" and f.value >= 30  # 65.8 % of the step
    assert "tb_plugin" in f.threshold_source and f.threshold == "comm_exposed_pct"
    # the same share the waste budget's comm_excess bucket holds, which the KB rule reads
    m = rep.metrics
    assert f.value == pytest.approx(100 * m.waste_budget["comm_excess"].seconds / m.step_time_s, rel=1e-9)
    assert f.evidence["exposed_us_per_step"] == pytest.approx(m.waste_budget["comm_excess"].seconds * 1e6)
    assert f.evidence["kb_rule"] == KB_RULE and KB_RULE in {r.id for r in load_kb().rules}
    assert f.message.startswith(f"exposed communication: {f.value:.1f}% of the step (10.49 ms of a 15.95 ms median "
                                "step) is collective kernel time")
    rows = trace_frames(rep, with_run=False)["trace_findings"]
    assert (rows["kind"] == "exposed_communication").sum() == 1


@needs_traces
def test_single_device_trace_without_collectives_raises_none():
    rep = analyze_trace(TRACES / "mi250_minitoy_train_rocm6.2.json.gz")
    assert not [f for f in rep.findings if f.analysis == "comm"]


@pytest.mark.parametrize("exposed_us, severity", [(50.0, "ok"), (150.0, "moderate"), (400.0, "high")])
def test_exposed_share_is_graded_by_the_cited_thresholds(exposed_us, severity):
    steps = [StepIntervals(index=i, start_us=1000.0 * i, end_us=1000.0 * (i + 1), device_busy_us=900.0,
                           collective_us=500.0, comm_exposed_us=exposed_us,
                           category_us={"collective": 500.0, "gemm": 400.0}) for i in range(3)]
    [f] = comm_findings(TraceSummary(steps=steps, has_device=True, collectives=3, others=30))
    assert (f.value, f.severity) == (pytest.approx(exposed_us / 10), severity)
    assert f.evidence["overlapped_pct"] == pytest.approx(100 * (500 - exposed_us) / 500)
    assert comm_findings(TraceSummary(steps=steps, has_device=True, collectives=0, others=30)) == []
