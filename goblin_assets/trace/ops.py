"""Per-op-and-shape roofline of the GEMM and attention ops of a recorded Kineto trace.

One row per (op name, input shapes, dtype), in the manner of TraceLens's
per-op-and-shape tables (``TraceLens/TreePerf`` ``get_df_kernel_launchers_summary_by_shape``,
read for the idea; the code is ours):

GEMMs are the leaf GEMM ops of the category table
(:func:`goblin_assets.runners.categories.gemm_operands`: ``aten::mm``,
``addmm``, ``bmm``, ``baddbmm`` ...); ``aten::linear`` / ``aten::matmul``
dispatch to these leaves, so reading only the leaves counts each GEMM once.
FLOPs and bytes come from :func:`goblin_assets.opscope.roofline.gemm_shape`:
``2·batch·M·N·K`` and the operands plus result at their recorded element size.

Attention ops are ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention``
(and ``_backward``), ``aten::_flash_attention_{forward,backward}`` and
``aten::_efficient_attention_{forward,backward}``; when nested, only the
outermost of them is a row (``scaled_dot_product_attention`` itself is left
out: its math fallback decomposes into ``bmm`` leaves, which are GEMM rows).
Q, K, V are the inputs at positions 0, 1, 2 (forward) or 1, 2, 3 (backward,
after ``grad_out``), laid out ``[B, H, S, D]`` for the ``_scaled_dot_product_*``
ops and ``[B, S, H, D]`` for ``_flash_*`` / ``_efficient_*`` (PyTorch
``aten/src/ATen/native/native_functions.yaml`` and
``transformers/cuda/attention.cu``).  Forward FLOPs = ``4·B·H·Sq·Sk·D``
(two GEMMs QKᵀ and PV), halved when causal; backward = 2.5 × forward.
Source: Dao-AILab/flash-attention ``benchmarks/benchmark_flash_attention.py``
``flops()`` (``4 * batch * seqlen**2 * nheads * headdim // (2 if causal else 1)``,
``2.5×`` for ``bwd``).  Bytes: Q, K, V and the output (forward); grad_out,
Q, K, V, output and dQ, dK, dV (backward), at the recorded dtype's size.

GPU time of a row is the sum of the device events launched while its op ran
(the launch runtime call's ``correlation`` links a device event to the call;
the call's timestamp and thread place it inside the op, so kernels launched
by the op's children count — ``_flash_attention_forward`` under
``_scaled_dot_product_flash_attention``).  Peaks: :func:`lookup_gpu_peak`
of ``ev.device_name`` — the bf16 peak for 16/8-bit operands, the fp32 peak
otherwise (the rule of :func:`goblin_assets.opscope.roofline.ridge_point`).
Every FLOP figure is a model of the op, hence ``status = 'estimated'``.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from goblin_assets.opscope.roofline import _LOW_PRECISION, DTYPE_BYTES, gemm_shape
from goblin_assets.runners.categories import gemm_operands
from goblin_assets.runners.peaks import lookup_gpu_peak
from goblin_assets.trace.events import TraceEvents, TraceReadError

#: Columns of :func:`op_roofline` (units in the suffix; ``flops`` in FLOP, ``bytes`` in B, totals over ``count``).
ROOFLINE_COLS = ["op", "kind", "input_dims", "dtype", "count", "gpu_time_us", "flops", "bytes",
                 "arithmetic_intensity_flop_per_byte", "achieved_tflops", "peak_tflops", "pct_of_peak",
                 "bound", "status"]

ATTENTION = re.compile(r"^aten::(_scaled_dot_product_(flash|efficient|cudnn)_attention(_backward)?"
                       r"|_(flash|efficient)_attention_(forward|backward))$")


def require_kineto(ev: TraceEvents, what: str) -> None:
    """Raise :class:`TraceReadError` unless ``ev`` is a :class:`TraceEvents` with a host side (Kineto)."""
    if not isinstance(ev, TraceEvents):
        raise TraceReadError(f"{what}: expected TraceEvents from load_trace(), got {type(ev).__name__}")
    if ev.source_format != "kineto":
        raise TraceReadError(f"{ev.path}: {what} needs the host side of a Kineto trace; "
                             f"{ev.source_format} records device kernels only")


def launched_gpu_us(ev: TraceEvents, tid, ts_us, end_us) -> np.ndarray:
    """GPU time (µs) of the device events launched by runtime calls on thread ``tid`` within ``[ts_us, end_us]``.

    Vectorised over the arrays ``tid``, ``ts_us``, ``end_us`` (one entry per
    host interval, e.g. a CPU op): device events are summed per launch
    ``correlation``, each launch call is placed at its start time on its
    thread, and a per-thread cumulative sum answers each interval with two
    binary searches.  Device events whose launch call is missing count nowhere.
    """
    tid, ts, end = np.asarray(tid), np.asarray(ts_us, float), np.asarray(end_us, float)
    out = np.zeros(len(ts))
    per_corr = ev.kernels.dropna(subset=["correlation"]).groupby("correlation")["dur_us"].sum()
    rt = ev.runtime.dropna(subset=["correlation"])
    rt = rt.assign(gpu_us=rt["correlation"].map(per_corr).fillna(0.0))
    rt = rt[rt["gpu_us"] > 0]
    for t, calls in rt.groupby("tid"):
        calls = calls.sort_values("ts_us")
        starts, csum = calls["ts_us"].to_numpy(), np.concatenate([[0.0], calls["gpu_us"].cumsum().to_numpy()])
        sel = tid == t
        out[sel] = csum[np.searchsorted(starts, end[sel], "right")] - csum[np.searchsorted(starts, ts[sel], "left")]
    return out


def outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops of ``ops`` not nested inside another op of ``ops`` on the same thread (ordered by start)."""
    keep = []
    for _, g in ops.sort_values(["ts_us", "end_us"], ascending=[True, False]).groupby("tid", sort=False):
        ends = g["end_us"].to_numpy()
        prev_max = np.maximum.accumulate(np.concatenate([[-np.inf], ends[:-1]]))
        keep.append(g[ends > prev_max])
    return pd.concat(keep) if keep else ops.iloc[:0]


