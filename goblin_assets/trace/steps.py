"""Every profiled step of a trace: its time, the outliers past 1.5x the median step and what ran in them, drift.

A median over the profiled window averages away the steps that go wrong
(checkpoint saves, evaluation, garbage collection, recompiles, data stalls).
Here each step keeps its own row (:func:`step_table`): its duration and
buckets (µs, from the audit's per-step summary,
:class:`goblin_assets.runners.trace.StepIntervals`): ``compute_us`` (GPU
traces: device time of non-collective kernels; CPU traces: the ops' own time
outside the loader and collectives), ``loader_us`` (DataLoader ``__next__``),
``sync_us`` (blocking host-device syncs: the runtime's synchronize calls and
``cuda_sync`` events), ``collective_us`` and ``host_us`` (the rest of the
step: Python and host work no op records, e.g. a ``time.sleep``).

A step is an **outlier** when it takes more than
:data:`~goblin_assets.measure.step_outliers.OUTLIER_RATIO` (1.5) times the
median step, TraceLens's criterion for keeping a trace (the same rule as the
audit's own runs, :mod:`goblin_assets.measure.step_outliers`).  Its ``cause``
is the bucket whose excess over the median normal step's bucket is largest; ``events`` lists what ran in it that a normal step does
not run (a recompile: Dynamo's ``_compile`` / ``compile_inner`` ranges; a
checkpoint save: ``torch.save`` frames; the ``record_function`` ranges and
ops longer than a tenth of the step that the median step lacks), and
``top_ops`` the step's longest outermost ops.  Drift (:func:`step_findings`)
is the median of the last third of the steps over the median of the first
third, minus one.  The time lost to outliers, ``Σ(outlier - median) / Σ
steps``, is graded by ``THRESHOLDS['outlier_step_pct']`` (TraceML's 10 % /
20 % shares).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from goblin_assets.measure.step_outliers import OUTLIER_RATIO, median_buckets, outlier_cause, step_buckets
from goblin_assets.runners.trace import UnionIndex
from goblin_assets.trace.critical_path import blocking_syncs
from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.ops import outermost, require_kineto
from goblin_assets.trace.severity import Finding, graded

STEP_COLS = ["step", "start_us", "step_us", "ratio_to_median", "outlier", "cause", "compute_us", "loader_us", "sync_us",
             "collective_us", "host_us", "top_ops", "events"]
_RECOMPILE = re.compile(r"(^|[._ ])(_compile|compile_inner|call_user_compiler|compile_fx)|TorchDynamo|Dynamo")
_SAVE = re.compile(r"torch/serialization\.py\(\d+\): save$|^torch\.save|^aten::_save")


def step_table(ev: TraceEvents) -> pd.DataFrame:
    """One row per ``ProfilerStep`` (columns :data:`STEP_COLS`, µs; module docstring).

    ``top_ops``: the step's three longest outermost CPU ops (``[{name, us}]``);
    ``events``: what the step ran that the median step did not (``[str]``).
    Empty (same columns) for a trace without steps.

    Raises
    ------
    TraceReadError
        ``ev`` is not a Kineto :class:`TraceEvents`.
    """
    require_kineto(ev, "step_table")
    summary = ev.summary
    if not ev.has_steps or summary is None:
        return pd.DataFrame(columns=STEP_COLS)
    syncs = blocking_syncs(ev)
    u_sync = UnionIndex(list(zip(np.r_[syncs["ts_us"], ev.syncs["ts_us"]], np.r_[syncs["end_us"], ev.syncs["end_us"]])))
    buckets = [step_buckets(s, summary.has_device, u_sync.length(s.start_us, s.end_us)) for s in summary.steps]
    df = pd.DataFrame([{"step": s.index, "start_us": s.start_us, "step_us": s.dur_us,
                        **{f"{k}_us": v for k, v in b.items()}} for s, b in zip(summary.steps, buckets)])
    med = float(df["step_us"].median())
    df["ratio_to_median"] = df["step_us"] / med if med > 0 else np.nan
    df["outlier"] = df["ratio_to_median"] > OUTLIER_RATIO
    normal = median_buckets([b for b, o in zip(buckets, df["outlier"]) if not o])
    df["cause"] = [outlier_cause(b, normal) if o else None for b, o in zip(buckets, df["outlier"])]
    top, notable = _step_contents(ev, df)
    df["top_ops"] = top
    df["events"] = notable
    return df[STEP_COLS]


def _step_contents(ev: TraceEvents, df: pd.DataFrame) -> tuple[list, list]:
    """Per step: its three longest outermost ops, and the names that ran in it but in no normal step."""
    ops = outermost(ev.cpu_ops) if not ev.cpu_ops.empty else ev.cpu_ops
    ann = ev.annotations
    py = ev.python
    names: list[pd.DataFrame] = [f[["name", "ts_us", "dur_us"]].assign(op=is_op) for f, is_op in
                                 ((ops, True), (ann, False)) if not f.empty]
    if not py.empty:
        names.append(py.loc[py["name"].str.contains(_SAVE), ["name", "ts_us", "dur_us"]].assign(op=False))
    allev = pd.concat(names, ignore_index=True) if names else pd.DataFrame(columns=["name", "ts_us", "dur_us", "op"])
    lo, hi = df["start_us"].to_numpy(), (df["start_us"] + df["step_us"]).to_numpy()
    at = np.searchsorted(lo, allev["ts_us"].to_numpy(), "right") - 1 if len(allev) else np.array([], int)
    inside = (at >= 0) & (allev["ts_us"].to_numpy() < hi[np.clip(at, 0, None)]) if len(allev) else at.astype(bool)
    allev = allev[inside].assign(i=at[inside])
    normal = set(allev.loc[allev["i"].isin(np.flatnonzero(~df["outlier"].to_numpy())), "name"])
    op_us = allev[allev["op"].astype(bool)].groupby(["i", "name"])["dur_us"].sum()
    by_step = {i: g.droplevel(0).nlargest(3) for i, g in op_us.groupby(level=0)} if len(op_us) else {}
    groups = dict(tuple(allev.groupby("i"))) if len(allev) else {}
    top, notable = [], []
    for i, r in enumerate(df.itertuples()):
        mine = groups.get(i, allev.iloc[:0])
        top.append([{"name": n, "us": round(float(u), 1)} for n, u in by_step.get(i, pd.Series(dtype=float)).items()])
        ev_names = []
        for name, dur in zip(mine["name"], mine["dur_us"]):
            label = ("recompile: " if _RECOMPILE.search(name) else "checkpoint save: " if _SAVE.search(name) else "")
            if label or (r.outlier and name not in normal and dur >= 0.1 * r.step_us):
                if f"{label}{name}" not in ev_names:
                    ev_names.append(f"{label}{name}")
        notable.append(ev_names)
    return top, notable


def step_findings(table: pd.DataFrame) -> list[Finding]:
    """``outlier_steps`` (graded by the share of run time lost to outliers; evidence: each outlier's step,
    time, ratio, cause, events) and ``step_drift`` (the last third's median over the first third's, ungraded,
    at least six steps).  None for an empty table."""
    if table.empty:
        return []
    out = []
    med = float(table["step_us"].median())
    bad = table[table["outlier"]]
    lost = float((bad["step_us"] - med).sum())
    pct = 100.0 * lost / float(table["step_us"].sum())
    detail = [{"step": int(r.step), "step_us": round(float(r.step_us), 1), "ratio": round(float(r.ratio_to_median), 2),
               "cause": r.cause, "events": r.events} for r in bad.itertuples()]
    if len(bad):
        msg = (f"{len(bad)} of {len(table)} steps exceed {OUTLIER_RATIO}x the {med / 1e3:.2f} ms median: "
               + "; ".join(f"step {d['step']} {d['step_us'] / 1e3:.2f} ms ({d['ratio']}x, {d['cause']}"
                           + (f": {', '.join(d['events'][:2])}" if d["events"] else "") + ")" for d in detail[:6])
               + f"; {pct:.1f}% of the run time is lost to them")
    else:
        msg = f"no step exceeds {OUTLIER_RATIO}x the {med / 1e3:.2f} ms median ({len(table)} steps)"
    out.append(graded("steps", "outlier_steps", "outlier_step_pct", round(pct, 2), msg, outliers=detail,
                      median_step_us=med, steps=len(table)))
    if len(table) >= 6:
        third = len(table) // 3
        first, last = table["step_us"].iloc[:third].median(), table["step_us"].iloc[-third:].median()
        drift = 100.0 * (float(last) / float(first) - 1.0) if first > 0 else 0.0
        out.append(Finding(analysis="steps", kind="step_drift", severity="ok", status="measured", value=round(drift, 2),
                           unit="%", message=f"step time drifts {drift:+.1f}% from the first third of the steps "
                                             f"({first / 1e3:.2f} ms) to the last ({last / 1e3:.2f} ms)",
                           threshold_source="ungraded (reported for trend)",
                           evidence={"first_third_us": float(first), "last_third_us": float(last)}))
    return out
