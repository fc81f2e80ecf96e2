"""Contracts -> tidy frames for the warehouse tables (one function per table)."""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime

import numpy as np
import pandas as pd
import pyarrow as pa

from goblin_assets.contracts import BenchmarkResult, ConfigDict, RuleMatch, RunMetrics
from goblin_assets.redact import redact
from goblin_assets.warehouse.tables import columns


def text(values: str | None | Sequence[str | None], repeat: int | Sequence[int] = 1) -> pd.arrays.ArrowExtensionArray:
    """Strings in the warehouse's text dtype (:data:`goblin_assets.warehouse.tables.TEXT`), built by Arrow.

    ``text("run-1", n)`` is ``n`` copies of one string; ``text(["a", "b"],
    [2, 3])`` repeats each value its count of times, in order (as
    ``np.repeat``); ``None`` gives nulls.  Writers of large frames use it for
    their text columns so that validation has no per-cell work to do (a
    column of Python ``str`` objects is converted cell by cell).

    Shapes
    ------
    ``values``: one string or ``(V,)``; ``repeat``: one count or ``(V,)``.
    Returns an Arrow-backed array of ``sum(repeat)`` strings.

    Raises
    ------
    ValueError
        ``values`` and ``repeat`` differ in length, or a count is negative.
    """
    if values is None or isinstance(values, str):
        values = [values]
    values = list(values)
    counts = np.asarray(repeat, dtype=np.int64)
    if counts.ndim == 0:
        counts = np.full(len(values), counts)
    if counts.shape != (len(values),) or (counts < 0).any():
        raise ValueError(f"text: {len(values)} values need as many non-negative counts, got {counts.tolist()[:8]}")
    parts = [pa.repeat(pa.scalar(v, pa.string()), int(k)) for v, k in zip(values, counts)]
    return pd.arrays.ArrowExtensionArray(pa.concat_arrays(parts) if parts else pa.array([], pa.string()))


def _frame(table: str, rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns(table))


def configs_frame(cfg: ConfigDict, audit_id: str, workload: str) -> pd.DataFrame:
    """One row of ``configs`` per ConfigDict field: its value (JSON), status (the provenance kind) and source.

    ``status`` is ``literal``, ``default``, ``variable``, ``env``, ``inferred``
    or ``unset`` (:class:`goblin_assets.contracts.Provenance`); ``file`` is
    redacted, ``line`` is 1-based; ``detail`` says how the value was found
    (or why it is null).
    """
    rows = []
    for f, v in cfg.values().items():
        prov = cfg.provenance.get(f)
        rows.append({"audit_id": audit_id, "workload": workload, "field": f, "value_json": json.dumps(v),
                     "status": prov.kind if prov else "unset",
                     "file": redact(prov.file) if prov and prov.file else None,
                     "line": prov.line if prov else None, "key": prov.key if prov else None,
                     "detail": redact(prov.detail) if prov else "not found in the file",
                     "source_format": cfg.source_format})
    return _frame("configs", rows)


def observed_frame(cfg: ConfigDict, audit_id: str, workload: str, run_id: str) -> pd.DataFrame:
    """One row of ``observed_settings`` per field the run observed (issue 27): the value the program ran with,
    the file's value beside it, where each came from and whether they agree.

    ``status`` is always ``observed``; ``parsed_status`` the parsed value's
    provenance kind; ``agrees`` False for a field listed in
    ``cfg.disagreements``, whose ``set_at`` (``file:line: statement`` of the
    program that sets the run's value, NULL when the audit found none) and
    ``patchable`` (``Disagreement.patchable``) say whether a patch can reach
    the value; both NULL for a field that agrees.  Empty for a config
    nothing was observed for.
    """
    differ = {d.field: d for d in cfg.disagreements}
    rows = []
    for f, pprov in cfg.parsed_provenance.items():
        prov = cfg.provenance.get(f)
        d = differ.get(f)
        at = d.set_at if d is not None else None
        rows.append({"audit_id": audit_id, "run_id": run_id, "workload": workload, "field": f,
                     "value_json": json.dumps(getattr(cfg, f)), "parsed_value_json": json.dumps(cfg.parsed.get(f)),
                     "status": "observed", "parsed_status": pprov.kind,
                     "file": redact(prov.file) if prov and prov.file else None, "line": prov.line if prov else None,
                     "key": prov.key if prov else None, "detail": redact(prov.detail) if prov else "",
                     "agrees": d is None,
                     "set_at": redact(f"{at.file}:{at.line}: {at.detail}") if at is not None else None,
                     "patchable": d.patchable if d is not None else None})
    return _frame("observed_settings", rows)


