"""The synthetic corpus (``workloads/synthetic/``): replay each scenario through the KB.

Each scenario folder holds a config file in a real tool's format,
``cached_metrics.json`` (a recorded RunMetrics: measured on CPU or modelled,
never re-labelled), ``environment.yaml`` (the recorded env, host, packages,
cores) and ``expected_findings.yaml`` (``must_fire``, ``must_not_fire``).

Each scenario is also a Dagster partition (``synthetic/<scenario>``) and a
path ``goblin audit`` takes: its audit session replays the recording, and
its report (:func:`goblin_assets.report.markdown.replay_report`) says the
numbers are replayed or modelled and that nothing was measured.

Scenarios are judged one at a time: a scenario whose files cannot be used
(its recording is of a failed run, is missing or invalid; its expectations
do not parse) fails alone, with the reason, and never stops the judgement
of another (:func:`judge_scenario`, :func:`corpus_recall`).  The Dagster
checks judge each partition on its own (``goblin_assets/defs/checks.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from goblin_assets import workloads_root
from goblin_assets.audit.session import AuditSession
from goblin_assets.contracts import ConfigDict, RuleMatch, RunMetrics
from goblin_assets.errors import GoblinError
from goblin_assets.kb.rules import KnowledgeBase
from goblin_assets.runners.workload import RECORDING_NAME, load_workload

#: The file that makes a folder a corpus scenario: the rules it must and must not fire.
EXPECTATIONS = "expected_findings.yaml"


class ScenarioError(GoblinError):
    """A scenario's files cannot be used: expectations that do not parse, a missing or failed recording."""


def corpus_root() -> Path:
    """The corpus folder: ``$GOBLIN_WORKLOADS/synthetic`` (it may not exist)."""
    return workloads_root() / "synthetic"


def is_scenario(folder: Path) -> bool:
    """True when ``folder`` holds :data:`EXPECTATIONS` (a corpus scenario, judged by its expectations)."""
    return (folder / EXPECTATIONS).is_file()


def expectations(folder: Path) -> dict[str, Any]:
    """The scenario's ``expected_findings.yaml``: ``must_fire`` (a non-empty list), ``must_not_fire`` (a list).

    Raises
    ------
    ScenarioError
        The file is missing, is not YAML, or lacks a ``must_fire`` list (message names the file).
    """
    path = folder / EXPECTATIONS
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: cannot read the expectations ({exc})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("must_fire"), list) or not spec["must_fire"]:
        raise ScenarioError(f"{path}: expected a mapping with a non-empty must_fire list")
    if not isinstance(spec.get("must_not_fire", []), list):
        raise ScenarioError(f"{path}: must_not_fire must be a list")
    return spec


def recording_problem(folder: Path, failed_is_evidence: bool = False) -> str | None:
    """Why the scenario's recording cannot be replayed (missing, invalid, or of a failed run); None when it can.

    The reason names the file and, for a failed run, its recorded failure.  With ``failed_is_evidence`` a
    recording of a failed run is no problem: its audit is of the failure (the Dagster partition's check).
    """
    from goblin_assets.runners.replay import ReplayError, load_recording

    path = folder / RECORDING_NAME
    try:
        rec = load_recording(path)
    except ReplayError as exc:
        return str(exc)
    if not rec.ok and not failed_is_evidence:
        return f"{path}: a recording of a failed run (ok: false): {rec.failure or 'no failure recorded'}"
    return None


def judge(spec: dict[str, Any], fired: set[str]) -> tuple[list[str], list[str]]:
    """``(missing, forbidden)``: ``must_fire`` rules that did not fire, ``must_not_fire`` rules that did."""
    return ([r for r in spec["must_fire"] if r not in fired],
            [r for r in spec.get("must_not_fire", []) if r in fired])


