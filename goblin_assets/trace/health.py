"""Is a recorded trace complete enough for the analyses, and what does each gap in it cost?

Each check returns :class:`~goblin_assets.trace.severity.Finding` objects of
``analysis='health'``; ``evidence`` holds the numbers behind them.  The
checks and what each gap loses:

* ``no_device_properties`` / ``unknown_device``: no ``deviceProperties`` or a
  device name not in :data:`goblin_assets.runners.peaks.PEAKS`: no peak, so
  no ``pct_of_peak`` in :func:`goblin_assets.trace.ops.op_roofline`.
* ``no_steps``: no ``ProfilerStep#N`` windows: per-step analyses see one
  window over the whole trace.  ``step_without_device_events``: a step that
  launched no device event (an empty or truncated step).  ``step_cut_off``:
  a step window reaching past the last recorded event, or device events
  launched in the last step ending after every host event (the trace was
  stopped while the device was still busy).
* ``unmatched_kernels``: device events whose ``correlation`` has no runtime
  launch (the host side of the launch was dropped; they count nowhere in op
  tables); ``unmatched_launches``: launch / memcpy / memset runtime calls
  with no device event (dropped device events).  Kineto links the two by
  ``args.correlation`` (HTA ``trace/correlation`` handling, TraceLens
  ``Trace2Tree``).  Severity ours: moderate when any, high at 5% or more.
* ``flag_off``: ``record_shapes`` (no op/shape roofline), ``with_stack`` (no
  Python frame for sync root causes, stack-based recompute detection),
  ``profile_memory`` (no memory timeline); off when the trace says so, or
  when it does not say and its events show it (no ``Input Dims``, no
  ``python_function`` events).
* ``no_host_side``: rocprofv3 output: kernels only, no ops, launches, steps.
* ``graph_launched``: device time launched from CUDA/HIP graphs
  (``cudaGraphLaunch`` / ``hipGraphLaunch``: every kernel of a replayed graph
  carries the launch call's ``correlation``; :func:`graph_share`).  Those
  kernels have no op of their own in the trace (the ops ran once, at
  capture), so op tables, launch statistics and op rooflines see only the
  rest.  Reported whenever a trace holds graph launches, as TraceLens's
  inference report warns on any ``hipGraphLaunch`` without a graph capture
  ("the analysis might be limited",
  ``TraceLens/Reporting/generate_perf_report_pytorch_inference.py``); graded
  by ``THRESHOLDS['graph_hidden_pct']``, past whose moderate share per-op
  findings are marked unreliable (:func:`mark_unreliable`).
"""
from __future__ import annotations

import numpy as np

from goblin_assets.errors import GoblinError
from goblin_assets.runners.peaks import lookup_gpu_peak
from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.ops import launched_gpu_us
from goblin_assets.trace.severity import THRESHOLDS, Finding, graded

_LAUNCH = r"Launch|Memcpy|Memset"
_FLAG_LOSS = {
    "record_shapes": "no per-op-and-shape roofline (ops.op_roofline is empty): no Input Dims to count FLOPs from",
    "with_stack": "no Python frame for sync root causes; recompute is found from autograd-thread ops instead of "
                  "checkpoint frames",
    "profile_memory": "no memory timeline (allocation peaks per step are unknown)",
}


def _f(kind: str, message: str, severity: str = "moderate", status: str = "measured", **evidence) -> Finding:
    return Finding(analysis="health", kind=kind, message=message, severity=severity, status=status, evidence=evidence)


def _flag_findings(ev: TraceEvents) -> list[Finding]:
    inferred = {"record_shapes": ev.cpu_ops["input_dims"].notna().any(), "with_stack": not ev.python.empty}
    out = []
    for flag, loss in _FLAG_LOSS.items():
        stated = ev.flags.get(flag)
        on = stated if stated is not None else inferred.get(flag)
        if on is False or (on is not None and not on):
            how = "off" if stated is not None else "not stated and no events show it"
            out.append(_f("flag_off", f"{flag} {how}: {loss}", status="not_observable", flag=flag, stated=stated))
    return out


def _step_findings(ev: TraceEvents) -> list[Finding]:
    if not ev.has_steps:
        return [_f("no_steps", "no ProfilerStep#N windows: per-step analyses see the whole trace as one window",
                   status="not_observable")]
    out, steps = [], ev.steps
    launched = np.zeros(len(steps))
    for tid in ev.runtime["tid"].dropna().unique():  # every launching thread, whole step windows
        launched += launched_gpu_us(ev, np.full(len(steps), tid, dtype=object), steps["start_us"], steps["end_us"])
    for s in steps.loc[launched == 0, "step"]:
        out.append(_f("step_without_device_events", f"ProfilerStep#{s} launched no device event (empty or truncated)",
                      step=int(s)))
    host_end = max(ev.cpu_ops["end_us"].max(), ev.runtime["end_us"].max())
    last_end = max(host_end, ev.kernels["end_us"].max() if not ev.kernels.empty else -np.inf)
    last = steps.iloc[-1]
    late = ev.kernels.merge(ev.runtime[["correlation", "ts_us"]], on="correlation", suffixes=("", "_launch"))
    late = late[(late["ts_us_launch"] >= last["start_us"]) & (late["end_us"] > host_end)]
    cut = steps[steps["end_us"] > last_end]
    for s in cut["step"]:
        out.append(_f("step_cut_off", f"ProfilerStep#{s} ends after the last recorded event", step=int(s)))
    if len(late):
        out.append(_f("step_cut_off", f"ProfilerStep#{int(last['step'])}: {len(late)} device events launched in it "
                      "end after the last host event (trace stopped while the device was busy)",
                      step=int(last["step"]), events=len(late)))
    return out