def runs_frame(m: RunMetrics, run_id: str, label: str, audit_id: str | None = None) -> pd.DataFrame:
    """One row of ``runs`` (the full RunMetrics kept as JSON in ``metrics_json``)."""
    return _frame("runs", [{
        "run_id": run_id, "audit_id": audit_id, "workload": m.workload, "label": label,
        "created_at": datetime.now(), "ok": m.ok, "provenance": m.provenance.kind, "device": m.provenance.device,
        "torch_version": m.provenance.torch_version, "steps": m.steps, "step_time_s": m.step_time_s,
        "samples_per_sec": m.samples_per_sec, "tokens_per_sec": m.tokens_per_sec, "mfu_pct": m.mfu_pct,
        "mem_peak_gb": m.mem_peak_gb, "util_pct": m.util_pct, "trace_path": m.trace_path,
        "metrics_json": m.model_dump_json(),
    }])


def kernels_frame(m: RunMetrics, run_id: str) -> pd.DataFrame:
    """Top ops/kernels of a run, ranked from 1."""
    return _frame("kernels", [{"run_id": run_id, "rank": i + 1, "name": k.name, "pct_time": k.pct_time}
                              for i, k in enumerate(m.top_kernels)])


def waste_frame(m: RunMetrics, run_id: str, label: str) -> pd.DataFrame:
    """One row per waste bucket with its seconds per step, share and status."""
    tot = sum(b.seconds for b in m.waste_budget.values())
    return _frame("waste_budget", [
        {"run_id": run_id, "workload": m.workload, "label": label, "bucket": k, "time_per_step_s": b.seconds,
         "share": b.seconds / tot if tot > 0 else 0.0, "status": b.status, "note": b.note}
        for k, b in m.waste_budget.items()])


def kb_frame(matches: list[RuleMatch], audit_id: str, workload: str) -> pd.DataFrame:
    """One row per rule checked (fired or not), with both scores."""
    return _frame("kb_matches", [
        {"audit_id": audit_id, "workload": workload, "rule_id": mt.rule_id, "fired": mt.fired,
         "detect_score": mt.detect_score, "retrieval_score": mt.retrieval_score, "reason": mt.reason,
         "evidence_json": json.dumps(mt.evidence, default=str)} for mt in matches])


def bench_frame(results: dict[str, BenchmarkResult], audit_id: str, workload: str) -> pd.DataFrame:
    """One row per repeat of each benchmark arm."""
    rows = []
    for lab, r in results.items():
        for i, tp in enumerate(r.throughputs):
            rows.append({"audit_id": audit_id, "workload": workload, "label": lab, "repeat": i, "throughput_per_s": tp,
                         "unit": r.metrics.unit, "median_per_s": r.median, "spread_per_s": r.spread,
                         "steps": r.metrics.steps,
                         "cache_key": r.cache_key, "cache_hit": r.cache_hit,
                         "provenance": "replayed" if r.cache_hit else r.metrics.provenance.kind})
    return _frame("benchmarks", rows)


