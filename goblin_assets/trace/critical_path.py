"""What bounds each profiler step (a lightweight critical path), and which host syncs leave the device idle.

The idea is HTA's critical-path analysis (``hta/analyzers/critical_path_analysis.py``:
the longest path through CPU-op, kernel-launch, kernel and sync edges, whose
share on each resource says what bounds the step), reduced to interval
arithmetic over one step window:

* ``device_busy_us``: the union of all device events (kernels, memcpy,
  memset, every stream) inside the window; the rest of the window is device
  idle time, which is what a host-side bound costs.
* Each device idle gap is charged to one cause: ``sync`` when a blocking sync
  was already waiting when the device went idle and returned in the gap (the host waited for the queue to drain, so the device had
  to wait for the next launch: HTA's sync edge followed by a launch edge),
  else ``loader`` when a DataLoader ``__next__`` range overlaps it, else
  ``launch`` (the host was too slow to keep the queue fed).
* Blocking syncs: runtime calls ``{cuda,hip}{Device,Stream,Event}Synchronize``,
  ``{cuda,hip}Memcpy`` / ``hipMemcpyWithStream`` (synchronous copies), and
  ``*MemcpyAsync`` whose copy goes to or from pageable memory (the CUDA
  runtime API docs, "API synchronization behavior": such async copies are
  synchronous), plus Kineto ``cuda_sync`` events ``Stream Sync`` /
  ``Context Sync`` / ``Event Sync`` (HTA ``CUDA_SYNC`` handling; ``Stream
  Wait Event`` is a device-side wait and is left out).

Verdict: ``device_bound`` when device idle is under the moderate
``THRESHOLDS['idle_pct']`` (5% of the window), otherwise the cause with the
most idle time (``sync_bound``, ``loader_bound``, ``cpu_launch_bound``).
A trace without ``ProfilerStep`` windows is one window over all its events
(``step`` = -1).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from goblin_assets.trace.events import TraceEvents, TraceReadError
from goblin_assets.trace.intervals import merge
from goblin_assets.trace.ops import require_kineto
from goblin_assets.trace.severity import THRESHOLDS, Finding, graded

CRITICAL_COLS = ["step", "window_us", "device_busy_us", "device_idle_us", "host_busy_us", "sync_wait_us",
                 "loader_wait_us", "idle_after_sync_us", "idle_loader_us", "idle_launch_us", "verdict", "ops_on_path"]
ROOT_COLS = ["step", "gap_start_us", "gap_us", "sync_call", "sync_ts_us", "sync_us", "python_frame", "cpu_op"]
_SYNC_CALL = re.compile(r"^(cuda|hip)(Device|Stream|Event)Synchronize$|^(cuda|hip)Memcpy$|^hipMemcpyWithStream$")
_SYNC_EVENTS = ("Stream Sync", "Context Sync", "Event Sync")
#: Tolerance (µs) for host/device clock skew when matching a sync to a device idle gap (ours).
_TOL_US = 5.0


def _length(a, b, lo: float, hi: float) -> float:
    a, b = merge(np.clip(np.asarray(a, float), lo, hi), np.clip(np.asarray(b, float), lo, hi))
    return float((b - a).sum())


def blocking_syncs(ev: TraceEvents) -> pd.DataFrame:
    """Host runtime calls that block until the device has drained (``name``, ``ts_us``, ``end_us``, ``dur_us``, ``tid``)."""
    rt = ev.runtime
    pageable = ev.kernels.loc[ev.kernels["name"].str.contains("Pageable"), "correlation"].dropna()
    hit = rt["name"].str.match(_SYNC_CALL) | (rt["name"].str.contains("Memcpy") & rt["correlation"].isin(pageable))
    return rt[hit]


def _windows(ev: TraceEvents) -> pd.DataFrame:
    if ev.has_steps:
        return ev.steps[["step", "start_us", "end_us"]].reset_index(drop=True)
    lo = min(ev.kernels["ts_us"].min(), ev.cpu_ops["ts_us"].min())
    hi = max(ev.kernels["end_us"].max(), ev.cpu_ops["end_us"].max())
    return pd.DataFrame({"step": [-1], "start_us": [lo], "end_us": [hi]})


def _gaps(ev: TraceEvents, lo: float, hi: float, syncs: pd.DataFrame) -> pd.DataFrame:
    """Device idle gaps in ``[lo, hi]`` with their cause (sync | loader | launch) and the sync that returned in them."""
    k = ev.kernels[(ev.kernels["end_us"] > lo) & (ev.kernels["ts_us"] < hi)]
    a, b = merge(np.clip(k["ts_us"].to_numpy(), lo, hi), np.clip(k["end_us"].to_numpy(), lo, hi))
    g0, g1 = np.concatenate([[lo], b]), np.concatenate([a, [hi]])
    gaps = pd.DataFrame({"gap_start_us": g0, "gap_end_us": g1})
    gaps = gaps[gaps["gap_end_us"] > gaps["gap_start_us"]].reset_index(drop=True)
    gaps["gap_us"] = gaps["gap_end_us"] - gaps["gap_start_us"]
    s0, s1 = syncs["ts_us"].to_numpy()[None, :], syncs["end_us"].to_numpy()[None, :]
    a0, a1 = gaps["gap_start_us"].to_numpy()[:, None], gaps["gap_end_us"].to_numpy()[:, None]
    hit = (s0 <= a0 + _TOL_US) & (s1 >= a0 - _TOL_US) & (s1 <= a1)  # blocked while the device drained
    has = hit.any(axis=1)
    first = hit.argmax(axis=1) if hit.shape[1] else np.zeros(len(gaps), dtype=int)  # no blocking sync at all
    gaps["sync_row"] = np.where(has, first, -1)
    la, lb = merge(ev.loader["ts_us"].to_numpy(float), ev.loader["end_us"].to_numpy(float))
    in_loader = np.searchsorted(lb, gaps["gap_start_us"].to_numpy(), "right") < np.searchsorted(
        la, gaps["gap_end_us"].to_numpy(), "left")
    gaps["cause"] = np.where(has, "sync", np.where(in_loader, "loader", "launch"))
    return gaps


def _ops_during(ev: TraceEvents, gaps: pd.DataFrame, top: int) -> list[dict]:
    """The CPU ops the host was running during ``gaps`` (µs of overlap per op name, largest first)."""
    if gaps.empty or ev.cpu_ops.empty:
        return []
    g0, g1 = gaps["gap_start_us"].to_numpy(), gaps["gap_end_us"].to_numpy()
    cum = np.concatenate([[0.0], np.cumsum(g1 - g0)])

    def covered(t):  # idle-gap length before time t
        i = np.searchsorted(g0, t, "right")
        return cum[i - 1 + (i == 0)] * (i > 0) + np.where(i > 0, np.minimum(t, g1[i - 1]) - g0[i - 1], 0.0)

    ops = ev.cpu_ops
    overlap = covered(ops["end_us"].to_numpy()) - covered(ops["ts_us"].to_numpy())
    s = pd.Series(overlap, index=ops["name"]).groupby(level=0).sum().nlargest(top)
    return [{"name": n, "us": round(float(v), 3)} for n, v in s.items() if v > 0]


def _device_ops(ev: TraceEvents, lo: float, hi: float, top: int) -> list[dict]:
    k = ev.kernels[(ev.kernels["ts_us"] >= lo) & (ev.kernels["ts_us"] < hi)]
    names = k["external_id"].map(ev.cpu_ops.drop_duplicates("external_id").set_index("external_id")["name"])
    s = k["dur_us"].groupby(names.fillna(k["name"]).to_numpy()).sum().nlargest(top)
    return [{"name": n, "us": round(float(v), 3)} for n, v in s.items()]


def critical_path(ev: TraceEvents, top: int = 5) -> pd.DataFrame:
    """What bounds each step, with the numbers behind the verdict.

    Columns
    -------
    ``step`` (-1: the whole trace when it has no steps), ``window_us``,
    ``device_busy_us``, ``device_idle_us`` (window minus busy),
    ``host_busy_us`` (union of CPU ops and runtime calls, minus blocking sync
    calls), ``sync_wait_us`` (union of blocking sync calls and ``cuda_sync``
    events), ``loader_wait_us`` (union of DataLoader ranges),
    ``idle_after_sync_us`` / ``idle_loader_us`` / ``idle_launch_us`` (device
    idle charged to each cause), ``verdict`` (cpu_launch_bound | sync_bound |
    loader_bound | device_bound), ``ops_on_path`` (list of ``{name, us}``, the
    top ``top`` ops on the bound resource: by GPU time for device_bound, by
    host time overlapping the charged idle gaps otherwise).  All times in µs.

    Raises
    ------
    TraceReadError
        ``ev`` is not a Kineto :class:`TraceEvents` (no host side), or records no device events.
    """
    require_kineto(ev, "critical_path")
    if ev.kernels.empty:
        raise TraceReadError(f"{ev.path}: critical_path needs device events (kernel, gpu_memcpy, gpu_memset) and "
                             "the trace records none (a CPU-only trace, or a CUPTI-profiler trace of cuda_profiler_range events)")
    syncs = blocking_syncs(ev)
    dev_sync = ev.syncs[ev.syncs["name"].isin(_SYNC_EVENTS)]
    host = pd.concat([ev.cpu_ops[["ts_us", "end_us"]], ev.runtime[["ts_us", "end_us"]]])
    rows = []
    for step, lo, hi in _windows(ev).itertuples(index=False):
        gaps = _gaps(ev, lo, hi, syncs)
        idle = gaps.groupby("cause")["gap_us"].sum()
        window = hi - lo
        sync_wait = _length(np.r_[syncs["ts_us"], dev_sync["ts_us"]], np.r_[syncs["end_us"], dev_sync["end_us"]], lo, hi)
        row = {"step": int(step), "window_us": window, "device_idle_us": float(gaps["gap_us"].sum()),
               "host_busy_us": _length(host["ts_us"], host["end_us"], lo, hi)
               - _length(syncs["ts_us"], syncs["end_us"], lo, hi),
               "sync_wait_us": sync_wait, "loader_wait_us": _length(ev.loader["ts_us"], ev.loader["end_us"], lo, hi),
               **{f"idle_{c}_us": float(idle.get(k, 0.0)) for c, k in
                  (("after_sync", "sync"), ("loader", "loader"), ("launch", "launch"))}}
        row["device_busy_us"] = window - row["device_idle_us"]
        if 100.0 * row["device_idle_us"] / max(window, 1e-9) < THRESHOLDS["idle_pct"].moderate:
            row["verdict"], row["ops_on_path"] = "device_bound", _device_ops(ev, lo, hi, top)
        else:
            cause = idle.idxmax()
            row["verdict"] = {"sync": "sync_bound", "loader": "loader_bound", "launch": "cpu_launch_bound"}[cause]
            row["ops_on_path"] = _ops_during(ev, gaps[gaps["cause"] == cause].reset_index(drop=True), top)
        rows.append(row)
    return pd.DataFrame(rows, columns=CRITICAL_COLS)


def _innermost(frame: pd.DataFrame, tid, ts: float, end: float) -> str | None:
    """Name of the shortest event of ``frame`` on ``tid`` enclosing ``[ts, end]`` (None when none does)."""
    if frame.empty:
        return None
    hit = frame[(frame["tid"] == tid) & (frame["ts_us"] <= ts) & (frame["end_us"] >= end)]
    return None if hit.empty else str(hit.loc[hit["dur_us"].idxmin(), "name"])


def sync_root_causes(ev: TraceEvents, min_gap_us: float = 50.0) -> pd.DataFrame:
    """The device idle gaps longer than ``min_gap_us`` that follow a blocking sync, and where the sync came from.

    ``min_gap_us`` defaults to 50 µs, HTA's ``runtime_cutoff`` for a slow
    launch (``THRESHOLDS['launch_cpu_us']``): a gap shorter than one slow
    launch is not worth a root cause.

    Columns
    -------
    ``step`` (-1 without steps), ``gap_start_us``, ``gap_us`` (µs of device
    idle), ``sync_call`` (the runtime call's name), ``sync_ts_us``,
    ``sync_us`` (the call's duration, µs), ``python_frame`` (the innermost
    ``python_function`` frame on the sync's thread enclosing it; None
    without ``with_stack``), ``cpu_op`` (the innermost CPU op enclosing it).
    Sorted by ``gap_us``, largest first.

    Raises
    ------
    TraceReadError
        ``ev`` is not a Kineto :class:`TraceEvents` (no host side).
    """
    require_kineto(ev, "sync_root_causes")
    syncs = blocking_syncs(ev).reset_index(drop=True)
    rows = []
    for step, lo, hi in _windows(ev).itertuples(index=False):
        gaps = _gaps(ev, lo, hi, syncs)
        for g in gaps[(gaps["cause"] == "sync") & (gaps["gap_us"] > min_gap_us)].itertuples():
            s = syncs.iloc[g.sync_row]
            rows.append({"step": int(step), "gap_start_us": g.gap_start_us, "gap_us": g.gap_us,
                         "sync_call": s["name"], "sync_ts_us": s["ts_us"], "sync_us": s["dur_us"],
                         "python_frame": _innermost(ev.python, s["tid"], s["ts_us"], s["end_us"]),
                         "cpu_op": _innermost(ev.cpu_ops, s["tid"], s["ts_us"], s["end_us"])})
    out = pd.DataFrame(rows, columns=ROOT_COLS)
    return out.sort_values("gap_us", ascending=False, kind="stable").reset_index(drop=True)


def critical_path_findings(ev: TraceEvents, table: pd.DataFrame, roots: pd.DataFrame) -> list[Finding]:
    """Graded findings from :func:`critical_path` and :func:`sync_root_causes`.

    * ``critical_path/<verdict>``: the verdict most steps share, graded by
      the median step's device idle share (``THRESHOLDS['idle_pct']``);
      evidence: verdicts per step, the ops on the path of the worst step.
    * ``critical_path/sync_wait``: the median step's blocking-sync time share
      (``THRESHOLDS['sync_pct']``), with the sync that left the longest idle
      gap and its Python frame (or CPU op) when there is one.
    * ``critical_path/loader_wait``: the median step's DataLoader share
      (``THRESHOLDS['input_wait_pct']``, xprof's input-bound grades), when any.
    """
    if table.empty:
        return []
    window = table["window_us"].clip(lower=1e-9)
    idle_pct = 100.0 * table["device_idle_us"] / window
    verdict = str(table["verdict"].mode().iloc[0])
    worst = table.loc[idle_pct.idxmax()]
    out = [graded("critical_path", verdict, "idle_pct", float(idle_pct.median()),
                  f"{(table['verdict'] == verdict).sum()} of {len(table)} steps are {verdict.replace('_', ' ')} "
                  f"(device idle {idle_pct.median():.1f}% of the step, median)",
                  verdicts={int(s): v for s, v in zip(table["step"], table["verdict"])},
                  ops_on_path=list(worst["ops_on_path"]))]
    sync_pct = float((100.0 * table["sync_wait_us"] / window).median())
    if sync_pct > 0:
        top = roots.iloc[0] if not roots.empty else None
        where = "" if top is None else (f"; longest idle gap {top['gap_us']:.0f} µs after {top['sync_call']} in "
                                        f"{top['python_frame'] or top['cpu_op'] or 'an unrecorded caller'}")
        out.append(graded("critical_path", "sync_wait", "sync_pct", sync_pct,
                          f"the host waits in blocking syncs {sync_pct:.1f}% of the step{where}",
                          root_causes=roots.head(5).to_dict("records")))
    loader_pct = float((100.0 * table["loader_wait_us"] / window).median())
    if loader_pct > 0:
        out.append(graded("critical_path", "loader_wait", "input_wait_pct", loader_pct,
                          f"the DataLoader holds the host {loader_pct:.1f}% of the step"))
    return out
