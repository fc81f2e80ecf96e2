"""Roofline of a run's GEMMs: FLOPs, bytes, arithmetic intensity, and which roof binds on which device.

Input: a torch.profiler Chrome trace recorded with ``record_shapes=True``, whose
``cpu_op`` events for the leaf GEMM ops of the category table
(:func:`goblin_assets.runners.categories.gemm_operands`: ``aten::mm``,
``aten::addmm``, ``aten::_addmm_activation``, ``aten::bmm``, ``aten::baddbmm``,
``aten::_int_mm``) carry ``Input Dims`` and ``Input type`` (``docs/sources.md``
"Profiler trace format").  Only these leaf ops are read, so a ``linear`` that
dispatches to ``addmm`` is counted once.

Per op shape: FLOPs = 2·B·M·N·K; bytes = the operands and the result at their
real element size (the trace's ``Input type``, never an assumed fp32), plus the
bias for addmm/baddbmm; intensity = FLOPs / bytes.  A device's ridge point is
its peak FLOP/s over its memory bandwidth (:data:`goblin_assets.runners.peaks.PEAKS`
for MI300X, MI325X, H100, H200, A100; this CPU measured); an op below the ridge
is memory-bound there, above it compute-bound.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from goblin_assets.errors import GoblinError
from goblin_assets.runners.categories import gemm_operands
from goblin_assets.runners.peaks import PEAKS, DevicePeak, lookup_gpu_peak
from goblin_assets.warehouse.tables import columns

#: Trace ``Input type`` strings -> element size in bytes (c10 scalar type names as torch.profiler writes them).
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "signed char": 1, "unsigned char": 1,
    "int": 4, "long int": 8, "short int": 2, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8,
}
_LOW_PRECISION = {"c10::Half", "c10::BFloat16", "signed char", "c10::Float8_e4m3fn", "c10::Float8_e5m2",
                  "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"}


class TraceShapeError(GoblinError):
    """A trace is unreadable or was recorded without shapes (message names the file)."""


def _numel(dims) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def gemm_shape(op: str, dims: list, types: list) -> dict | None:
    """FLOPs and bytes of one leaf GEMM call (``op``: a key of the category table's ``gemm_operands``)
    from its recorded ``Input Dims`` / ``Input type``.

    Shapes
    ------
    mm ``(M,K)@(K,N)``; addmm adds ``(N,)`` or ``(M,N)``; bmm ``(B,M,K)@(B,K,N)``.

    Units
    -----
    ``flops`` (FLOP), ``bytes`` (B), ``intensity_flop_per_byte``.
    Returns None when the dims are missing or not a matmul (e.g. an empty list).
    """
    operands = gemm_operands(op)
    li, ri, ci, batched = operands.lhs, operands.rhs, operands.bias, operands.batched
    if len(dims) <= max(li, ri) or len(types) <= max(li, ri):
        return None
    a, b = dims[li], dims[ri]
    if not a or not b or len(a) != len(b) or len(a) != (3 if batched else 2):
        return None
    batch = int(a[0]) if batched else 1
    m, k, n = int(a[-2]), int(a[-1]), int(b[-1])
    ta, tb = types[li], types[ri]
    out_type = "int" if op == "aten::_int_mm" else ta
    size = DTYPE_BYTES.get
    if size(ta) is None or size(tb) is None:
        return None
    nbytes = batch * (m * k * size(ta) + k * n * size(tb) + m * n * size(out_type))
    if ci is not None and len(dims) > ci and dims[ci]:
        nbytes += _numel(dims[ci]) * (size(types[ci]) or size(ta))
    flops = 2.0 * batch * m * n * k
    return {"op": op.split("::")[-1], "batch": batch, "M": m, "K": k, "N": n, "dtype": ta,
            "flops": flops, "bytes": float(nbytes), "intensity_flop_per_byte": flops / nbytes}


def trace_gemms(trace_path: str | Path) -> tuple[pd.DataFrame, str | None]:
    """Every GEMM call of a Chrome trace with its shape, FLOPs, bytes and duration, and the GPU name if any.

    Raises
    ------
    TraceShapeError
        The file is missing or not JSON, or it has GEMM ops but none carries
        ``Input Dims`` (recorded without ``record_shapes=True``).
    """
    p = Path(trace_path)
    try:
        trace = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise TraceShapeError(f"{p}: cannot read the trace: {exc}") from None
    rows, seen = [], 0
    for e in trace.get("traceEvents", []):
        name = e.get("name")
        if e.get("ph") != "X" or gemm_operands(name) is None:
            continue
        seen += 1
        args = e.get("args", {})
        if "Input Dims" not in args:
            continue
        s = gemm_shape(name, args["Input Dims"], args.get("Input type", []))
        if s is not None:
            rows.append({**s, "dur_us": float(e.get("dur", 0.0))})
    if seen and not rows:
        raise TraceShapeError(f"{p}: {seen} GEMM events but none has 'Input Dims' (profile with record_shapes=True)")
    props = trace.get("deviceProperties") or []
    gpu = props[0].get("name") if props and isinstance(props[0], dict) else None
    return pd.DataFrame(rows, columns=["op", "batch", "M", "K", "N", "dtype", "flops", "bytes",
                                       "intensity_flop_per_byte", "dur_us"]), gpu


def device_peaks(include_cpu: bool = True) -> dict[str, DevicePeak]:
    """The devices to draw roofs for: the peak table and, if asked, this CPU (measured)."""
    from goblin_assets.runners.peaks import cpu_peak

    devs = dict(PEAKS)
    if include_cpu:
        devs["CPU"] = cpu_peak()
    return devs


def ridge_point(peak: DevicePeak, dtype: str) -> float:
    """FLOP per byte where ``peak``'s compute roof meets its memory roof for ``dtype`` operands.

    Half/bf16/8-bit operands use the bf16 matrix peak (the table has no int8/fp8
    figure: conservative for those); everything else the fp32 peak.

    Units
    -----
    FLOP/byte = (TFLOP/s · 1e12) / (TB/s · 1e12).
    """
    tflops = peak.bf16_tflops if dtype in _LOW_PRECISION else peak.fp32_tflops
    return tflops / peak.hbm_tb_s


def roofline(gemms: pd.DataFrame, run_id: str = "roofline", source: str = "trace",
           devices: dict[str, DevicePeak] | None = None) -> pd.DataFrame:
    """Roofline rows per GEMM shape and device (the ``roofline`` table).

    Parameters
    ----------
    gemms : one row per call (:func:`trace_gemms`), ``dur_us`` may be NaN.
    devices : name -> peak (default :func:`device_peaks`: the table plus this CPU).

    Returns
    -------
    DataFrame
        ``roofline`` rows: per (op, batch, M, K, N, dtype) the call ``count``,
        per-call ``flops`` / ``bytes`` / intensity, total ``dur_us`` and the
        ``achieved_tflops`` it implies (on the device that ran it), then per
        device the ridge point and ``bound`` (compute|memory).
    """
    devices = devices if devices is not None else device_peaks()
    keys = ["op", "batch", "M", "K", "N", "dtype"]
    if gemms.empty:
        return pd.DataFrame(columns=columns("roofline"))
    agg = gemms.groupby(keys, as_index=False).agg(count=("flops", "size"), flops=("flops", "first"),
                                                 bytes=("bytes", "first"),
                                                 intensity_flop_per_byte=("intensity_flop_per_byte", "first"),
                                                 dur_us=("dur_us", "sum"))
    rows = []
    for r in agg.itertuples(index=False):
        dur = float(r.dur_us) if r.dur_us and r.dur_us > 0 else None
        achieved = r.count * r.flops / (dur * 1e-6) / 1e12 if dur else None
        for name, peak in devices.items():
            ridge = ridge_point(peak, r.dtype)
            rows.append({"run_id": run_id, "source": source, "op": r.op, "batch": r.batch, "M": r.M, "K": r.K,
                         "N": r.N, "dtype": r.dtype, "count": int(r.count), "flops": r.flops, "bytes": r.bytes,
                         "intensity_flop_per_byte": r.intensity_flop_per_byte, "dur_us": dur,
                         "achieved_tflops": achieved, "device": name, "ridge_flop_per_byte": ridge,
                         "bound": "compute" if r.intensity_flop_per_byte >= ridge else "memory",
                         "peak_source": peak.source})
    return pd.DataFrame(rows, columns=columns("roofline"))


def hot_shapes(roof: pd.DataFrame, cover: float = 0.8) -> pd.DataFrame:
    """The hot-GEMM-shape histogram: shapes by share of GEMM time (or of FLOPs when untimed).

    Returns
    -------
    DataFrame
        ``shape`` (``op[B×]M×K×N:dtype``), ``count``, ``dur_us``, ``share``,
        ``cum_share`` and ``autotune_target`` (the shapes that together cover
        ``cover`` of the total: where autotuning / dispatch tables pay).
    """
    one = roof.drop_duplicates(["op", "batch", "M", "K", "N", "dtype"]).copy()
    if one.empty:
        return pd.DataFrame(columns=["shape", "count", "dur_us", "share", "cum_share", "autotune_target"])
    weight = one["dur_us"].fillna(0.0)
    if weight.sum() <= 0:
        weight = one["flops"] * one["count"]
    one["share"] = weight / weight.sum()
    one["shape"] = [f"{r.op}[{r.batch}x]{r.M}x{r.K}x{r.N}:{r.dtype}" if r.batch > 1 else
                    f"{r.op} {r.M}x{r.K}x{r.N}:{r.dtype}" for r in one.itertuples()]
    one = one.sort_values("share", ascending=False, ignore_index=True)
    one["cum_share"] = one["share"].cumsum()
    one["autotune_target"] = (one["cum_share"] - one["share"]) < cover
    return one[["shape", "count", "dur_us", "share", "cum_share", "autotune_target"]]


def roofline_findings(roof: pd.DataFrame, run_device: str, run_id: str = "roofline",
                      workload: str = "trace") -> pd.DataFrame:
    """``patterns`` rows: per hot shape, ``memory_bound`` / ``compute_bound`` on the device that ran it.

    ``site`` is the shape label, ``role`` ``gemm``, ``score`` the shape's share
    of GEMM time; the evidence lists intensity, ridge, the bound on every
    device of the table and whether the shape is an autotune target.
    """
    hot = hot_shapes(roof)
    rows = []
    for h in hot.itertuples():
        sub = roof[[(f"{r.op}[{r.batch}x]{r.M}x{r.K}x{r.N}:{r.dtype}" if r.batch > 1 else
                     f"{r.op} {r.M}x{r.K}x{r.N}:{r.dtype}") == h.shape for r in roof.itertuples()]]
        mine = sub[sub["device"] == run_device]
        ref = mine.iloc[0] if not mine.empty else sub.iloc[0]
        ev = {"intensity_flop_per_byte": float(ref.intensity_flop_per_byte), "flops": float(ref.flops),
              "bytes": float(ref.bytes), "count": int(ref["count"]), "device": str(ref.device),
              "ridge_flop_per_byte": float(ref.ridge_flop_per_byte),
              "achieved_tflops": None if pd.isna(ref.achieved_tflops) else float(ref.achieved_tflops),
              "bound_by_device": dict(zip(sub["device"], sub["bound"])), "autotune_target": bool(h.autotune_target),
              "time_share": float(h.share)}
        rows.append({"run_id": run_id, "workload": workload, "site": h.shape, "role": "gemm",
                     "finding": f"{ref.bound}_bound", "score": float(h.share), "evidence_json": json.dumps(ev)})
    return pd.DataFrame(rows, columns=columns("patterns"))


def run_device_name(gpu_name: str | None) -> str:
    """The peak-table key of the device a trace ran on (``CPU`` for CPU-only traces)."""
    peak = lookup_gpu_peak(gpu_name)
    return peak.name if peak else "CPU"


def profile_minilm_trace(out_path: str | Path, batch: int = 8, max_length: int = 64) -> Path:
    """Profile one MiniLM forward on real text with shapes recorded; write its Chrome trace.

    Used to draw MiniLM's roofline when no recorded run exists.  Source: measured.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from goblin_assets.opscope.infer import load_minilm, stdlib_texts

    model, tok = load_minilm("eager")
    enc = tok(stdlib_texts(batch), return_tensors="pt", padding="max_length", truncation=True, max_length=max_length)
    with torch.no_grad():
        model(**enc)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model(**enc)
    p = Path(out_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(p))
    return p