def _numel(dims) -> int:
    return math.prod(int(d) for d in dims)


def _attention_shape(op: str, dims: list, types: list, concrete: list | None) -> dict | None:
    """FLOPs and bytes of one attention call from its recorded inputs (None when the shapes are missing)."""
    bwd = op.endswith("backward")
    q_at = 1 if bwd else 0
    try:
        q, k, v = (list(map(int, dims[q_at + i])) for i in range(3))
        size = DTYPE_BYTES[types[q_at]]
    except (TypeError, IndexError, ValueError, KeyError):
        return None
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None
    bhsd = op.startswith("aten::_scaled_dot_product")
    b, h, sq, d = (q[0], q[1], q[2], q[3]) if bhsd else (q[0], q[2], q[1], q[3])
    sk = k[2] if bhsd else k[1]
    causal = _is_causal(op, concrete)
    flops = 4.0 * b * h * sq * sk * d / (2 if causal else 1) * (2.5 if bwd else 1.0)
    out_numel = _numel(q[:-1]) * v[-1]
    tensors = _numel(q) + _numel(k) + _numel(v) + out_numel
    nbytes = size * (tensors + (out_numel + tensors) if bwd else tensors)  # bwd: dO, Q, K, V, O + dQ, dK, dV
    return {"dtype": types[q_at], "flops": flops, "bytes": float(nbytes)}


def _is_causal(op: str, concrete: list | None) -> bool:
    """The ``is_causal`` argument as recorded in ``Concrete Inputs`` (False when not recorded).

    Positions from ``native_functions.yaml``: ``_scaled_dot_product_flash_attention(query, key, value,
    dropout_p, is_causal, ...)`` -> 4; ``_scaled_dot_product_efficient_attention(query, key, value,
    attn_bias, compute_log_sumexp, dropout_p, is_causal, ...)`` -> 6;
    ``_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
    is_causal, ...)`` -> 8.  Other signatures are read as non-causal.
    """
    at = {"aten::_scaled_dot_product_flash_attention": 4, "aten::_scaled_dot_product_efficient_attention": 6,
          "aten::_flash_attention_forward": 8}.get(op)
    if at is None or not concrete or len(concrete) <= at:
        return False
    return str(concrete[at]).strip().lower() in ("true", "1")