def audit_frame(audit_id: str, workload: str, profile_run_id: str, patched_run_id: str, rep, patch,
                report_path) -> pd.DataFrame:
    """One row of ``audits``: the headline numbers of one audit (``rep``: AuditReport or ReplayReport, ``patch``: Patch).

    ``predicted_speedup_low/high`` and ``confidence`` are the waste-budget
    model's own (``patch``), never the calibrated ones: the rules' record
    (``marts/speedup_calibration.sql``, ``measure/calibration.py``) compares
    them with ``measured_speedup``.  The calibrated prediction the report
    shows is in ``calibrated_speedup_low/high`` and ``calibrated_confidence``,
    with ``calibration_audits`` (measured audits behind it; 0: not scaled).
    ``speedup_low/high`` is the measured speedup's interval at
    ``speedup_level`` (0..1) over ``speedup_pairs`` pairs, and
    ``speedup_verdict`` its reading (``faster``, ``slower``, ``no significant
    change``, ``no interval``); ``speedup_pairs_faster/slower`` and
    ``speedup_sign_test_p`` the pairs' sign test beside it (null when
    unpaired), ``speedup_budget_s``/``speedup_elapsed_s`` the benchmark's
    wall-clock budget and the seconds it measured (null when unknown); all
    null when nothing was measured (a replay).
    ``verdict``, ``healthy`` and ``patch_offered`` are the audit's ranked
    verdict (:class:`goblin_assets.report.verdict.Verdict`): its first kind,
    whether the run was healthy, whether the patch is handed over as a fix.
    """
    iv = getattr(rep, "measured_interval", None)
    cal = getattr(rep, "calibration", None)
    v = getattr(rep, "verdict", None)
    return _frame("audits", [{
        "audit_id": audit_id, "workload": workload, "created_at": datetime.now(),
        "profile_run_id": profile_run_id, "baseline_run_id": profile_run_id, "patched_run_id": patched_run_id,
        "baseline_throughput_per_s": rep.baseline_throughput, "patched_throughput_per_s": rep.patched_throughput,
        "unit": rep.unit, "measured_speedup": rep.measured_speedup,
        "predicted_speedup_low": patch.expected_speedup_low, "predicted_speedup_high": patch.expected_speedup_high,
        "confidence": patch.confidence,
        "rules": ",".join(a.rule_id for a in patch.applied), "diff": redact(patch.diff),
        "report_path": str(report_path) if report_path else None,
        "speedup_low": iv.low if iv else None, "speedup_high": iv.high if iv else None,
        "speedup_level": iv.level if iv else None, "speedup_pairs": iv.pairs if iv else None,
        "speedup_verdict": iv.verdict if iv else None,
        "calibrated_speedup_low": rep.predicted_low, "calibrated_speedup_high": rep.predicted_high,
        "calibrated_confidence": rep.confidence, "calibration_audits": cal.audits if cal is not None else 0,
        "verdict": v.status if v else None, "healthy": v.healthy if v else None,
        "patch_offered": v.patch_offered if v else None,
        **{f"speedup_{k}": getattr(iv, k, None) if iv else None
           for k in ("pairs_faster", "pairs_slower", "sign_test_p", "budget_s", "elapsed_s")},
    }])


