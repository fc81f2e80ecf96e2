"""One recorded trace, every analysis: the driver behind ``goblin trace``, its asset and ``goblin audit --trace``.

:func:`analyze_trace` reads the file once (:func:`~goblin_assets.trace.events.load_trace`)
and runs each analysis module on it, in this order:

==================  ===========================================================
table               module / function
==================  ===========================================================
temporal            :func:`~goblin_assets.trace.temporal.temporal_table` (recorded and HTA-rounded)
idle                :func:`~goblin_assets.trace.idle.idle_breakdown`
kernel_categories   :func:`~goblin_assets.trace.kernels.kernel_breakdown`
launch              :func:`~goblin_assets.trace.launch.launch_stats`
short_kernels       :func:`~goblin_assets.trace.launch.short_kernels`
ops                 :func:`~goblin_assets.trace.ops.op_roofline`
recompute           :func:`~goblin_assets.trace.recompute.activation_recompute`
critical_path       :func:`~goblin_assets.trace.critical_path.critical_path`
sync_root_causes    :func:`~goblin_assets.trace.critical_path.sync_root_causes`
steps               :func:`~goblin_assets.trace.steps.step_table` (every step, outliers past 1.5x the median)
==================  ===========================================================

plus the graded findings (:mod:`~goblin_assets.trace.severity`) of the launch,
idle, recompute, critical-path, health and exposed-communication
(:mod:`~goblin_assets.trace.comm`) analyses, and the audit's own
RunMetrics and waste budget (:func:`~goblin_assets.trace.metrics.trace_run_metrics`).
Every table goes to the warehouse as ``trace_<table>`` with the analysis's
``trace_id``; findings as ``trace_findings``.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from goblin_assets.contracts import RunMetrics
from goblin_assets.runners.trace import TraceSummary
from goblin_assets.trace import comm, critical_path, health, idle, kernels, launch, ops, recompute, steps, temporal
from goblin_assets.trace.events import TraceEvents, TraceReadError, load_trace, trace_stem
from goblin_assets.trace.metrics import trace_run_metrics, trace_summary
from goblin_assets.trace.severity import Finding

#: table name -> analysis (TraceEvents in, DataFrame out), in the order they run.
ANALYSES: dict[str, Callable[[TraceEvents], pd.DataFrame]] = {
    "temporal": temporal.temporal_table,
    "idle": idle.idle_breakdown,
    "kernel_categories": kernels.kernel_breakdown,
    "launch": launch.launch_stats,
    "short_kernels": launch.short_kernels,
    "ops": ops.op_roofline,
    "recompute": recompute.activation_recompute,
    "critical_path": critical_path.critical_path,
    "sync_root_causes": critical_path.sync_root_causes,
    "steps": steps.step_table,
}

_SEVERITY_ORDER = {"high": 0, "moderate": 1, "ok": 2}


@dataclass
class TraceReport:
    """Every analysis of one trace: ``tables`` (by the names of :data:`ANALYSES`), graded ``findings``
    (high first), the audit's ``metrics``, and how long the analysis took (``elapsed_s``, wall seconds)."""

    trace_id: str
    events: TraceEvents
    metrics: RunMetrics
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    not_observable: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def path(self) -> Path:
        return self.events.path

    def to_json(self) -> dict:
        """The report as JSON-ready data: ``trace_id``, ``path``, ``source_format``, ``device``,
        ``steps``, ``flags``, ``elapsed_s``, ``metrics`` (RunMetrics), ``findings`` and every table as records."""
        ev = self.events
        return {
            "trace_id": self.trace_id, "path": str(ev.path), "source_format": ev.source_format,
            "device": ev.device_name, "steps": [int(s) for s in ev.steps["step"]], "flags": ev.flags,
            "elapsed_s": round(self.elapsed_s, 3),
            "metrics": json.loads(self.metrics.model_dump_json()),
            "findings": [f.model_dump() for f in self.findings], "not_observable": self.not_observable,
            "tables": {k: json.loads(v.to_json(orient="records")) for k, v in self.tables.items()},
        }


