"""The agent's six tools: the audit session's own stages, summarised for a model.

Each tool calls stages of :class:`goblin_assets.audit.session.AuditSession`,
the one orchestrator behind ``goblin audit`` and the asset graph: nothing
here runs, parses or decides anything itself.  A stage runs on first use (a
tool whose inputs were never asked for runs them first) and at most once; a
session seeded with the results of a materialized audit runs no stage again.
A replay folder is never executed: its benchmark and comparison tools say
``not_observable`` with the reason, and the rules are checked on the
recorded host.

What-if questions pass ``overrides`` (ConfigDict fields, e.g.
``{"batch_size": 128}``): :meth:`AuditSession.what_if` writes them into a copy
of the user's file and audits the copy as a workload of its own, through the
same runner and the same benchmark cache.

A tool returns a small JSON-able summary (never a raw trace or stderr); the
loop redacts it before the model sees it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goblin_assets.audit.session import AuditSession, WhatIfError
from goblin_assets.contracts import CONFIG_FIELDS, BenchmarkResult, ConfigDict, RunMetrics
from goblin_assets.kb.retrieval import WEAK_MATCH_BELOW, query_rocm_kb
from goblin_assets.measure.benchmark import bench_interval
from goblin_assets.measure.waste import shares
from goblin_assets.report.markdown import ReplayReport

#: A tool argument the session cannot use (the what-if's error; kept under the tools' name).
ToolInputError = WhatIfError


# --------------------------------------------------------------------------- summaries (what a model sees)

def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


def _whatif(s: AuditSession) -> dict[str, Any]:
    return {"overrides": s.overrides, "whatif_diff": s.whatif_diff} if s.overrides else {}


def config_summary(s: AuditSession) -> dict[str, Any]:
    """The ConfigDict fields, where each came from (literal/default/...), and the parser's warnings."""
    cfg = s.training_config()
    return {**_whatif(s), "file": Path(cfg.source_file).name, "format": cfg.source_format, "config": cfg.values(),
            "value_from": {k: p.kind for k, p in cfg.provenance.items() if k in CONFIG_FIELDS},
            "warnings": cfg.warnings}


def run_summary(m: RunMetrics) -> dict[str, Any]:
    """A RunMetrics without traces or paths.  Units: ms per step, throughput per second, GB, percent."""
    sh = shares(m.waste_budget)
    return {
        "provenance": f"{m.provenance.kind} on {m.provenance.device}"
                      + (f" ({m.provenance.profiler})" if m.provenance.profiler else ""),
        "steps": m.steps, "step_time_ms": _ms(m.step_time_s),
        "throughput": _r(m.throughput, 1), "throughput_unit": m.throughput_unit,
        "samples_per_step": m.samples_per_step,
        "waste_budget": {k: {"ms": _ms(b.seconds), "share": _r(sh.get(k), 3), "status": b.status}
                         for k, b in m.waste_budget.items()},
        "memory_headroom_gb": _r(m.memory_headroom_gb), "mem_peak_gb": _r(m.mem_peak_gb),
        "util_pct": _r(m.util_pct, 1), "mfu_pct": _r(m.mfu_pct, 3),
        "top_ops": [f"{k.name} {k.pct_time:.1f}%" for k in m.top_kernels],
        "not_observable": m.not_observable, "warnings": m.warnings[:5],
    }


def profile_summary(s: AuditSession) -> dict[str, Any]:
    """:func:`run_summary` of the session's profiled original."""
    return {**_whatif(s), **run_summary(s.profile_run())}


def kb_summary(s: AuditSession, symptom: str = "") -> dict[str, Any]:
    """Fired rules with their evidence, the rules closest to the measured symptoms, and a free-text search."""
    matches = s.kb_matches()
    out: dict[str, Any] = {
        "rules_checked": len(matches),
        "fired": [{"rule": m.rule_id, "category": s.rules().by_id[m.rule_id].category,
                   "targets_bucket": s.rules().by_id[m.rule_id].targets_bucket, "evidence": m.evidence}
                  for m in matches if m.fired and m.rule_id in s.rules().by_id],
        "closest_to_measured_symptoms": [
            {"rule": m.rule_id, "similarity": _r(m.retrieval_score, 3), "fired": m.fired}
            for m in sorted((m for m in matches if m.retrieval_score is not None),
                            key=lambda m: -m.retrieval_score)[:5]],
    }
    if symptom:
        out["search"] = [{"rule": r.id, "relevance": _r(score, 3), "weak_match": score < WEAK_MATCH_BELOW,
                          "symptom": r.symptom.strip()}
                         for r, score in query_rocm_kb(symptom, top_k=5, kb=s.rules(), index=s.kb_index())]
    return out