def join_frames(parts: Iterable[dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Several writers' frames (``table -> frame`` each: stages, audits) joined table by table, for one write.

    Frames of one table are joined as records, so that a column that is empty in one of them (a None
    field) never decides the joined column's dtype; a table with one frame keeps it as it is.  Columns
    are the first frame's (every frame of a table has the table's columns).
    """
    out: dict[str, list[pd.DataFrame]] = {}
    for part in parts:
        for table, df in part.items():
            out.setdefault(table, []).append(df)
    return {t: dfs[0] if len(dfs) == 1 else pd.DataFrame([r for d in dfs for r in d.to_dict("records")],
                                                         columns=dfs[0].columns) for t, dfs in out.items()}


def _fits_word(fits: bool | None) -> str:
    return {True: "fits", False: "does not fit", None: "undetermined"}[fits]


def memory_fit_frame(ans: dict, fit_id: str) -> pd.DataFrame:
    """``memory_fit`` rows of one ``goblin fit`` answer (:func:`goblin_assets.audit.fit.memory_fit`): each term
    of the configured step, its total, and each lever tried with its predicted peak."""
    st = ans["step"]
    base = {"fit_id": fit_id, "workload": ans["workload"], "device": ans.get("device"),
            "budget_bytes": ans["budget_bytes"], "budget_basis": ans["budget_basis"]}
    shape = {"micro_batch": st["micro_batch"], "grad_accum": st["grad_accum"], "global_batch": st["global_batch"]}
    rows = [{**base, **shape, "kind": "term", "name": t["name"], "change_json": None, "bytes": t["bytes"],
             "provenance": t["provenance"], "basis": t["basis"], "fits": _fits_word(ans["fits"])}
            for t in st["terms"]]
    rows.append({**base, **shape, "kind": "total", "name": "peak", "change_json": None, "bytes": ans["peak_bytes"],
                 "provenance": "measured" if ans["peak_bytes"] is not None else "undetermined",
                 "basis": "sum of the terms", "fits": _fits_word(ans["fits"])})
    for lv in ans["levers"]:
        ch = lv["change"]
        rows.append({**base, "kind": "lever", "name": lv["lever"], "change_json": json.dumps(ch, sort_keys=True),
                     "bytes": lv["peak_bytes"], "provenance": "modelled" if lv["peak_bytes"] is not None
                     else "undetermined", "basis": "the memory model with this change",
                     "micro_batch": int(ch.get("batch_size", st["micro_batch"])),
                     "grad_accum": int(ch.get("grad_accum_steps", st["grad_accum"])),
                     "global_batch": int(lv["global_batch"]), "fits": _fits_word(lv["fits"])})
    return _frame("memory_fit", rows)


def failure_frames(audit_id: str, workload: str, unit: str, stage: str, failure: str, diag, fired: list[str],
                   verdict, report_path, hung: bool, oom_state: dict | None = None,
                   oom_fix: dict | None = None) -> dict[str, pd.DataFrame]:
    """The rows of an audit whose original failed as written: one ``run_failures`` row and one ``audits`` row.

    ``diag``: :class:`~goblin_assets.measure.failure.FailureDiagnosis` (None: not diagnosed, class
    ``unknown``); ``fired``: the rule ids that match the failure; ``verdict``: the audit's
    :class:`~goblin_assets.report.verdict.Verdict`; ``oom_state``: the harness's record at an out-of-memory
    failure (``phase``, ``steps_done``), ``oom_fix``: the validated fix (``change``, ``ok``,
    ``samples_per_sec``), None when there is none.  The ``audits`` row has no throughput, speedup or patch:
    nothing was benchmarked (null, never 0).
    """
    dev = getattr(diag, "device_oom", None)
    st = oom_state or {}
    now = datetime.now()
    failures = _frame("run_failures", [{
        "audit_id": audit_id, "workload": workload, "created_at": now, "stage": stage,
        "failure_class": diag.failure_class if diag is not None else "unknown",
        "label": diag.label if diag is not None else "the failure was not diagnosed",
        "failure": redact(failure), "evidence": redact(diag.evidence) if diag is not None else "", "hung": hung,
        "exit_status": diag.exit_status if diag is not None else None,
        "last_step": diag.last_step if diag is not None else None,
        "signals": ",".join(s.id for s in diag.signals) if diag is not None else "", "fired_rules": ",".join(fired),
        "oom_kind": dev.kind if dev is not None else None,
        "oom_request_bytes": float(dev.request_bytes) if dev is not None else None,
        "oom_phase": st.get("phase"), "oom_step": st["steps_done"] + 1 if "steps_done" in st else None,
        "fix_change_json": json.dumps(oom_fix["change"]) if oom_fix else None,
        "fix_ran": oom_fix["ok"] if oom_fix else None,
        "fix_samples_per_sec": oom_fix.get("samples_per_sec") if oom_fix else None,
        "report_path": str(report_path) if report_path else None}])
    audits = _frame("audits", [{
        "audit_id": audit_id, "workload": workload, "created_at": now, "profile_run_id": f"{audit_id}-profile",
        "baseline_run_id": None, "patched_run_id": None, "baseline_throughput_per_s": None,
        "patched_throughput_per_s": None, "unit": unit, "measured_speedup": None, "predicted_speedup_low": None,
        "predicted_speedup_high": None, "confidence": None, "rules": ",".join(fired), "diff": "",
        "report_path": str(report_path) if report_path else None, "calibration_audits": 0,
        "verdict": verdict.status, "healthy": verdict.healthy, "patch_offered": False}])
    return {"run_failures": failures, "audits": audits}
