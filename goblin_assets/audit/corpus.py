"""The synthetic corpus (``workloads/synthetic/``): replay each scenario through the KB.

Each scenario folder holds a config file in a real tool's format,
``cached_metrics.json`` (a recorded RunMetrics: measured on CPU or modelled,
never re-labelled), ``environment.yaml`` (the recorded env, host, packages,
cores) and ``expected_findings.yaml`` (``must_fire``, ``must_not_fire``).

Each scenario is also a Dagster partition (``synthetic/<scenario>``) whose
audit replays the recording: :func:`replay_report` is its report, which says
the numbers are replayed or modelled and that nothing was measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from goblin_assets import workloads_root
from goblin_assets.audit.config import parse_config
from goblin_assets.audit.kb import KnowledgeBase, detect_context, match_rules
from goblin_assets.contracts import ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.errors import RunFailed
from goblin_assets.redact import redact
from goblin_assets.runners.replay import ReplayRunner, metrics_from_raw
from goblin_assets.runners.workload import load_workload


def corpus_root() -> Path:
    return workloads_root() / "synthetic"


def scenarios(root: Path | None = None) -> list[Path]:
    """Scenario folders (those with ``expected_findings.yaml``), sorted."""
    base = root or corpus_root()
    return sorted(p for p in base.iterdir() if (p / "expected_findings.yaml").is_file()) if base.is_dir() else []


@dataclass
class Scenario:
    """One replayed scenario: its expectations, config, recorded metrics and the KB's verdicts."""

    folder: Path
    spec: dict[str, Any]
    env: dict[str, Any]
    config: ConfigDict
    metrics: RunMetrics
    context: dict[str, Any]
    matches: list[RuleMatch]

    @property
    def fired(self) -> set[str]:
        return {m.rule_id for m in self.matches if m.fired}

    @property
    def missing(self) -> list[str]:
        return [r for r in self.spec["must_fire"] if r not in self.fired]

    @property
    def forbidden(self) -> list[str]:
        return [r for r in self.spec.get("must_not_fire", []) if r in self.fired]


def replay_scenario(folder: Path, kb: KnowledgeBase) -> Scenario:
    """Parse the scenario's config, replay its recording, check every rule in its recorded environment.

    Raises
    ------
    RunFailed
        The recording is missing or unreadable (message names the file).
    """
    spec = yaml.safe_load((folder / "expected_findings.yaml").read_text())
    wl = load_workload(folder)
    envdoc = wl.recorded_environment()
    cfg = parse_config(wl.config_file)
    raw = ReplayRunner().run(wl, "profile", steps=10)
    if not raw.ok:
        raise RunFailed(f"{wl.root / wl.recording}: {raw.failure}")
    metrics = metrics_from_raw(raw)
    ctx = detect_context(cfg, metrics, env=envdoc["env"], cores=envdoc["cores"], host=envdoc["host"],
                         packages=envdoc["packages"])
    return Scenario(folder, spec, envdoc, cfg, metrics, ctx, match_rules(kb, ctx))


def corpus_recall(kb: KnowledgeBase, root: Path | None = None) -> dict[str, Any]:
    """Recall of expected rules over the corpus, and the forbidden rules that fired, per scenario."""
    expected = hits = 0
    per: dict[str, Any] = {}
    for folder in scenarios(root):
        sc = replay_scenario(folder, kb)
        expected += len(sc.spec["must_fire"])
        hits += len(sc.spec["must_fire"]) - len(sc.missing)
        per[folder.name] = {"missing": sc.missing, "forbidden": sc.forbidden}
    return {"scenarios": len(per), "expected": expected, "hits": hits,
            "recall": hits / expected if expected else 0.0, "per_scenario": per}


class ReplayReport(BaseModel):
    """The audit report of a replay workload: recorded numbers, fired rules and the patch.

    Nothing was measured, so the measured throughputs and speedup are None
    (the ``audits`` row keeps them NULL); ``provenance`` is the recording's
    label (``replayed`` or ``modelled``) and ``source`` where it came from.
    The attributes match what :func:`goblin_assets.warehouse.frames.audit_frame`
    reads from an ``AuditReport``.
    """

    workload: str
    unit: str
    provenance: str
    source: str
    predicted_low: float
    predicted_high: float
    confidence: float
    baseline_throughput: float | None = None
    patched_throughput: float | None = None
    measured_speedup: float | None = None
    markdown: str


def replay_report(before: RunMetrics, patch: Patch, config: ConfigDict, model: str = "") -> ReplayReport:
    """The report of an audit whose run was replayed (pure function).

    Parameters
    ----------
    before : RunMetrics
        The replayed profile run (``provenance.kind`` replayed or modelled).
    patch : Patch
        The fired rules applied to the workload's own config file.
    config : ConfigDict
        The parsed config (batch size and sequence length for the footer).
    model : str
        A human-readable model name.

    Units: step times in ms, throughputs in the run's ``throughput_unit``.
    """
    kind, u = before.provenance.kind, before.throughput_unit
    source = before.provenance.source
    rows = [("step time (median)", f"{(before.step_time_s or 0) * 1e3:.1f} ms"),
            (u, f"{before.throughput or 0:,.1f}"), ("MFU", f"{before.mfu_pct or 0:.1f} %"),
            ("memory peak", f"{before.mem_peak_gb or 0:.1f} GB"), ("utilisation", f"{before.util_pct or 0:.0f} %"),
            ("device", before.provenance.device)]
    out = [f"# Goblin audit: {before.workload} ({kind}, nothing measured by this run)", "",
           f"**Measured speedup: not observable.** Every number below is {kind}, from the recording "
           f"`{source}`. A benchmark needs timed runs of the original and the patched workload, and a replay runs "
           f"nothing. Predicted {patch.expected_speedup_low:.2f}x–{patch.expected_speedup_high:.2f}x (modelled "
           f"from the {kind} waste budget), confidence {patch.confidence:.2f}.", "",
           f"## Recorded run ({kind})", "", "| metric | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows],
           "", f"## Waste budget per step ({kind})", "", "| bucket | ms/step | status |", "|---|---|---|",
           *[f"| {k} | {b.seconds * 1e3:.2f} | {b.status} |" for k, b in before.waste_budget.items()],
           "", "## Applied rules", ""]
    out += [f"- **{a.rule_id}** (targets `{a.targets_bucket}`, predicted {a.predicted_recovery:.0%} of the step): "
            f"{a.rationale} Source: [{a.citation.title}]({a.citation.url}), {a.citation.section}."
            for a in patch.applied] or ["No rule fired: nothing to patch."]
    out += ["", "## Patch to your file", "", "```diff", redact(patch.diff).rstrip() or "(no change)", "```", ""]
    if before.warnings:
        out += ["## Notes", "", *[f"- {w}" for w in before.warnings], ""]
    out += ["---", f"Workload `{before.workload}`, model {model or config.model_name or 'unknown'}, "
                   f"batch_size={config.batch_size}, seq_len={config.seq_len}. Numbers: {kind} ({source})."]
    return ReplayReport(workload=before.workload, unit=before.unit, provenance=kind, source=source,
                        predicted_low=patch.expected_speedup_low, predicted_high=patch.expected_speedup_high,
                        confidence=patch.confidence, markdown="\n".join(out) + "\n")