def run_analysis(name: str, fn: Callable[[TraceEvents], object], ev: TraceEvents) -> tuple[object, str | None]:
    """``(fn(ev), None)``, or ``(empty DataFrame, reason)`` when the analysis cannot handle this trace.

    An analysis that cannot handle a trace ends ``not_observable`` with its
    reason (one line naming the analysis, the file and the error), never with
    a traceback: a missing host side (rocprofv3 output) raises
    :class:`TraceReadError`; any other error (e.g. a CUPTI-profiler trace with
    ``cuda_profiler_range`` events and no kernels) is reported the same way.
    """
    try:
        return fn(ev), None
    except TraceReadError as exc:
        return pd.DataFrame(), str(exc)
    except Exception as exc:  # noqa: BLE001 - one analysis must not end the others (issue 29)
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return pd.DataFrame(), (f"{name} cannot handle {ev.path.name}: {type(exc).__name__}"
                                + (f": {detail}" if detail else "")
                                + (f" (the trace has no device events)" if ev.kernels.empty else ""))


def trace_findings(ev: TraceEvents, tables: dict[str, pd.DataFrame],
                   summary: TraceSummary | None = None, missing: dict[str, str] | None = None) -> list[Finding]:
    """The graded findings of every analysis that grades (launch, idle, recompute, critical path, health,
    exposed communication), high first.  ``summary`` is :func:`trace_summary` of ``ev`` (read when not given).

    A grader that cannot handle the trace (or whose table is ``not_observable``)
    adds its reason to ``missing`` (``findings_<analysis>``) instead of raising.
    """
    missing = {} if missing is None else missing
    tb = tables["temporal"]
    recorded = {**tables, "temporal": tb[tb["timing"] == "recorded"].drop(columns="timing") if len(tb) else tb}
    graders = {
        "launch": (("launch", "short_kernels", "idle", "temporal"), lambda: launch.launch_findings(ev, recorded)),
        "recompute": (("recompute",), lambda: recompute.recompute_findings(ev, tables["recompute"])),
        "critical_path": (("critical_path", "sync_root_causes"), lambda: critical_path.critical_path_findings(
            ev, tables["critical_path"], tables["sync_root_causes"])),
        "health": ((), lambda: health.health_check(ev)),
        "steps": (("steps",), lambda: steps.step_findings(tables["steps"])),
        "comm": ((), lambda: comm.comm_findings(summary or trace_summary(ev),
                                                stepped=ev.source_format == "kineto" and ev.has_steps)),
    }
    found: list[Finding] = []
    for name, (needs, grade) in graders.items():
        if any(n in missing for n in needs):
            continue
        got, why = run_analysis(f"findings_{name}", lambda _ev: grade(), ev)
        if why:
            missing[f"findings_{name}"] = why
        else:
            found.extend(got)
    rounded = tb[(tb["timing"] == "hta_rounded") & (tb["non_compute_time_us"] < 0)] if len(tb) else tb
    for row in rounded.itertuples():
        found.append(Finding(
            analysis="temporal", kind="hta_cannot_compare", severity="ok", status="measured",
            value=float(row.non_compute_time_us), unit="µs",
            message=(f"device {row.device}: HTA's µs rounding (start ceiled, end floored) gives this trace's sub-µs "
                     f"events zero or negative durations, so its non-compute time comes out at "
                     f"{row.non_compute_time_us:.1f} µs and HTA's temporal breakdown fails its own assertion "
                     f"(non_compute_time >= 0); the 'recorded' timing row is exact"),
            threshold_source="HTA common/trace_parser.py round_down_time_stamps; breakdown_analysis.py assert"))
    health.mark_unreliable(found, ev)
    idle = [f for f in found if f.kind == "gpu_idle"]
    busy = idle and all(f.severity == "ok" for f in idle)
    for f in found:
        if f.kind == "launch_delay" and busy and f.severity != "ok":
            # the host runs ahead of a busy device (a deep queue): not a launch problem (launch.py docstring)
            f.severity = "ok"
            f.message += "; the device is busy (idle under the moderate grade), so this is a deep launch queue"
    return sorted(found, key=lambda f: _SEVERITY_ORDER[f.severity])