def _link_findings(ev: TraceEvents) -> list[Finding]:
    k, rt = ev.kernels, ev.runtime
    out = []
    lost_k = k[~k["correlation"].isin(rt["correlation"].dropna())]
    launches = rt[rt["name"].str.contains(_LAUNCH)]
    lost_rt = launches[~launches["correlation"].isin(k["correlation"].dropna())]
    for kind, lost, total, what in (("unmatched_kernels", lost_k, len(k), "device events without a runtime launch"),
                                    ("unmatched_launches", lost_rt, len(launches),
                                     "launch/copy runtime calls without a device event")):
        if len(lost):
            pct = 100.0 * len(lost) / max(total, 1)
            first_host = ev.cpu_ops["ts_us"].min() if not ev.cpu_ops.empty else float("inf")
            early = int((lost["ts_us"] < first_host).sum()) if kind == "unmatched_kernels" else 0
            note = (f"; {early} of them run before the first recorded host event (the host side started later "
                    "or its events were dropped)") if early else ""
            out.append(Finding(analysis="health", kind=kind,
                               message=f"{len(lost)} of {total} {what} ({pct:.1f}%){note}",
                               value=pct, unit="%", severity="high" if pct >= 5 else "moderate",
                               threshold_source="ours: any is moderate, 5% or more high",
                               evidence={"count": len(lost), "total": total, "before_host_events": early,
                                         "top_names": lost["name"].value_counts().head(5).to_dict()}))
    return out


#: Host calls that replay a captured graph (TraceLens Trace2Tree ``graph_launch_names``).
GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch")
#: Analyses whose findings are per op (or per launch) and so miss graph-launched kernels.
PER_OP_ANALYSES = ("ops", "launch", "recompute", "critical_path")


def graph_share(ev: TraceEvents) -> dict:
    """Device time launched from graphs: ``graph_launches`` (count), ``graph_device_us`` (µs, summed
    durations of the device events correlated to a graph launch), ``device_us`` (µs, all device events),
    ``share_pct`` (%, their ratio; 0 without device events)."""
    rt = ev.runtime
    g = rt[rt["name"].isin(GRAPH_LAUNCHES)] if not rt.empty else rt
    k = ev.kernels
    total = float(k["dur_us"].sum()) if not k.empty else 0.0
    hidden = float(k.loc[k["correlation"].isin(g["correlation"].dropna()), "dur_us"].sum()) if len(g) else 0.0
    return {"graph_launches": int(len(g)), "graph_device_us": hidden, "device_us": total,
            "share_pct": 100.0 * hidden / total if total > 0 else 0.0}


def _graph_findings(ev: TraceEvents) -> list[Finding]:
    gs = graph_share(ev)
    if not gs["graph_launches"]:
        return []
    return [graded("health", "graph_launched", "graph_hidden_pct", round(gs["share_pct"], 2),
                   f"{gs['share_pct']:.1f}% of device time ({gs['graph_device_us'] / 1e3:.2f} ms) is launched from "
                   f"{gs['graph_launches']} CUDA/HIP graph launch(es): those kernels have no op in the trace, so "
                   "per-op tables and findings see only the rest", **gs)]


def mark_unreliable(findings: list[Finding], ev: TraceEvents) -> list[Finding]:
    """Mark the per-op findings (:data:`PER_OP_ANALYSES`) unreliable when the graph share reaches the moderate
    grade of ``THRESHOLDS['graph_hidden_pct']``: ``evidence['unreliable']`` says why and the message ends so."""
    gs = graph_share(ev)
    if gs["share_pct"] < THRESHOLDS["graph_hidden_pct"].moderate:
        return findings
    why = (f"unreliable: {gs['share_pct']:.0f}% of device time is launched from CUDA/HIP graphs, which this "
           "per-op view cannot attribute")
    for f in findings:
        if f.analysis in PER_OP_ANALYSES:
            f.evidence["unreliable"] = why
            f.message += f" ({why})"
    return findings


def health_check(ev: TraceEvents) -> list[Finding]:
    """Every health finding of ``ev`` (an empty list for a complete trace).

    Raises
    ------
    GoblinError
        ``ev`` is not a :class:`TraceEvents` (use :func:`goblin_assets.trace.events.load_trace`).
    """
    if not isinstance(ev, TraceEvents):
        raise GoblinError(f"health_check: expected TraceEvents from load_trace(), got {type(ev).__name__}")
    out: list[Finding] = []
    if not ev.device_properties:
        out.append(_f("no_device_properties", "no deviceProperties: the device and its peak are unknown, so op "
                      "rooflines have no pct_of_peak", status="not_observable"))
    elif lookup_gpu_peak(ev.device_name) is None:
        out.append(_f("unknown_device", f"device {ev.device_name!r} is not in the peak table: op rooflines have no "
                      "pct_of_peak", status="not_observable", device=ev.device_name))
    if ev.source_format != "kineto":
        out.append(_f("no_host_side", f"{ev.source_format} output has device kernels only: no CPU ops, launches, "
                      "steps or Python frames (no op tables, critical path, recompute)", status="not_observable"))
        return out
    return out + _flag_findings(ev) + _step_findings(ev) + _link_findings(ev) + _graph_findings(ev)