def _shape_row(name: str, dims, types, concrete) -> dict | None:
    if gemm_operands(name) is not None:
        s = gemm_shape(name, dims, types or [])
        return None if s is None else {"kind": "gemm", "dtype": s["dtype"], "flops": s["flops"], "bytes": s["bytes"]}
    s = _attention_shape(name, dims, types or [], concrete)
    return None if s is None else {"kind": "attention", **s}


def op_roofline(ev: TraceEvents) -> pd.DataFrame:
    """Roofline table of the GEMM and attention ops of ``ev``, one row per (op, input shapes, dtype).

    Columns
    -------
    ``op`` (aten name), ``kind`` (gemm | attention), ``input_dims`` (the
    recorded ``Input Dims`` as text), ``dtype`` (the recorded ``Input type``
    of the first operand), ``count`` (calls), ``gpu_time_us`` (µs, device
    events launched inside the calls), ``flops`` (FLOP, all calls), ``bytes``
    (B, all calls), ``arithmetic_intensity_flop_per_byte``,
    ``achieved_tflops`` (TFLOP/s = flops / gpu time; NaN without GPU time),
    ``peak_tflops`` (the device's dense peak for the dtype; None when the
    device is not in the peak table), ``pct_of_peak`` (% = achieved / peak),
    ``bound`` (memory | compute: intensity below or above the ridge point
    peak / HBM bandwidth; None without a peak), ``status`` (``estimated``).
    Sorted by ``gpu_time_us``, largest first.  Empty (same columns) when the
    trace was recorded without ``record_shapes``.

    Raises
    ------
    TraceReadError
        ``ev`` is not a Kineto :class:`TraceEvents` (rocprofv3 output has no ops).
    """
    require_kineto(ev, "op_roofline")
    ops = ev.cpu_ops
    if not ev.flags.get("record_shapes", True) or ops["input_dims"].isna().all():
        return pd.DataFrame(columns=ROOFLINE_COLS)
    is_gemm = ops["name"].map(lambda n: gemm_operands(n) is not None)
    cand = pd.concat([ops[is_gemm], outermost(ops[ops["name"].str.match(ATTENTION)])])
    cand = cand[cand["input_dims"].notna()]
    shapes = [_shape_row(n, d, t, c) for n, d, t, c in
              zip(cand["name"], cand["input_dims"], cand["input_types"], cand["concrete_inputs"])]
    ok = [s is not None for s in shapes]
    cand, shapes = cand[ok], pd.DataFrame([s for s in shapes if s is not None], index=cand.index[ok])
    if cand.empty:
        return pd.DataFrame(columns=ROOFLINE_COLS)
    rows = shapes.assign(op=cand["name"], input_dims=cand["input_dims"].astype(str),
                         gpu_time_us=launched_gpu_us(ev, cand["tid"], cand["ts_us"], cand["end_us"]))
    g = rows.groupby(["op", "kind", "input_dims", "dtype"], as_index=False).agg(
        count=("flops", "size"), gpu_time_us=("gpu_time_us", "sum"), flops=("flops", "sum"),
        bytes=("bytes", "sum"))
    g["arithmetic_intensity_flop_per_byte"] = g["flops"] / g["bytes"]
    g["achieved_tflops"] = np.where(g["gpu_time_us"] > 0, g["flops"] / g["gpu_time_us"].where(g["gpu_time_us"] > 0)
                                    / 1e6, np.nan)
    peak = lookup_gpu_peak(ev.device_name)
    if peak is None:
        g["peak_tflops"], g["pct_of_peak"], g["bound"] = None, None, None
    else:
        g["peak_tflops"] = [peak.bf16_tflops if t in _LOW_PRECISION else peak.fp32_tflops for t in g["dtype"]]
        g["pct_of_peak"] = 100.0 * g["achieved_tflops"] / g["peak_tflops"]
        ridge = g["peak_tflops"] / peak.hbm_tb_s
        g["bound"] = np.where(g["arithmetic_intensity_flop_per_byte"] < ridge, "memory", "compute")
    g["status"] = "estimated"
    return g[ROOFLINE_COLS].sort_values("gpu_time_us", ascending=False, kind="stable").reset_index(drop=True)