def analyze_trace(path: str | Path, trace_id: str | None = None,
                  progress: Callable[[str], None] | None = None) -> TraceReport:
    """Read ``path`` (Kineto ``.json``/``.json.gz``, rocprofv3 JSON or CSV) and run every analysis on it.

    ``progress`` receives one line per analysis.  ``trace_id`` defaults to
    :func:`goblin_assets.audit.session.make_audit_id` of ``trace-<file stem>``
    (one id scheme for audits and traces).

    Raises
    ------
    goblin_assets.trace.events.TraceReadError
        The file cannot be read as a trace (names the file and the problem).
    """
    from goblin_assets.ids import make_audit_id

    t0 = time.perf_counter()
    say = progress or (lambda _: None)
    ev = load_trace(path)
    say(f"read {ev.path.name}: {ev.source_format}, {len(ev.kernels)} device events, {len(ev.steps)} steps, "
        f"device {ev.device_name or 'not recorded'}")
    tables: dict[str, pd.DataFrame] = {}
    missing: dict[str, str] = {}
    for name, fn in ANALYSES.items():
        tables[name], why = run_analysis(name, fn, ev)
        if why:
            missing[name] = why
        say(f"{name}: {len(tables[name])} rows" + (" (not observable)" if name in missing else ""))
    stem = trace_stem(ev.path)
    summary = trace_summary(ev)
    rep = TraceReport(trace_id=trace_id or make_audit_id(f"trace-{stem}"), events=ev,
                      metrics=trace_run_metrics(ev, summary=summary), tables=tables,
                      findings=trace_findings(ev, tables, summary, missing), not_observable=missing)
    rep.metrics.signals = trace_signals(rep)
    rep.elapsed_s = time.perf_counter() - t0
    return rep


def trace_frames(rep: TraceReport, audit_id: str | None = None, with_run: bool = True) -> dict[str, pd.DataFrame]:
    """The warehouse rows of one analysed trace.

    ``trace_runs`` (one row), every non-empty table as ``trace_<name>`` and
    the findings as ``trace_findings``, each with the report's ``trace_id``;
    with ``with_run`` also the trace's RunMetrics as the audit writes its own
    runs (``runs`` / ``waste_budget`` / ``kernels``, ``run_id`` = ``trace_id``,
    label ``trace``, provenance ``replayed``).  ``audit_id`` links the trace to
    the audit that read it (``goblin audit --trace``).
    """
    from datetime import datetime

    from goblin_assets.warehouse.frames import kernels_frame, runs_frame, waste_frame

    ev = rep.events
    out = {"trace_runs": pd.DataFrame([{
        "trace_id": rep.trace_id, "audit_id": audit_id, "created_at": datetime.now(), "path": str(ev.path),
        "source_format": ev.source_format, "device": ev.device_name, "steps": len(ev.steps),
        "device_events": len(ev.kernels), "elapsed_s": rep.elapsed_s, "flags_json": json.dumps(ev.flags),
        "not_observable_json": json.dumps(rep.not_observable)}])}
    for name, df in rep.tables.items():
        if df.empty:
            continue
        df = df.copy()
        for c in df.columns:
            if df[c].dtype == object and df[c].map(lambda v: isinstance(v, (list, dict))).any():
                df[c] = df[c].map(lambda v: json.dumps(v, default=str))
        df.insert(0, "trace_id", rep.trace_id)
        out[f"trace_{name}"] = df
    out["trace_findings"] = pd.DataFrame([{
        "trace_id": rep.trace_id, "analysis": f.analysis, "kind": f.kind, "severity": f.severity,
        "message": f.message, "value": f.value, "unit": f.unit, "threshold": f.threshold,
        "threshold_source": f.threshold_source, "status": f.status,
        "evidence_json": json.dumps(f.evidence, default=str)} for f in rep.findings],
        columns=["trace_id", "analysis", "kind", "severity", "message", "value", "unit", "threshold",
                 "threshold_source", "status", "evidence_json"])
    if with_run:
        m = rep.metrics
        out.update({"runs": runs_frame(m, rep.trace_id, "trace", audit_id),
                    "waste_budget": waste_frame(m, rep.trace_id, "trace"), "kernels": kernels_frame(m, rep.trace_id)})
    return out


