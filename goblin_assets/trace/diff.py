"""Compare two recorded traces: per category, and per op matched across hardware.

Two traces of the same model (on two devices, or before and after a patch)
launch different kernels (``attn_fwd`` on MI300X, ``flash_fwd_kernel`` on
H100), so kernels are compared by their category in the one category table,
and work is matched op by op through the CPU op that launched it: the leaf
``cpu_op`` with the same name and input shapes (``Input Dims``) in both
traces, its GPU time being the kernels linked to it by ``External id`` (the
link Kineto writes; HTA's and TraceLens's trace diffs match ops the same
way: HTA ``analyzers/trace_diff.py`` compares op/kernel counts and durations
by name, TraceLens ``TraceDiff`` merges the two op trees by name and shape).

Times are per profiled step (a trace's total over its ``ProfilerStep``
windows divided by the number of steps; the whole trace is one window when it
has no steps), so traces with different step counts compare.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from goblin_assets.trace.events import TraceEvents


def _windows(ev: TraceEvents) -> list[tuple[float, float]]:
    if ev.has_steps:
        return list(zip(ev.steps["start_us"].astype(float), ev.steps["end_us"].astype(float)))
    return [ev.window()]


def _in_windows(df: pd.DataFrame, wins: list[tuple[float, float]]) -> pd.DataFrame:
    """Rows whose start lies in one of the windows."""
    ts = df["ts_us"].to_numpy()
    keep = np.zeros(len(df), dtype=bool)
    for lo, hi in wins:
        keep |= (ts >= lo) & (ts < hi)
    return df[keep]


def category_time(ev: TraceEvents) -> pd.DataFrame:
    """Device time per category per step of one trace.

    Returns
    -------
    pandas.DataFrame
        Index ``category``; columns ``group``, ``time_per_step_us`` (summed
        kernel durations in the steps, divided by the number of steps),
        ``share_pct`` (of all kernel time, 0..100), ``count_per_step``.
    """
    wins = _windows(ev)
    k = _in_windows(ev.kernels, wins)
    n = max(len(wins), 1)
    g = k.groupby("category").agg(group=("group", "first"), time_us=("dur_us", "sum"), count=("dur_us", "size"))
    total = float(g["time_us"].sum()) or 1.0
    return pd.DataFrame({"group": g["group"], "time_per_step_us": g["time_us"] / n,
                         "share_pct": 100.0 * g["time_us"] / total, "count_per_step": g["count"] / n})


def op_time(ev: TraceEvents) -> pd.DataFrame:
    """GPU time per leaf CPU op and input shapes, per step (empty without CPU ops).

    Returns
    -------
    pandas.DataFrame
        Columns ``op``, ``input_dims`` (str; ``""`` without ``record_shapes``),
        ``calls_per_step``, ``gpu_time_per_step_us`` (the kernels whose
        ``External id`` is the op's), ``top_kernel`` (the op's longest kernel
        name).
    """
    cols = ["op", "input_dims", "calls_per_step", "gpu_time_per_step_us", "top_kernel"]
    k = ev.kernels.dropna(subset=["external_id"])
    if ev.cpu_ops.empty or k.empty:
        return pd.DataFrame(columns=cols)
    wins = _windows(ev)
    ops = _in_windows(ev.cpu_ops.dropna(subset=["external_id"]), wins)
    per_ext = k.groupby("external_id").agg(gpu_us=("dur_us", "sum"))
    top = k.sort_values("dur_us").groupby("external_id")["name"].last()
    ops = ops[ops["external_id"].isin(per_ext.index)]
    ops = ops.assign(gpu_us=ops["external_id"].map(per_ext["gpu_us"]).to_numpy(),
                     top_kernel=ops["external_id"].map(top).to_numpy(),
                     input_dims=[("" if d is None else str(d)) for d in ops["input_dims"]])
    n = max(len(wins), 1)
    g = ops.groupby(["name", "input_dims"], sort=False).agg(
        calls=("gpu_us", "size"), gpu_us=("gpu_us", "sum"), top_kernel=("top_kernel", "first")).reset_index()
    return pd.DataFrame({"op": g["name"], "input_dims": g["input_dims"], "calls_per_step": g["calls"] / n,
                         "gpu_time_per_step_us": g["gpu_us"] / n, "top_kernel": g["top_kernel"]})


def category_diff(a: TraceEvents, b: TraceEvents) -> pd.DataFrame:
    """Per-category change from trace ``a`` to trace ``b``, largest share change first.

    Returns
    -------
    pandas.DataFrame
        Columns ``category``, ``group``, ``a_time_per_step_us``,
        ``b_time_per_step_us``, ``a_share_pct``, ``b_share_pct``,
        ``share_change_pp`` (b - a, percentage points), ``time_ratio`` (b / a;
        NaN where ``a`` has none of it).  A category present in one trace only
        has 0 time in the other.
    """
    ca, cb = category_time(a), category_time(b)
    idx = ca.index.union(cb.index)
    ca, cb = ca.reindex(idx), cb.reindex(idx)
    out = pd.DataFrame({
        "category": idx, "group": ca["group"].fillna(cb["group"]).to_numpy(),
        "a_time_per_step_us": ca["time_per_step_us"].fillna(0.0).to_numpy(),
        "b_time_per_step_us": cb["time_per_step_us"].fillna(0.0).to_numpy(),
        "a_share_pct": ca["share_pct"].fillna(0.0).to_numpy(), "b_share_pct": cb["share_pct"].fillna(0.0).to_numpy()})
    out["share_change_pp"] = out["b_share_pct"] - out["a_share_pct"]
    out["time_ratio"] = np.where(out["a_time_per_step_us"] > 0,
                                 out["b_time_per_step_us"] / out["a_time_per_step_us"].where(
                                     out["a_time_per_step_us"] > 0, 1.0), np.nan)
    return out.reindex(out["share_change_pp"].abs().sort_values(ascending=False).index).reset_index(drop=True)


def op_diff(a: TraceEvents, b: TraceEvents) -> pd.DataFrame:
    """Ops matched by name and input shapes across the two traces, largest absolute time change first.

    Returns
    -------
    pandas.DataFrame
        Columns ``op``, ``input_dims``, ``a_gpu_time_per_step_us``,
        ``b_gpu_time_per_step_us``, ``time_change_us`` (b - a),
        ``time_ratio`` (b / a), ``a_calls_per_step``, ``b_calls_per_step``,
        ``a_top_kernel``, ``b_top_kernel``, ``matched`` (True when both
        traces ran the op with those shapes).  Empty when either trace has no
        CPU ops (rocprofv3 output).
    """
    oa, ob = op_time(a), op_time(b)
    cols = ["op", "input_dims", "a_gpu_time_per_step_us", "b_gpu_time_per_step_us", "time_change_us", "time_ratio",
            "a_calls_per_step", "b_calls_per_step", "a_top_kernel", "b_top_kernel", "matched"]
    if oa.empty or ob.empty:
        return pd.DataFrame(columns=cols)
    m = oa.merge(ob, on=["op", "input_dims"], how="outer", suffixes=("_a", "_b"), indicator=True)
    out = pd.DataFrame({
        "op": m["op"], "input_dims": m["input_dims"],
        "a_gpu_time_per_step_us": m["gpu_time_per_step_us_a"].fillna(0.0),
        "b_gpu_time_per_step_us": m["gpu_time_per_step_us_b"].fillna(0.0),
        "a_calls_per_step": m["calls_per_step_a"].fillna(0.0), "b_calls_per_step": m["calls_per_step_b"].fillna(0.0),
        "a_top_kernel": m["top_kernel_a"].fillna(""), "b_top_kernel": m["top_kernel_b"].fillna(""),
        "matched": m["_merge"].eq("both")})
    out["time_change_us"] = out["b_gpu_time_per_step_us"] - out["a_gpu_time_per_step_us"]
    a_us = out["a_gpu_time_per_step_us"]
    out["time_ratio"] = np.where(a_us > 0, out["b_gpu_time_per_step_us"] / a_us.where(a_us > 0, 1.0), np.nan)
    out = out[cols]
    return out.reindex(out["time_change_us"].abs().sort_values(ascending=False).index).reset_index(drop=True)
