"""The synthetic corpus (``workloads/synthetic/``): replay each scenario through the KB.

Each scenario folder holds a config file in a real tool's format,
``cached_metrics.json`` (a recorded RunMetrics: measured on CPU or modelled,
never re-labelled), ``environment.yaml`` (the recorded env, host, packages,
cores) and ``expected_findings.yaml`` (``must_fire``, ``must_not_fire``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from goblin_assets import workloads_root
from goblin_assets.audit.config import parse_config
from goblin_assets.audit.kb import KnowledgeBase, detect_context, match_rules
from goblin_assets.contracts import ConfigDict, RuleMatch, RunMetrics
from goblin_assets.errors import RunFailed
from goblin_assets.runners.replay import RECORDING_NAME, ReplayRunner, metrics_from_raw
from goblin_assets.runners.workload import Workload


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
    envdoc = yaml.safe_load((folder / "environment.yaml").read_text())
    cfg = parse_config(folder / spec["config"])
    wl = Workload(name=folder.name, root=folder, entry=spec["config"])
    raw = ReplayRunner(recording=folder / RECORDING_NAME).run(wl, "profile", steps=10)
    if not raw.ok:
        raise RunFailed(f"{folder / RECORDING_NAME}: {raw.failure}")
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
