"""The GPU side of the trace reader and waste budget, on a Kineto-schema GPU trace.

No GPU is lent to CI: ``tests/data/gpu_trace.py`` writes a small trace with
the events torch.profiler records on CUDA/ROCm.  Holistic Trace Analysis
loading it (and agreeing with our device-busy time) checks that the reader
and HTA expect the same schema.  ``benchmarks/gpu_trace_check.py`` repeats
the check on a real GPU run when a device is lent.
"""
from __future__ import annotations

import pytest

from goblin_assets.measure.waste import gemm_estimates, tile_waste_fraction, waste_budget
from goblin_assets.runners.trace import read_trace
from tests.data.gpu_trace import COLLECTIVE_US, EXPOSED_US, STEP_US, STEPS, write_gpu_trace


@pytest.fixture
def gpu_trace_path(tmp_path):
    return write_gpu_trace(tmp_path / "rank0.json")


def test_tile_waste_fraction():
    assert tile_waste_fraction(128, 256, 64) == 0.0
    assert tile_waste_fraction(64, 256, 100) == pytest.approx(1 - 100 / 128)
    assert tile_waste_fraction(1, 1, 1) == pytest.approx(1 - 1 / 64**3)
    assert tile_waste_fraction(65, 64, 64) == pytest.approx(1 - 65 / 128)


def test_reader_links_gemm_kernels_to_their_shaped_ops(gpu_trace_path):
    s = read_trace(gpu_trace_path)
    assert s.has_device and s.device_name.startswith("NVIDIA H100")
    # 70 µs of compute kernels plus the all-reduce's 20 µs that no compute kernel overlaps
    assert [st.device_busy_us for st in s.steps] == [90.0] * len(STEPS)
    assert [st.data_wait_us for st in s.steps] == [30.0] * len(STEPS)
    assert [st.collective_us for st in s.steps] == [COLLECTIVE_US] * len(STEPS)
    assert [st.comm_exposed_us for st in s.steps] == [EXPOSED_US] * len(STEPS)
    assert s.steps[0].category_us == {"gemm": 60.0, "elementwise": 10.0, "collective": 30.0}
    assert (s.collectives, s.others) == (len(STEPS), 3 * len(STEPS))
    per_step = [(g.name, g.dtype, g.m, g.n, g.k, g.time_us) for g in s.gemms if g.step == STEPS[0]]
    assert per_step == [("aten::addmm", "float", 64, 256, 100, 40.0),
                        ("aten::mm", "c10::BFloat16", 128, 128, 128, 20.0)]


def test_gpu_waste_budget_estimates_precision_and_shape(gpu_trace_path):
    s = read_trace(gpu_trace_path)
    step_s = STEP_US * 1e-6
    b = waste_budget(s, step_s)
    shape_us = 40.0 * (1 - 100 / 128)           # the fp32 addmm's K=100 pads to 128
    prec_us = 0.5 * (40.0 - shape_us)           # bf16 halves the rest of the fp32 GEMM; the bf16 mm saves nothing
    assert b["kernel_shape"].seconds == pytest.approx(shape_us * 1e-6)
    assert b["precision_path"].seconds == pytest.approx(prec_us * 1e-6)
    assert b["useful"].seconds == pytest.approx((70.0 - shape_us - prec_us) * 1e-6)
    assert b["comm_excess"].seconds == pytest.approx(EXPOSED_US * 1e-6)
    assert b["data_wait"].seconds == pytest.approx(30e-6)
    assert b["host_gap"].seconds == pytest.approx((200.0 - 90.0 - 30.0) * 1e-6)
    assert {k: v.status for k, v in b.items()} == {
        "useful": "measured", "data_wait": "measured", "host_gap": "measured", "comm_excess": "measured",
        "precision_path": "estimated", "kernel_shape": "estimated"}
    assert sum(v.seconds for v in b.values()) == pytest.approx(step_s)
    assert "3 collective kernels (NCCL/RCCL)" in b["comm_excess"].note
    assert "3 of 6 GEMM calls" in b["kernel_shape"].note


def test_gemm_estimates_ignore_steps_outside_the_window(gpu_trace_path):
    s = read_trace(gpu_trace_path)
    shape, prec, n = gemm_estimates(s.gemms, [STEPS[0]], bf16_saves=True)
    assert len(shape) == 1 and n == {"gemms": 2, "misaligned": 1, "fp32": 1}


def test_holistic_trace_analysis_loads_the_gpu_trace(gpu_trace_path):
    """HTA (the profiler team's analysis library) parses the same file and agrees on kernel and exposed comm time."""
    from hta.trace_analysis import TraceAnalysis

    ours = read_trace(gpu_trace_path)
    hta = TraceAnalysis(trace_dir=str(gpu_trace_path.parent), include_last_profiler_step=True)
    assert [int(x) for x in hta.get_profiler_steps()] == list(STEPS)
    tb = hta.get_temporal_breakdown(visualize=False)
    busy = float(tb["compute_time(us)"].iloc[0] + tb["non_compute_time(us)"].iloc[0])
    assert busy == pytest.approx(sum(st.device_busy_us for st in ours.steps))
    kernels = hta.get_gpu_kernel_breakdown(visualize=False)[1]
    assert len(kernels) == 4
    # HTA's share of communication time overlapped by computation (percent, rounded to 0.01):
    # exposed = comm x (1 - overlap)
    overlap = float(hta.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0]) / 100
    comm = sum(st.collective_us for st in ours.steps)
    assert comm * (1 - overlap) == pytest.approx(sum(st.comm_exposed_us for st in ours.steps), abs=comm * 1e-4)


def test_comm_excess_is_zero_measured_without_collectives(tmp_path):
    """A GPU trace can show collective kernels: none in it is a measured 0, and the note says why."""
    import json

    from tests.data.gpu_trace import gpu_trace

    doc = gpu_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "nccl" not in e.get("name", "")
                          and e.get("name") != "c10d::allreduce_"]
    path = tmp_path / "single.json"
    path.write_text(json.dumps(doc))
    s = read_trace(path)
    b = waste_budget(s, STEP_US * 1e-6)["comm_excess"]
    assert (b.status, b.seconds) == ("measured", 0.0)
    assert b.note.startswith("no collective kernels (NCCL/RCCL) among the 9 device kernels")
    assert [st.device_busy_us for st in s.steps] == [70.0] * len(STEPS)


def test_mfu_precision_follows_the_gemm_time(gpu_trace_path):
    from goblin_assets.measure.profile import gemm_precision

    s = read_trace(gpu_trace_path)
    assert gemm_precision(s) == "fp32"  # 40 µs fp32 addmm vs 20 µs bf16 mm per step
    for g in s.gemms:
        g.dtype = "c10::BFloat16" if g.name == "aten::addmm" else g.dtype
    assert gemm_precision(s) == "bf16"
