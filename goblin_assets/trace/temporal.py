"""Temporal breakdown: how much of a device's kernel span is idle, compute and non-compute time.

Definitions are HTA 0.5's (``hta/analyzers/breakdown_analysis.py``
``BreakdownAnalysis.get_temporal_breakdown`` and ``_get_idle_time_for_kernels``),
per device instead of per rank (one Kineto file is one rank):

* ``kernel_time_us``: from the first device event's start to the last merged
  interval's end, over all streams (memcpy / memset included);
* ``idle_time_us``: ``kernel_time_us`` minus the union of all device events
  (HTA ``merge_kernel_intervals``);
* ``compute_time_us``: the union of the COMPUTATION events (HTA
  ``utils/utils.py`` ``get_kernel_type``: not NCCL/RCCL, not memcpy/memset;
  our :func:`goblin_assets.trace.events.hta_kernel_type`);
* ``non_compute_time_us``: the rest, ``kernel_time - compute_time - idle_time``
  (communication and memory time not hidden under compute).

The ``*_pct`` columns are 100 × the time over ``kernel_time_us`` (HTA's
``*_pctg``, unrounded here).  Which events count is the caller's choice
(:mod:`goblin_assets.trace.intervals`: ``window="hta"`` and
``hta_rounding=True`` reproduce ``TraceAnalysis(trace_dir).get_temporal_breakdown()``
with its defaults).  One deviation: HTA also counts ``cuda_sync`` events
("Context Sync", "Stream Sync") as busy COMPUTATION time when it does not
filter by steps; they are waits, not kernels, and are not counted here.
"""
from __future__ import annotations

import pandas as pd

from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.intervals import Window, busy_us, merge, select_kernels

COLUMNS = ["device", "idle_time_us", "compute_time_us", "non_compute_time_us", "kernel_time_us",
           "idle_time_pct", "compute_time_pct", "non_compute_time_pct"]


def temporal_breakdown(ev: TraceEvents, window: Window = "hta", hta_rounding: bool = False) -> pd.DataFrame:
    """One row per device: idle / compute / non-compute time (µs) and their share of the kernel span (%).

    Columns: ``device`` (int), ``idle_time_us``, ``compute_time_us``,
    ``non_compute_time_us``, ``kernel_time_us`` (µs), ``idle_time_pct``,
    ``compute_time_pct``, ``non_compute_time_pct`` (% of ``kernel_time_us``;
    NaN when the span is 0).  ``window`` defaults to HTA's default event set
    (kernels launched before the last profiler step); ``hta_rounding`` to the
    recorded (unrounded) times: see :mod:`goblin_assets.trace.intervals`.
    An empty frame (with these columns) when no device event is in the window.

    Raises
    ------
    ValueError
        An invalid ``window`` (from :func:`~goblin_assets.trace.intervals.select_kernels`).
    """
    k = select_kernels(ev, window, hta_rounding)
    rows = []
    for device, g in k.groupby("device", sort=True):
        starts, ends = merge(g["ts_us"].to_numpy(), g["end_us"].to_numpy())
        span = float(ends[-1] - starts[0])
        idle = span - float((ends - starts).sum())
        comp = g[g["hta_kernel_type"] == "COMPUTATION"]
        compute = busy_us(comp["ts_us"].to_numpy(), comp["end_us"].to_numpy())
        rows.append({"device": int(device), "idle_time_us": idle, "compute_time_us": compute,
                     "non_compute_time_us": span - compute - idle, "kernel_time_us": span})
    out = pd.DataFrame(rows, columns=COLUMNS[:5])
    for c in ("idle_time", "compute_time", "non_compute_time"):
        out[f"{c}_pct"] = 100 * out[f"{c}_us"] / out["kernel_time_us"].where(out["kernel_time_us"] > 0)
    return out[COLUMNS]


def temporal_table(ev: TraceEvents) -> pd.DataFrame:
    """The temporal breakdown twice per device, on HTA's default event set (``window="hta"``):

    ``timing = "recorded"`` on the recorded timestamps (what our findings
    read), and ``timing = "hta_rounded"`` with HTA's µs rounding, the numbers
    ``TraceAnalysis(...).get_temporal_breakdown()`` prints for the same file
    (on traces with many sub-µs kernels the two differ by a few points; on
    the H100 Qwen trace the rounded non-compute time is negative, which is
    why HTA's own assertion fails there).  Columns: ``timing`` then those of
    :func:`temporal_breakdown`.
    """
    parts = []
    for timing, rounding in (("recorded", False), ("hta_rounded", True)):
        t = temporal_breakdown(ev, window="hta", hta_rounding=rounding)
        t.insert(0, "timing", timing)
        parts.append(t)
    return pd.concat(parts, ignore_index=True)