def patch_summary(s: AuditSession) -> dict[str, Any]:
    """Applied rules (changes, predicted share of the step, citation), dropped ones, predicted range, the diff."""
    p = s.patch()
    return {
        **_whatif(s),
        "applied": [{"rule": a.rule_id, "category": a.category, "targets_bucket": a.targets_bucket,
                     "changes": a.changes, "predicted_share_of_step": _r(a.predicted_recovery, 3),
                     "source": f"{a.citation.title}, {a.citation.section}"} for a in p.applied],
        "dropped": p.dropped, "env": p.env, "unset_env": p.unset_env,
        "predicted_speedup": [_r(p.expected_speedup_low), _r(p.expected_speedup_high)],
        "confidence": _r(p.confidence), "diff": p.diff,
    }


def _arm(b: BenchmarkResult) -> dict[str, Any]:
    return {"median": _r(b.median, 1), "spread": _r(b.spread, 1), "throughputs": [_r(t, 1) for t in b.throughputs],
            "cache_hit": b.cache_hit}


def _not_observable(s: AuditSession, stage: str) -> dict[str, Any]:
    return {**_whatif(s), "status": "not_observable", "reason": s.not_observable.get(stage, "")}


def bench_summary(s: AuditSession, root: AuditSession | None = None) -> dict[str, Any]:
    """Baseline vs patched medians (measured, or replayed from the benchmark cache) and their ratio.

    For a what-if session, ``vs_original`` relates both arms to the
    original's benchmarked baseline (``root``) when it was benchmarked.  A
    replay benchmarks nothing: ``status`` ``not_observable`` and the reason.
    """
    bench, after = s.benchmarks(), s.patched_run()
    if bench is None or after is None:
        return _not_observable(s, "benchmarks")
    b, p = bench["baseline"], bench["patched"]
    iv = bench_interval(bench)
    out = {**_whatif(s), "unit": s.profile_run().throughput_unit,
           "steps_per_repeat": s.settings.bench_steps, "repeats": len(b.throughputs),
           "baseline": _arm(b), "patched": _arm(p), "speedup": _r(iv.point, 3),
           "speedup_interval": [_r(iv.low, 3), _r(iv.high, 3)], "verdict": iv.verdict,
           "patched_profile": {"step_time_ms": _ms(after.step_time_s),
                               "waste_budget_ms": {k: _ms(v.seconds) for k, v in after.waste_budget.items()}}}
    root_bench = root.results.get("benchmarks") if root is not None and root is not s else None
    if root_bench:
        ob = root_bench["baseline"].median
        out["vs_original"] = {"original_baseline_median": _r(ob, 1), "as_is": _r(b.median / ob, 3),
                              "with_patch": _r(p.median / ob, 3)}
    return out


def _interval(iv) -> dict[str, Any]:
    """The measured speedup's interval and verdict (``no significant change`` when it contains 1.0)."""
    if iv is None:
        return {}
    return {"measured_speedup_interval": [_r(iv.low, 2), _r(iv.high, 2)], "interval_level": iv.level,
            "verdict": iv.verdict}


