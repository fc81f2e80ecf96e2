"""Idle-time breakdown per stream: why the stream was idle between two of its kernels.

Definitions are HTA 0.5's (``hta/analyzers/breakdown_analysis.py``
``BreakdownAnalysis._analyze_idle_time_for_stream``, called by
``get_idle_time_breakdown``).  On one stream, sorted by start, every device
event after the first has a gap ``ts - previous end`` (µs; negative when the
previous one overlaps it, and summed as is, as HTA does), attributed to:

* host wait: the event's host launch call started after the previous event
  ended (the CPU did not enqueue work fast enough);
* kernel wait: otherwise, when the gap is below ``consecutive_kernel_delay_us``
  (the overhead of launching back-to-back kernels);
* other wait: everything else (e.g. waiting on an event from another stream).

Unit of the threshold: HTA's docstrings (``trace_analysis.py``
``get_idle_time_breakdown``: "Default = 30 nanoseconds";
``breakdown_analysis.py``: "Time is in ns") say nanoseconds, but the code
compares it directly with ``ts - prev_end_ts`` on the trace's own timestamps,
which are microseconds in a Kineto trace (HTA reports the same values as
``idle_time(us)`` in the temporal breakdown).  The default of 30 is therefore
**30 µs**, and that is what :data:`CONSECUTIVE_KERNEL_DELAY_US` is.

Device events are ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` (HTA's
``kernel_cats``; ``cuda_sync`` events excluded as HTA excludes them here).
The event set and rounding are the caller's choice
(:mod:`goblin_assets.trace.intervals`); ``window="hta"``,
``hta_rounding=True`` reproduce HTA's defaults.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.intervals import Window, select_kernels

#: HTA ``get_idle_time_breakdown(consecutive_kernel_delay=30)``: 30 in the trace's unit, µs (see module docstring).
CONSECUTIVE_KERNEL_DELAY_US = 30.0
CATEGORIES = ("host_wait", "kernel_wait", "other_wait")
COLUMNS = ["device", "stream", "host_wait_us", "kernel_wait_us", "other_wait_us", "idle_us",
           "host_wait_pct", "kernel_wait_pct", "other_wait_pct"]


def idle_breakdown(ev: TraceEvents, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US,
                   window: Window = "hta", hta_rounding: bool = False) -> pd.DataFrame:
    """One row per (device, stream): idle time between its device events by cause.

    Columns: ``device``, ``stream`` (int); ``host_wait_us``,
    ``kernel_wait_us``, ``other_wait_us`` and their sum ``idle_us`` (µs);
    ``host_wait_pct``, ``kernel_wait_pct``, ``other_wait_pct`` (% of that
    stream's ``idle_us``, HTA's ``idle_time_ratio`` × 100; NaN when the stream
    was never idle).  Sorted by device, stream; empty (with these columns)
    when no device event is in the window.

    Raises
    ------
    ValueError
        ``consecutive_kernel_delay_us`` is negative, or an invalid ``window``.
    """
    if consecutive_kernel_delay_us < 0:
        raise ValueError(f"consecutive_kernel_delay_us={consecutive_kernel_delay_us}: must be >= 0")
    k = select_kernels(ev, window, hta_rounding).sort_values(["device", "stream", "ts_us"], kind="stable")
    if k.empty:
        return pd.DataFrame(columns=COLUMNS)
    same = k[["device", "stream"]].eq(k[["device", "stream"]].shift()).all(axis=1).to_numpy()
    prev_end = k["end_us"].shift().to_numpy()
    gap = np.where(same, k["ts_us"].to_numpy() - prev_end, np.nan)
    host = same & (k["launch_ts_us"].to_numpy() > prev_end)
    kernel = same & ~host & (gap < consecutive_kernel_delay_us)
    cause = np.select([host, kernel], ["host_wait", "kernel_wait"], "other_wait")
    k = k.assign(gap=np.nan_to_num(gap), cause=cause)
    out = (k.pivot_table(index=["device", "stream"], columns="cause", values="gap", aggfunc="sum", fill_value=0.0)
           .reindex(columns=list(CATEGORIES), fill_value=0.0))
    out.columns = [f"{c}_us" for c in CATEGORIES]
    out = out.reset_index()
    out["idle_us"] = out[[f"{c}_us" for c in CATEGORIES]].sum(axis=1)
    for c in CATEGORIES:
        out[f"{c}_pct"] = 100 * out[f"{c}_us"] / out["idle_us"].where(out["idle_us"] != 0)
    return out.astype({"device": int, "stream": int})[COLUMNS]