def trace_signals(rep: TraceReport) -> list:
    """The trace's findings as the run's own derived signals (``signals.trace_*`` of rule conditions).

    ``trace_activation_recompute``: steps with recompute time (count of
    steps); ``trace_sync_wait``: 1 when blocking syncs take at least the
    moderate share of the step (``THRESHOLDS['sync_pct']``);
    ``trace_cpu_launch_bound``: steps the critical path calls cpu launch bound
    with at least moderate device idle.  The definitions are
    :data:`goblin_assets.measure.signals.DERIVED`'s.
    """
    from goblin_assets.contracts import Signal
    from goblin_assets.measure.signals import DERIVED

    out = []
    rc, cp = rep.tables.get("recompute", pd.DataFrame()), rep.tables.get("critical_path", pd.DataFrame())
    n = int((rc["recompute_us"] > 0).sum()) if not rc.empty else 0
    if n:
        out.append(Signal(id="trace_activation_recompute", count=n, where="trace",
                          message=f"{rc['recompute_pct'].median():.1f}% of the step re-runs forward work",
                          meaning=DERIVED["trace_activation_recompute"], source=str(rep.path)))
    sync = [f for f in rep.findings if f.kind == "sync_wait" and f.severity != "ok"]
    if sync:
        out.append(Signal(id="trace_sync_wait", count=1, where="trace", message=sync[0].message,
                          meaning=DERIVED["trace_sync_wait"], source=str(rep.path)))
    launch_bound = [f for f in rep.findings if f.kind == "cpu_launch_bound" and f.severity != "ok"]
    if launch_bound and not cp.empty:
        out.append(Signal(id="trace_cpu_launch_bound", count=int((cp["verdict"] == "cpu_launch_bound").sum()),
                          where="trace", message=launch_bound[0].message,
                          meaning=DERIVED["trace_cpu_launch_bound"], source=str(rep.path)))
    return out


def device_trace_report(m: RunMetrics, trace_id: str) -> TraceReport | None:
    """The trace analyses of one of the audit's own runs, when it ran on a GPU (None for CPU runs, replays,
    failed runs or a missing trace): the audit's GPU runs go through the same analysis code as recorded traces."""
    if not m.ok or m.provenance.kind != "measured" or m.provenance.device == "cpu" or not m.trace_path:
        return None
    if not Path(m.trace_path).is_file():
        return None
    return analyze_trace(m.trace_path, trace_id=trace_id)


def diff_markdown(before: TraceReport, after: TraceReport, top: int = 6) -> list[str]:
    """A "Device time by category" report section: the categories whose share of kernel time moved most
    from ``before`` to ``after`` (:func:`goblin_assets.trace.diff.category_diff`), µs per step, measured."""
    from goblin_assets.trace.diff import category_diff

    d = category_diff(before.events, after.events).head(top)
    out = ["## Device time by category, original vs patched (measured, per step)", "",
           "| category | original µs | patched µs | original share | patched share | change |",
           "|---|---|---|---|---|---|"]
    out += [f"| {r.category} | {r.a_time_per_step_us:,.1f} | {r.b_time_per_step_us:,.1f} | {r.a_share_pct:.1f}% | "
            f"{r.b_share_pct:.1f}% | {r.share_change_pp:+.1f} pp |" for r in d.itertuples()]
    return out + [""]