def scenarios(root: Path | None = None) -> list[Path]:
    """Scenario folders (those with ``expected_findings.yaml``), sorted; [] when the corpus folder does not exist."""
    base = root or corpus_root()
    return sorted(p for p in base.iterdir() if is_scenario(p)) if base.is_dir() else []


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
        return judge(self.spec, self.fired)[0]

    @property
    def forbidden(self) -> list[str]:
        return judge(self.spec, self.fired)[1]


def replay_scenario(folder: Path, kb: KnowledgeBase) -> Scenario:
    """The scenario's audit session up to its rule checks: config parsed, recording replayed, every rule checked
    in the recorded environment (the same stages ``goblin audit`` and the Dagster partition run).

    Raises
    ------
    ScenarioError
        The expectations do not parse (:func:`expectations`).
    RunFailed
        The recording is missing, unreadable or of a failed run (message names the file).
    ConfigParseError
        The scenario's config file cannot be parsed.
    """
    spec = expectations(folder)
    s = AuditSession.open(load_workload(folder), kb=kb)
    matches = s.rule_checks()
    return Scenario(folder, spec, s.workload.recorded_environment() or {}, s.training_config(), s.profile_run(),
                    s.detect_context(), matches)


def judge_scenario(folder: Path, kb: KnowledgeBase) -> dict[str, Any]:
    """One scenario's verdict; never raises, so one bad scenario cannot stop the judgement of another.

    Returns
    -------
    dict
        ``passed`` (bool), ``missing`` and ``forbidden`` (rule ids),
        ``expected`` (``must_fire`` rules, 0 when the expectations do not
        parse) and ``error``: None, or why the scenario could not be
        replayed (its expectations, recording, workload or config; the
        message names the file), with the exception's type.
    """
    expected = 0
    try:
        expected = len(expectations(folder)["must_fire"])
        problem = recording_problem(folder)
        if problem is not None:
            raise ScenarioError(problem)
        sc = replay_scenario(folder, kb)
    except Exception as exc:  # noqa: BLE001 - a scenario folder is user data: any failure is its verdict
        return {"passed": False, "missing": [], "forbidden": [], "expected": expected,
                "error": f"{type(exc).__name__}: {exc}"}
    missing, forbidden = sc.missing, sc.forbidden
    return {"passed": not missing and not forbidden, "missing": missing, "forbidden": forbidden,
            "expected": expected, "error": None}


def corpus_recall(kb: KnowledgeBase, root: Path | None = None) -> dict[str, Any]:
    """Recall of expected rules over the corpus, and every scenario's verdict (:func:`judge_scenario`).

    Never raises for a scenario: one that cannot be replayed counts its
    ``must_fire`` rules as missed and says why (``error``).  No corpus folder
    (or no scenario in it): ``scenarios`` 0 and ``recall`` None.

    Returns
    -------
    dict
        ``scenarios``, ``expected`` and ``hits`` (counts), ``recall``
        (hits / expected, None when nothing is expected), ``per_scenario``
        (name -> verdict) and ``failed`` (name -> one line saying why, for
        each scenario that did not pass).
    """
    expected = hits = 0
    per: dict[str, Any] = {}
    for folder in scenarios(root):
        v = per[folder.name] = judge_scenario(folder, kb)
        expected += v["expected"]
        hits += v["expected"] - len(v["missing"]) if v["error"] is None else 0
    return {"scenarios": len(per), "expected": expected, "hits": hits,
            "recall": hits / expected if expected else None, "per_scenario": per,
            "failed": {name: verdict_line(v) for name, v in per.items() if not v["passed"]}}


def verdict_line(v: dict[str, Any]) -> str:
    """One line saying why a verdict of :func:`judge_scenario` failed ("passed" when it did not fail)."""
    if v["error"]:
        return v["error"]
    parts = ([f"must fire but did not: {', '.join(v['missing'])}"] if v["missing"] else []) + (
        [f"must not fire but did: {', '.join(v['forbidden'])}"] if v["forbidden"] else [])
    return "; ".join(parts) or "passed"
