"""The synthetic corpus (``workloads/synthetic/``): replay each scenario through the KB.

Each scenario folder holds a config file in a real tool's format,
``cached_metrics.json`` (a recorded RunMetrics: measured on CPU or modelled,
never re-labelled), ``environment.yaml`` (the recorded env, host, packages,
cores) and ``expected_findings.yaml`` (``must_fire``, ``must_not_fire``).

Each scenario is also a Dagster partition (``synthetic/<scenario>``) and a
path ``goblin audit`` takes: its audit session replays the recording, and
its report (:func:`goblin_assets.audit.report.replay_report`) says the
numbers are replayed or modelled and that nothing was measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from goblin_assets import workloads_root
from goblin_assets.audit.kb import KnowledgeBase
from goblin_assets.audit.session import AuditSession
from goblin_assets.contracts import ConfigDict, RuleMatch, RunMetrics
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
    """The scenario's audit session up to its rule checks: config parsed, recording replayed, every rule checked
    in the recorded environment (the same stages ``goblin audit`` and the Dagster partition run).

    Raises
    ------
    RunFailed
        The recording is missing, unreadable or of a failed run (message names the file).
    ConfigParseError
        The scenario's config file cannot be parsed.
    """
    spec = yaml.safe_load((folder / "expected_findings.yaml").read_text())
    s = AuditSession.open(load_workload(folder), kb=kb)
    matches = s.rule_checks()
    return Scenario(folder, spec, s.workload.recorded_environment() or {}, s.training_config(), s.profile_run(),
                    s.detect_context(), matches)


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
