"""The agent's six tools: the audit's own stage functions, memoised per session, summarised for a model.

Each tool calls the same stage functions as the asset graph and ``run_audit``
(``audit/pipeline.py``): nothing here re-implements a stage.  An
:class:`AuditSession` holds one workload's stage results; a stage runs on
first use (a tool whose inputs were never asked for runs them first) and at
most once.  A session can be seeded with the results of a materialized audit,
so a conversation over it runs no stage again.

What-if questions pass ``overrides`` (ConfigDict fields, e.g.
``{"batch_size": 128}``): the changed values are written into a copy of the
user's file with the patch stage's own editor, and the copy is audited as a
workload of its own (a child :class:`AuditSession`), through the same runner
and the same benchmark cache.

A tool returns a small JSON-able summary (never a raw trace or stderr); the
loop redacts it before the model sees it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from goblin_assets import goblin_home
from goblin_assets.audit import pipeline as stages
from goblin_assets.audit.kb import KnowledgeBase, load_kb
from goblin_assets.audit.patch import edit_source, unified_diff
from goblin_assets.audit.report import AuditReport, compare_runs, write_report
from goblin_assets.audit.retrieval import query_rocm_kb
from goblin_assets.audit.waste import shares
from goblin_assets.contracts import CONFIG_FIELDS, BenchmarkResult, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.errors import GoblinError
from goblin_assets.runners.base import Runner
from goblin_assets.runners.workload import Workload

Log = Callable[[str], None]


class ToolInputError(GoblinError):
    """A tool was called with arguments it cannot use (names the argument and the reason)."""


@dataclass
class AuditSession:
    """One workload's audit as a conversation sees it: how to run it, and every stage result so far.

    Parameters
    ----------
    workload, runner, kb
        What to audit, where it runs, and the rules.
    out_dir
        Where the patched copy, ``patch.diff`` and the report go (this machine only).
    steps, bench_steps, repeats, warmup
        Profiled steps, timed steps per benchmark repeat, alternating
        repeats per arm, unmeasured steps before each run (as ``run_audit``).
    overrides
        For a what-if session, the ConfigDict fields changed from the user's
        file (empty for the user's own workload); ``whatif_diff`` is that
        change as a diff of the user's file.

    The result fields (``config`` ... ``report``) are filled by the ``need_*``
    methods, or seeded from a materialized audit.
    """

    workload: Workload
    runner: Runner
    kb: KnowledgeBase
    out_dir: Path
    steps: int = 10
    bench_steps: int = 20
    repeats: int = 3
    warmup: int = 2
    log: Log = field(default=lambda s: None, repr=False)
    overrides: dict[str, Any] = field(default_factory=dict)
    whatif_diff: str = ""
    config: ConfigDict | None = None
    before: RunMetrics | None = None
    matches: list[RuleMatch] | None = None
    patch: Patch | None = None
    bench: dict[str, BenchmarkResult] | None = None
    after: RunMetrics | None = None
    report: AuditReport | None = None
    report_path: Path | None = None
    variants: dict[str, AuditSession] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, workload: Workload, runner: Runner, kb: KnowledgeBase | None = None, **kw: Any) -> AuditSession:
        """A fresh session writing under ``$GOBLIN_HOME/audits/<workload>-chat-<id>``; ``kw`` as the fields."""
        out = goblin_home() / "audits" / f"{workload.name}-chat-{uuid.uuid4().hex[:8]}"
        return cls(workload=workload, runner=runner, kb=kb or load_kb(), out_dir=out, **kw)

    # -- stages, each run at most once (the same functions as run_audit, in its order)

    def need_config(self) -> ConfigDict:
        """Stage 1, ``training_config``.  Raises ConfigParseError."""
        if self.config is None:
            self.config = stages.training_config(self.workload)
        return self.config

    def need_profile(self) -> RunMetrics:
        """Stage 2, ``profile_run`` of the original.  Raises RunFailed."""
        if self.before is None:
            self.before = stages.profile(self.workload, self.runner, self.steps, label="profile", warmup=self.warmup)
        return self.before

    def need_matches(self) -> list[RuleMatch]:
        """Stage 5, ``kb_matches`` (detect conditions on the measured run, retrieval scores)."""
        if self.matches is None:
            self.matches = stages.kb_matches(self.need_config(), self.need_profile(), self.kb)
        return self.matches

    def need_patch(self) -> Patch:
        """Stage 6, ``patch`` of the user's file (a copy under ``out_dir``).  Raises PatchError."""
        if self.patch is None:
            self.patch = stages.patch(self.need_config(), self.kb, self.need_matches(), self.need_profile(),
                                      self.workload, self.out_dir)
        return self.patch

    def need_bench(self) -> dict[str, BenchmarkResult]:
        """Stage 7: baseline vs patched (benchmark cache), then the patched run profiled.  Raises RunFailed."""
        if self.bench is None:
            self.bench = stages.benchmarks(self.workload, self.runner, self.need_config(), self.need_patch(),
                                           self.bench_steps, self.repeats, log=self.log)
        if self.after is None:
            self.after = stages.profile(self.workload, self.runner, self.steps, p=self.need_patch(), label="patched",
                                        warmup=self.warmup)
        return self.bench

    def need_report(self) -> AuditReport:
        """Stage 8, ``compare_runs``; writes report.md/.png/.html into ``out_dir``."""
        if self.report is None:
            bench = self.need_bench()
            self.report = compare_runs(self.need_profile(), self.after, bench, self.need_patch(), self.need_config(),
                                       model=self.workload.model)
            self.report_path = write_report(self.report, self.out_dir)
        return self.report

    # -- what-if

    def variant(self, overrides: dict[str, Any] | None) -> AuditSession:
        """The session of the user's workload with ``overrides`` written into a copy of its file.

        Returns ``self`` when ``overrides`` is empty or changes nothing; the
        same child session for the same overrides.

        Raises
        ------
        ToolInputError
            An unknown field or a value the ConfigDict does not accept.
        PatchError
            The value cannot be written into the user's file.
        """
        if self.overrides:
            raise ToolInputError("overrides: a what-if session takes no further overrides")
        if not overrides:
            return self
        cfg = self.need_config()
        unknown = sorted(set(overrides) - set(CONFIG_FIELDS))
        if unknown:
            raise ToolInputError(f"overrides: unknown field(s) {', '.join(unknown)}; "
                                 f"the fields are {', '.join(CONFIG_FIELDS)}")
        try:
            ConfigDict.model_validate({**cfg.values(), **overrides})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ToolInputError(f"overrides.{first['loc'][0]}: {first['msg']}") from None
        changes = {k: v for k, v in overrides.items() if cfg.values()[k] != v}
        if not changes:
            return self
        key = json.dumps(changes, sort_keys=True, default=str)
        if key not in self.variants:
            src = self.workload.config_file
            original = src.read_text(encoding="utf-8")
            edited = edit_source(cfg, changes, src)
            out = self.out_dir / f"whatif-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            copy = out / "source"  # not out/workload: the patch stage writes its patched copy there
            if copy.exists():
                shutil.rmtree(copy)
            shutil.copytree(self.workload.root, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
            rel = src.resolve().relative_to(self.workload.root.resolve()).as_posix()
            (copy / rel).write_text(edited, encoding="utf-8")
            self.variants[key] = AuditSession(
                workload=self.workload.model_copy(update={"root": copy}), runner=self.runner, kb=self.kb,
                out_dir=out, steps=self.steps, bench_steps=self.bench_steps, repeats=self.repeats,
                warmup=self.warmup, log=self.log, overrides=changes, whatif_diff=unified_diff(original, edited, rel))
        return self.variants[key]


# --------------------------------------------------------------------------- summaries (what a model sees)

def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


def _whatif(s: AuditSession) -> dict[str, Any]:
    return {"overrides": s.overrides, "whatif_diff": s.whatif_diff} if s.overrides else {}


def config_summary(s: AuditSession) -> dict[str, Any]:
    """The ConfigDict fields, where each came from (literal/default/...), and the parser's warnings."""
    cfg = s.need_config()
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
    return {**_whatif(s), **run_summary(s.need_profile())}


def kb_summary(s: AuditSession, symptom: str = "") -> dict[str, Any]:
    """Fired rules with their evidence, the rules closest to the measured symptoms, and a free-text search."""
    matches = s.need_matches()
    out: dict[str, Any] = {
        "rules_checked": len(matches),
        "fired": [{"rule": m.rule_id, "category": s.kb.by_id[m.rule_id].category,
                   "targets_bucket": s.kb.by_id[m.rule_id].targets_bucket, "evidence": m.evidence}
                  for m in matches if m.fired and m.rule_id in s.kb.by_id],
        "closest_to_measured_symptoms": [
            {"rule": m.rule_id, "similarity": _r(m.retrieval_score, 3), "fired": m.fired}
            for m in sorted((m for m in matches if m.retrieval_score is not None),
                            key=lambda m: -m.retrieval_score)[:5]],
    }
    if symptom:
        out["search"] = [{"rule": r.id, "similarity": _r(score, 3), "symptom": r.symptom.strip()}
                         for r, score in query_rocm_kb(symptom, top_k=5, kb=s.kb)]
    return out


def patch_summary(s: AuditSession) -> dict[str, Any]:
    """Applied rules (changes, predicted share of the step, citation), dropped ones, predicted range, the diff."""
    p = s.need_patch()
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


def bench_summary(s: AuditSession, root: AuditSession | None = None) -> dict[str, Any]:
    """Baseline vs patched medians (measured, or replayed from the benchmark cache) and their ratio.

    For a what-if session, ``vs_original`` relates both arms to the
    original's benchmarked baseline (``root``) when it was benchmarked.
    """
    bench = s.need_bench()
    b, p = bench["baseline"], bench["patched"]
    out = {**_whatif(s), "unit": s.before.throughput_unit if s.before else s.workload.unit + "/s",
           "steps_per_repeat": s.bench_steps, "repeats": len(b.throughputs),
           "baseline": _arm(b), "patched": _arm(p), "speedup": _r(p.median / b.median, 3),
           "patched_profile": {"step_time_ms": _ms(s.after.step_time_s),
                               "waste_budget_ms": {k: _ms(v.seconds) for k, v in s.after.waste_budget.items()}}}
    if root is not None and root is not s and root.bench:
        ob = root.bench["baseline"].median
        out["vs_original"] = {"original_baseline_median": _r(ob, 1), "as_is": _r(b.median / ob, 3),
                              "with_patch": _r(p.median / ob, 3)}
    return out


def report_summary(s: AuditSession) -> dict[str, Any]:
    """The before/after report in numbers, and the exact tuple its recommendation holds for."""
    rep = s.need_report()
    return {
        **_whatif(s),
        # rounded once, as the report prints it (2 decimals): 1.4047 rounded to 3 and then printed with
        # 2 decimals read "1.41x" in the agent's answer beside the report's "1.40x"
        "measured_speedup": _r(rep.measured_speedup, 2),
        "predicted_speedup": [_r(rep.predicted_low), _r(rep.predicted_high)], "confidence": _r(rep.confidence),
        "throughput": {"original": _r(rep.baseline_throughput, 1), "patched": _r(rep.patched_throughput, 1),
                       "unit": rep.throughput_unit, "cache_hits": rep.cache_hits},
        "waste_budget_ms": {bc.bucket: {"original": _ms(bc.before_s), "patched": _ms(bc.after_s),
                                        "original_share": _r(bc.before_share, 3), "status": bc.before_status}
                            for bc in rep.buckets},
        "applied": [{"rule": a.rule_id, "predicted_share_of_step": _r(a.predicted_recovery, 3),
                     "source": f"{a.citation.title}, {a.citation.section}"} for a in rep.applied],
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
    return lambda s, overrides=None: summary(s.variant(overrides))


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
         _params(overrides=_OVERRIDES), lambda s, overrides=None: bench_summary(s.variant(overrides), root=s)),
    Tool("compare_runs", "Compare the original and patched runs: measured vs predicted speedup, the waste budget "
         "before and after, applied rules, and the exact tuple the result holds for; writes the report.",
         _params(), report_summary),
)}

#: The order a full audit calls the tools in (the asset graph's order).
CANONICAL_ORDER: tuple[str, ...] = tuple(TOOLS)
