"""profile_run and the waste budget on the real digits workload (real trace, real values)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from goblin_assets.contracts import WASTE_BUCKETS
from goblin_assets.host import use_host
from goblin_assets.measure.profile import profile_run
from goblin_assets.measure.waste import evidence_coverage, shares
from goblin_assets.runners.result import HarnessResult, RawRun
from goblin_assets.runners.trace import read_trace
from goblin_assets.runners.workload import load_workload
from tests.conftest import WORKLOADS


def test_throughput_counts_real_batches(digits_profile):
    m = digits_profile
    assert m.steps == 6
    assert m.samples_per_step == 64  # the script's --batch-size default, counted from the real batches
    assert m.samples_per_sec == pytest.approx(64 / (sum(m.step_times_s) / 6), rel=1e-6)
    assert m.provenance.kind == "measured" and m.provenance.profiler == "torch.profiler"


def test_data_loader_wait_is_measured(digits_profile):
    """digits_mlp augments every sample in the main process: the profiler sees the loop wait on the DataLoader.
    How large that share is depends on the machine and its load (over 0.30 on a quiet 2-core machine, 0.25 seen
    under load), so the size is not asserted here: the share is measured, positive and below the whole step."""
    sh = shares(digits_profile.waste_budget)
    assert digits_profile.waste_budget["data_wait"].status == "measured"
    assert 0 < sh["data_wait"] < 1


def test_waste_buckets_add_up_to_step_time(digits_profile):
    m = digits_profile
    assert list(m.waste_budget) == list(WASTE_BUCKETS)
    total = sum(b.seconds for b in m.waste_budget.values())
    assert total == pytest.approx(m.step_time_s, rel=0.05)
    for k in ("useful", "data_wait", "host_gap"):
        assert m.waste_budget[k].status == "measured"
        assert m.waste_budget[k].seconds >= 0
    # CPU trace: the tile model is GPU-only (the bf16 estimate: test_precision_path_reads_the_host_facts)
    assert m.waste_budget["kernel_shape"].status == "not_observable" and m.waste_budget["kernel_shape"].note
    # one process, no collectives: a measured 0, and the note says the trace would have shown them
    comm = m.waste_budget["comm_excess"]
    assert (comm.status, comm.seconds) == ("measured", 0.0)
    assert comm.note.startswith("no collective ops (c10d/gloo) among the ") and "single process" in comm.note
    assert 0 < evidence_coverage(m.waste_budget) < 1


class _Refold:
    """A runner that hands back the digits fixture's finished run folder: profile_run re-reads it, nothing runs."""

    kind = "local"

    def __init__(self, run_dir: str):
        self.run_dir = Path(run_dir)

    def run(self, workload, mode, steps, **kw) -> RawRun:
        return RawRun(ok=True, run_dir=self.run_dir, mode=mode, result=HarnessResult.read(self.run_dir / "result.json"))

    def fold_metrics(self, raw, metrics) -> None:
        pass


@pytest.mark.parametrize("flags, expect", [
    ({"amx_bf16": True, "avx512_bf16": False}, "saves"),
    ({"amx_bf16": False, "avx512_bf16": True}, "saves"),
    ({"amx_bf16": False, "avx512_bf16": False}, "nothing"),
    ({"amx_bf16": None, "avx512_bf16": None}, "unknown"),
])
def test_precision_path_reads_the_host_facts(digits_profile, flags, expect):
    """The CPU bf16 estimate follows the host facts (set here both ways), never this machine's /proc/cpuinfo."""
    with use_host(flags):
        m = profile_run(load_workload(WORKLOADS / "digits_mlp"), _Refold(digits_profile.run_dir), steps=6)
    prec = m.waste_budget["precision_path"]
    assert sum(b.seconds for b in m.waste_budget.values()) == pytest.approx(m.step_time_s, rel=0.05)
    if expect == "saves":
        assert prec.status == "estimated" and "fp32 GEMM calls" in prec.note
        assert 0 < prec.seconds < m.step_time_s
    elif expect == "nothing":
        assert (prec.status, prec.seconds) == ("estimated", 0.0) and "no bf16 matrix instructions" in prec.note
    else:
        assert prec.status == "not_observable" and "unknown whether this CPU" in prec.note


def test_gemm_shapes_come_from_the_real_trace(digits_profile):
    """The digits MLP's GEMMs (batch 64, 64 pixels in, 10 classes out) are read with their shapes."""
    summary = read_trace(digits_profile.trace_path)
    assert summary.gemms and all(g.dtype == "float" for g in summary.gemms)
    fwd = [g for g in summary.gemms if g.name == "aten::addmm"]
    assert any(g.m == 64 and g.k == 64 for g in fwd)  # first layer: [64 samples, 64 pixels] @ [64, hidden]
    assert any(g.m == 64 and g.n == 10 for g in fwd)  # logits
    assert {g.step for g in summary.gemms} == {s.index for s in summary.steps}
    assert all(g.time_us > 0 for g in summary.gemms)


def test_headroom_batch_is_estimated_from_allocator_events(digits_profile):
    m = digits_profile
    summary = read_trace(m.trace_path)
    assert summary.alloc_step_bytes  # profile_memory's [memory] events, per step
    later = [v for k, v in sorted(summary.alloc_step_bytes.items())][1:]  # the first step's count starts at 0
    assert later and all(peak > start > 0 for start, peak in later)
    assert m.memory_headroom_gb and m.memory_headroom_gb > 0
    # the MLP's 64-sample batch leaves GBs of host RAM for millions of samples: never printed (issue 15)
    if m.headroom_batch is None:
        why = m.not_observable["headroom_batch"]
        assert why.startswith("memory is not the limit") and "micro-batch of 64" in why, why
    else:  # bounded by the dataset's size when the harness reports it
        assert 64 < m.headroom_batch <= 64 * 1024
        assert any("headroom_batch" in w and ("estimated" in w or "dataset" in w) for w in m.warnings)


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


def test_every_empty_field_says_why(digits_profile):
    """RunMetrics fields are filled or named in not_observable with a reason (issue 4, Done when)."""
    data = digits_profile.model_dump()
    empty = [k for k, v in data.items() if v is None and k != "failure"]
    assert empty and all(digits_profile.not_observable.get(k) for k in empty), empty
