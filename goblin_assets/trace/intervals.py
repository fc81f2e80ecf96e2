"""Interval helpers shared by the trace analyses: which device events to analyse, and merged busy time.

Two choices decide a trace's totals, and every analysis takes them as
explicit arguments so that a caller can reproduce Holistic Trace Analysis
(HTA 0.5) or deliberately not:

``window`` (:data:`Window`)
    ``None``: every device event of the trace.
    ``"hta"``: HTA's default event set (``TraceAnalysis(...)`` with
    ``include_last_profiler_step=False``; ``hta/common/trace.py``
    ``Trace._filter_irrelevant_gpu_kernels``): when the trace holds at least
    two distinct ``ProfilerStep#N`` names, keep only the device events whose
    correlated host call (by ``correlation``) *starts before the last
    profiler step starts*.  There is no lower bound: events launched before
    the first step stay, and device events without a correlated host call
    are dropped.  With fewer than two steps (or none) HTA keeps everything.
    "The last profiler step starts" is HTA's ``max(ts)`` over every event
    named ``ProfilerStep#N``, which includes the GPU-side copies Kineto
    writes as ``gpu_user_annotation`` (their ``stream`` is -1, so HTA's
    ``CPUOperatorFilter`` keeps them): the cut-off is the later of the host
    step's start and its GPU annotation's start (on the MI300X ResNet trace
    that keeps 2,685 device events instead of 1,790); the loader keeps them as
    ``ev.gpu_steps`` (:func:`step_annotations`).
    ``"hta_last"``: the same with ``include_last_profiler_step=True``: the host
    call starts at or before the latest end of any ``ProfilerStep#N`` event.
    ``(start_us, end_us)``: device events that start inside ``[start, end)``
    (e.g. :meth:`TraceEvents.window` of one step).

``hta_rounding``
    HTA's parser rounds float (ns-resolution) timestamps to whole µs before any
    analysis (``hta/common/trace_parser.py`` ``round_down_time_stamps``: start
    ``ceil(ts)``, end ``floor(ts + dur)``, so ``dur = end - start``; it is off
    only when the environment sets ``HTA_DISABLE_NS_ROUNDING=1``).  A
    sub-µs kernel then gets a duration of 0 or -1 µs, which shrinks compute
    time on traces with many short kernels by several percentage points (MI300X
    ResNet: compute 30.1% rounded vs 34.0% exact) and makes HTA's temporal
    breakdown fail its own ``assert non_compute_time >= 0`` on the H100 Qwen
    trace.  ``hta_rounding=True`` reproduces the rounding (also of the host
    call's start, which the idle and launch analyses compare against);
    ``False`` (the default of our analyses) keeps the recorded times.
"""
from __future__ import annotations

from typing import Literal, Union

import numpy as np
import pandas as pd

from goblin_assets.trace.events import TraceEvents

Window = Union[None, Literal["hta", "hta_last"], tuple[float, float]]


def merge(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals ``[ts, end)`` (µs) into disjoint ``(starts, ends)``, in start order.

    Same rule as HTA ``utils/utils.py`` ``merge_kernel_intervals``: sorted by
    start, an interval opens a new group when it starts strictly after the
    largest end seen so far; a group spans its smallest start to its largest
    end (so a negative-duration interval is kept as HTA keeps it).
    """
    ts = np.asarray(ts, dtype=float)
    end = np.asarray(end, dtype=float)
    if ts.size == 0:
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    prev_max = np.maximum.accumulate(end)
    new = np.empty(ts.size, dtype=bool)
    new[0] = True
    new[1:] = ts[1:] > prev_max[:-1]
    group = np.cumsum(new) - 1
    starts = ts[new]
    ends = np.full(starts.size, -np.inf)
    np.maximum.at(ends, group, end)
    return starts, ends


def busy_us(ts: np.ndarray, end: np.ndarray) -> float:
    """Total time (µs) covered by the union of intervals ``[ts, end)`` (HTA sums ``end`` minus sums ``ts``; we sum the differences, which keeps µs precision on 1e12 µs clocks)."""
    starts, ends = merge(ts, end)
    return float((ends - starts).sum())


def launch_ts(ev: TraceEvents) -> pd.Series:
    """Start (µs) of each device event's correlated host call (NaN when none), aligned to ``ev.kernels``."""
    if ev.runtime.empty or ev.kernels.empty:
        return pd.Series(np.nan, index=ev.kernels.index, dtype=float)
    first = ev.runtime.dropna(subset=["correlation"]).drop_duplicates("correlation").set_index("correlation")
    return ev.kernels["correlation"].map(first["ts_us"]).astype(float)


def step_annotations(ev: TraceEvents) -> pd.DataFrame:
    """``start_us`` / ``end_us`` of every ``ProfilerStep`` event HTA sees: host steps plus GPU-side annotations.

    The GPU-side copies are the ``gpu_user_annotation`` steps (``ev.gpu_steps``).
    """
    parts = [f[["start_us", "end_us"]].astype(float) for f in (ev.steps, ev.gpu_steps) if not f.empty]
    if not parts:
        return pd.DataFrame({"start_us": pd.Series(dtype=float), "end_us": pd.Series(dtype=float)})
    return pd.concat(parts, ignore_index=True)


def select_kernels(ev: TraceEvents, window: Window = None, hta_rounding: bool = False) -> pd.DataFrame:
    """The device events an analysis should use (see the module docstring for ``window`` and ``hta_rounding``).

    Returns a copy of ``ev.kernels`` restricted to the window, with one added
    column ``launch_ts_us`` (start of the correlated host call, NaN when none;
    ceiled with ``hta_rounding``).  With ``hta_rounding`` ``ts_us`` / ``end_us``
    / ``dur_us`` are HTA's rounded values.

    Raises
    ------
    ValueError
        ``window`` is a string other than ``"hta"`` / ``"hta_last"``, or a
        tuple whose start is after its end.
    """
    k = ev.kernels.copy()
    k["launch_ts_us"] = launch_ts(ev)
    if isinstance(window, str):
        if window not in ("hta", "hta_last"):
            raise ValueError(f"window {window!r}: expected None, 'hta', 'hta_last' or (start_us, end_us)")
        if len(ev.steps) >= 2:
            steps = step_annotations(ev)
            launched = k["launch_ts_us"].notna()
            if window == "hta":
                k = k[launched & (k["launch_ts_us"] < steps["start_us"].max())]
            else:
                k = k[launched & (k["launch_ts_us"] <= steps["end_us"].max())]
    elif window is not None:
        a, b = (float(x) for x in window)
        if a > b:
            raise ValueError(f"window ({a}, {b}): start after end")
        k = k[(k["ts_us"] >= a) & (k["ts_us"] < b)]
    if hta_rounding:
        k = hta_round(k)
        k["launch_ts_us"] = np.ceil(k["launch_ts_us"])
    return k.reset_index(drop=True)


def hta_round(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with HTA's µs rounding: ``ts_us`` ceiled, ``end_us`` floored, ``dur_us = end_us - ts_us``.

    Source: HTA ``common/trace_parser.py`` ``round_down_time_stamps``.
    """
    df = df.copy()
    df["ts_us"] = np.ceil(df["ts_us"])
    df["end_us"] = np.floor(df["end_us"])
    df["dur_us"] = df["end_us"] - df["ts_us"]
    return df
