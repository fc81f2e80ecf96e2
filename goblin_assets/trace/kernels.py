"""Kernel time by category and group of the category table, and the kernels that take the most time.

The counterpart of HTA 0.5's kernel breakdown (``hta/analyzers/breakdown_analysis.py``
``BreakdownAnalysis.get_gpu_kernel_breakdown``, which splits kernel time by
COMMUNICATION / MEMORY / COMPUTATION and then by kernel name), with our
category table (:mod:`goblin_assets.runners.categories`: ``category`` such as
``gemm`` / ``attention_forward`` and its coarse ``group``) in place of HTA's
three types.  Times are summed durations (µs) of the device events, not
merged intervals: overlapping kernels on different streams each count, as in
HTA's kernel breakdown, so ``share_pct`` columns sum to 100.
"""
from __future__ import annotations

import pandas as pd

from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.intervals import Window, select_kernels

BREAKDOWN_COLUMNS = ["category", "group", "count", "total_us", "mean_us", "share_pct"]
TOP_COLUMNS = ["name", "category", "group", "count", "total_us", "mean_us", "share_pct"]


def _summary(k: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    out = (k.groupby(keys, sort=False, dropna=False)["dur_us"].agg(count="size", total_us="sum", mean_us="mean")
           .reset_index())
    total = float(k["dur_us"].sum())
    out["share_pct"] = 100 * out["total_us"] / total if total > 0 else float("nan")
    return out.sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)


def kernel_breakdown(ev: TraceEvents, window: Window = None) -> pd.DataFrame:
    """Device-event time per (category, group), most time first.

    Columns: ``category``, ``group`` (str; memcpy / memset are ``memory``),
    ``count`` (int), ``total_us``, ``mean_us`` (µs), ``share_pct`` (% of
    the summed duration of all device events in the window).  ``window`` as in
    :func:`goblin_assets.trace.intervals.select_kernels` (default: all events).
    Empty (with these columns) when the window holds no device event.

    Raises
    ------
    ValueError
        An invalid ``window``.
    """
    k = select_kernels(ev, window)
    if k.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    return _summary(k, ["category", "group"])[BREAKDOWN_COLUMNS]


def top_kernels(ev: TraceEvents, n: int = 10, window: Window = None) -> pd.DataFrame:
    """The ``n`` kernel names with the most summed time.

    Columns: ``name``, ``category``, ``group``, ``count``, ``total_us``,
    ``mean_us``, ``share_pct`` (as in :func:`kernel_breakdown`, per name).

    Raises
    ------
    ValueError
        ``n`` < 1, or an invalid ``window``.
    """
    if n < 1:
        raise ValueError(f"n={n}: must be >= 1")
    k = select_kernels(ev, window)
    if k.empty:
        return pd.DataFrame(columns=TOP_COLUMNS)
    return _summary(k, ["name", "category", "group"]).head(n)[TOP_COLUMNS]
