"""Roofline from real Chrome traces: FLOPs 2MNK, bytes at the real dtype size, ridge points, hot shapes."""
from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from goblin_assets.opscope.roofline import (
    TraceShapeError, gemm_shape, hot_shapes, ridge_point, roofline, roofline_findings, run_device_name, trace_gemms,
)
from goblin_assets.runners.peaks import PEAKS, DevicePeak
from goblin_assets.warehouse.db import validate

#: A fixed CPU peak for tests (the real one is measured; tests must not depend on machine load).
CPU = DevicePeak("CPU", 0.1, 0.1, 0.02, 24, "test")


def _trace(tmp_path, fn, record_shapes=True):
    fn()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
        fn()
    p = tmp_path / "trace.json"
    prof.export_chrome_trace(str(p))
    return p


def test_flops_and_bytes_use_the_real_dtype(tmp_path):
    a32, b32 = torch.randn(48, 96), torch.randn(96, 160)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    bias = torch.randn(160)
    x3, y3 = torch.randn(4, 8, 16), torch.randn(4, 16, 24)

    def work():
        torch.mm(a32, b32)
        torch.mm(a16, b16)
        torch.addmm(bias, a32, b32)
        torch.bmm(x3, y3)

    g, gpu = trace_gemms(_trace(tmp_path, work))
    assert gpu is None and run_device_name(gpu) == "CPU"
    rows = {(r.op, r.dtype): r for r in g.itertuples()}
    mm32, mm16 = rows[("mm", "float")], rows[("mm", "c10::BFloat16")]
    assert mm32.flops == mm16.flops == 2 * 48 * 96 * 160
    assert mm32.bytes == 4 * (48 * 96 + 96 * 160 + 48 * 160)
    assert mm16.bytes == 2 * (48 * 96 + 96 * 160 + 48 * 160)            # bf16: 2 bytes, not an assumed fp32
    assert rows[("addmm", "float")].bytes == mm32.bytes + 4 * 160         # + the bias
    bmm = rows[("bmm", "float")]
    assert (bmm.batch, bmm.M, bmm.K, bmm.N) == (4, 8, 16, 24) and bmm.flops == 2 * 4 * 8 * 16 * 24
    roof = roofline(g, run_id="t-roof", devices={"H100": PEAKS["H100"], "CPU": CPU})
    validate("roofline", roof)
    h100 = roof[(roof.device == "H100") & (roof.dtype == "c10::BFloat16")].iloc[0]
    assert h100.ridge_flop_per_byte == pytest.approx(989.4 / 3.35)       # bf16 peak / HBM bandwidth
    assert h100.bound == "memory"                                        # 48x96x160 is far below H100's ridge
    assert ridge_point(PEAKS["MI300X"], "float") == pytest.approx(163.4 / 5.3)
    assert (roof[roof.device == "CPU"].achieved_tflops > 0).all()


def test_trace_without_shapes_is_a_clear_error(tmp_path):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    p = _trace(tmp_path, lambda: torch.mm(a, b), record_shapes=False)
    with pytest.raises(TraceShapeError, match="record_shapes=True"):
        trace_gemms(p)
    assert gemm_shape("aten::mm", [[], []], ["float", "float"]) is None


@pytest.mark.slow
def test_digits_workload_trace_roofline(digits_profile):
    """The real profiled digits_mlp run (conftest fixture): its 64-wide GEMMs, forward and backward."""
    g, gpu = trace_gemms(digits_profile.trace_path)
    roof = roofline(g, run_id="t-digits", devices={**PEAKS, "CPU": CPU})
    hot = hot_shapes(roof)
    assert "addmm 64x64x256:float" in set(hot["shape"])                 # first layer: batch 64, 64 pixels -> 256
    assert hot["share"].sum() == pytest.approx(1.0) and hot["autotune_target"].iloc[0]
    pat = roofline_findings(roof, run_device_name(gpu), run_id="t-digits", workload="digits_mlp")
    validate("patterns", pat)
    assert set(pat.finding) <= {"memory_bound", "compute_bound"}
    ev = json.loads(pat.evidence_json.iloc[0])
    assert set(ev["bound_by_device"]) == {"MI300X", "MI325X", "H100", "H200", "A100", "CPU"}
    for dev, bound in ev["bound_by_device"].items():      # the bound follows the table's ridge for fp32
        peak = CPU if dev == "CPU" else PEAKS[dev]
        assert bound == ("compute" if ev["intensity_flop_per_byte"] >= peak.fp32_tflops / peak.hbm_tb_s else "memory")
    # the first layer's 64x64x256 fp32 addmm: 2*64*64*256 FLOP over 4*(64*64 + 64*256 + 64*256 + 256) bytes
    # = 14.1 flop/byte: memory-bound on MI300X/MI325X (ridge 31, 27) and H100 (20), compute-bound on
    # H200 (14.0: same compute, more bandwidth) and A100 (9.6: low fp32 non-tensor-core peak)
    first = roof[(roof.op == "addmm") & (roof.M == 64) & (roof.K == 64) & (roof.N == 256)].set_index("device")
    assert first.loc["H100", "intensity_flop_per_byte"] == pytest.approx(2 * 64 * 64 * 256 / (4 * 37120))
    assert {d: first.loc[d, "bound"] for d in ("MI300X", "MI325X", "H100", "H200", "A100")} == {
        "MI300X": "memory", "MI325X": "memory", "H100": "memory", "H200": "compute", "A100": "compute"}


def test_minilm_forward_roofline(tmp_path):
    from goblin_assets.opscope.roofline import profile_minilm_trace

    p = profile_minilm_trace(tmp_path / "minilm.json", batch=4, max_length=32)
    g, _ = trace_gemms(p)
    roof = roofline(g, run_id="t-minilm", devices={"H200": PEAKS["H200"], "CPU": CPU})
    # 6 layers x (q, k, v, attention out, FFN in, FFN out) on 4 x 32 tokens, plus the pooler
    lin = roof[(roof.device == "CPU") & (roof.op.isin(["addmm", "mm"])) & (roof.M == 128)]
    assert lin["count"].sum() == 36
    assert {(r.K, r.N) for r in lin.itertuples()} == {(384, 384), (384, 1536), (1536, 384)}
    assert (roof[roof.op == "bmm"]["count"].sum()) == 2 * 6 * 2           # QK^T and PV per layer, per device row