def report_summary(s: AuditSession) -> dict[str, Any]:
    """The before/after report in numbers, and the exact tuple its recommendation holds for.

    For a replay: the recorded (replayed or modelled) numbers, the predicted
    range and ``measured_speedup`` null with the reason.
    """
    rep = s.audit_report()
    applied = [{"rule": a.rule_id, "predicted_share_of_step": _r(a.predicted_recovery, 3),
                "source": f"{a.citation.title}, {a.citation.section}"} for a in s.patch().applied]
    verdict = {"audit_verdict": s.verdict().headline, "healthy": s.verdict().healthy,
               "patch_offered": s.verdict().patch_offered}  # what matters most, first
    if isinstance(rep, ReplayReport):
        return {**verdict, **_not_observable(s, "benchmarks"), "measured_speedup": None, "provenance": rep.provenance,
                "predicted_speedup": [_r(rep.predicted_low), _r(rep.predicted_high)], "confidence": _r(rep.confidence),
                "applied": applied, "report": str(s.report_path)}
    return {
        **verdict,
        **_whatif(s),
        # rounded once, as the report prints it (2 decimals): 1.4047 rounded to 3 and then printed with
        # 2 decimals read "1.41x" in the agent's answer beside the report's "1.40x"
        "measured_speedup": _r(rep.measured_speedup, 2),
        **_interval(getattr(rep, "measured_interval", None)),
        "predicted_speedup": [_r(rep.predicted_low), _r(rep.predicted_high)], "confidence": _r(rep.confidence),
        "throughput": {"original": _r(rep.baseline_throughput, 1), "patched": _r(rep.patched_throughput, 1),
                       "unit": rep.throughput_unit, "cache_hits": rep.cache_hits},
        "waste_budget_ms": {bc.bucket: {"original": _ms(bc.before_s), "patched": _ms(bc.after_s),
                                        "original_share": _r(bc.before_share, 3), "status": bc.before_status}
                            for bc in rep.buckets},
        "applied": applied,
        "holds_for": {"workload": rep.workload, "model": rep.model, "device": rep.device,
                      "accelerator": rep.accelerator_version, "torch": rep.torch_version, "shape": rep.batch_shape},
        "report": str(s.report_path) if s.report_path else None,
    }


# --------------------------------------------------------------------------- the tool table

_OVERRIDES = {
    "type": "object",
    "description": "What-if: ConfigDict fields to change in a copy of the user's file before the stage runs, "
                   'e.g. {"batch_size": 128}. Omit for the user\'s own config.',
    "properties": {f: {k: v for k, v in spec.items() if k not in ("title", "default")}
                   for f, spec in ConfigDict.model_json_schema()["properties"].items() if f in CONFIG_FIELDS},
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what the model is told, its JSON-schema parameters, and the function.

    ``fn(session, **arguments)`` returns a JSON-able summary; it raises a
    GoblinError (or a pydantic ValidationError) when the stage fails.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., dict[str, Any]]

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``{"type": "function", "function": {...}}`` schema."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def _params(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "additionalProperties": False}


def _variant_call(summary: Callable[[AuditSession], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    return lambda s, overrides=None: summary(s.what_if(overrides))


TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("parse_config", "Parse the training setup from the user's own file: batch size, workers, threads, precision, "
         "optimizer ... with where each value came from, and warnings.", _params(), config_summary),
    Tool("profile_run", "Run a few steps of the workload under the profiler (a real run): step time, throughput and "
         "the waste budget (useful, data_wait, host_gap, comm_excess, precision_path, kernel_shape; ms and share).",
         _params(overrides=_OVERRIDES), _variant_call(profile_summary)),
    Tool("query_rocm_kb", "Check every cited tuning rule's detect conditions against this config and measured run; "
         "fired rules with evidence, the rules closest to the measured symptoms, and optionally a free-text search.",
         _params(symptom={"type": "string", "description": "optional: a problem in words, to rank rules by"}),
         lambda s, symptom="": kb_summary(s, symptom)),
    Tool("propose_patch", "Apply the fired rules to the config and to the user's own file: applied rules with their "
         "citations, dropped ones and why, predicted speedup range, confidence and the unified diff.",
         _params(overrides=_OVERRIDES), _variant_call(patch_summary)),
    Tool("benchmark", "Measure original vs patched throughput (alternating repeats, no profiler; cached by config, "
         "script, image and runner code), then profile the patched run.",
         _params(overrides=_OVERRIDES), lambda s, overrides=None: bench_summary(s.what_if(overrides), root=s)),
    Tool("compare_runs", "Compare the original and patched runs: measured vs predicted speedup, the waste budget "
         "before and after, applied rules, and the exact tuple the result holds for; writes the report.",
         _params(), report_summary),
)}

#: The order a full audit calls the tools in (the asset graph's order).
CANONICAL_ORDER: tuple[str, ...] = tuple(TOOLS)
