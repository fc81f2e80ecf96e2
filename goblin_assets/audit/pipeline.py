"""The audit's stages as plain functions, and ``run_audit`` chaining them without Dagster.

The Dagster assets (``goblin_assets/defs/audit.py``) call the same stage
functions one per asset; ``run_audit`` calls them in order for the CLI and
writes every table in one warehouse transaction at the end, so a failed stage
leaves no partial rows.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from goblin_assets import goblin_home
from goblin_assets.audit.benchmark import benchmark
from goblin_assets.audit.config import parse_config
from goblin_assets.audit.kb import KnowledgeBase, detect_context, load_kb, match_rules
from goblin_assets.audit.patch import propose_patch
from goblin_assets.audit.profile import profile_run
from goblin_assets.redact import redact
from goblin_assets.audit.retrieval import retrieval_scores, run_symptoms
from goblin_assets.audit.report import AuditReport, compare_runs, render_markdown, write_report
from goblin_assets.contracts import BenchmarkResult, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.errors import RunFailed
from goblin_assets.opscope.record import record_workload
from goblin_assets.runners.base import Runner, make_runner, runner_for
from goblin_assets.runners.workload import Workload
from goblin_assets.warehouse import frames as F

Log = Callable[[str], None]


def cores() -> int:
    """CPU cores available to this process (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def training_config(workload: Workload) -> ConfigDict:
    """Stage 1: parse the workload's config file (its entry script unless workload.yaml names one)."""
    return parse_config(workload.config_file)


def profile(workload: Workload, runner: Runner, steps: int, p: Patch | None = None, label: str = "",
            warmup: int = 2, log: Log | None = None) -> RunMetrics:
    """Stage 2: a profiled run of the workload (or of its patched copy ``p``).

    ``log`` (optional) gets one line when the run starts and one when it ends.
    A replay workload is replayed whatever ``runner`` is (:func:`runner_for`).
    Raises RunFailed (naming the script and the reason) when the run fails.
    """
    log = log or (lambda _: None)
    runner = runner_for(workload, runner)
    log(f"{label or 'profile'}: {workload.name}, {warmup} warm-up + {steps} profiled steps ({runner.kind} runner)")
    t0 = time.perf_counter()
    m = profile_run(workload, runner, steps=steps, warmup=warmup, label=label,
                    script=Path(p.patched_file) if p and p.patched_file else None,
                    env=p.env if p else None, unset_env=p.unset_env if p else None)
    if not m.ok:
        raise RunFailed(f"profile_run: {m.failure}\n--- stderr (tail) ---\n{m.stderr_tail[-1500:]}", m)
    log(f"{label or 'profile'}: done in {time.perf_counter() - t0:.1f} s ({m.provenance.kind}): {m.steps} steps, "
        f"{(m.step_time_s or 0) * 1e3:.1f} ms/step, {m.throughput or 0:.1f} {m.unit}/s")
    return m


def kb_matches(config: ConfigDict, metrics: RunMetrics, kb: KnowledgeBase,
               environment: dict | None = None) -> list[RuleMatch]:
    """Stage 5: retrieval proposes, detection confirms.

    Every rule's ``detect`` conditions are checked on this config and run; each
    match also records the cosine similarity of the rule to a symptom sentence
    built from the run's measured waste (all-MiniLM-L6-v2, see retrieval.py).
    ``environment``: a replayed run's recorded ``env``, ``host``, ``packages``
    and ``cores`` (:meth:`Workload.recorded_environment`), read instead of
    this machine's.
    """
    env = environment or {}
    matches = match_rules(kb, detect_context(config, metrics, env=env.get("env"), cores=env.get("cores") or cores(),
                                             host=env.get("host"), packages=env.get("packages")))
    scores = retrieval_scores(kb, run_symptoms(config, metrics))
    for m in matches:
        m.retrieval_score = scores.get(m.rule_id)
    return matches


def patch(config: ConfigDict, kb: KnowledgeBase, matches: list[RuleMatch], metrics: RunMetrics,
          workload: Workload, out_dir: Path) -> Patch:
    """Stage 6: the patch of the user's own file.

    Also writes a patched copy of the workload and ``patch.diff`` (the exact,
    unredacted diff, for ``git apply``) into ``out_dir``, on this machine only.
    A replay workload's rules size the patch for its recorded cores and packages.
    """
    env = workload.recorded_environment() or {}
    p = propose_patch(config, kb, matches, metrics, cores=env.get("cores") or cores(), workload_root=workload.root,
                      out_dir=out_dir, source=workload.config_file, packages=env.get("packages"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "patch.diff").write_text(p.diff, encoding="utf-8")
    return p


def benchmarks(workload: Workload, runner: Runner, config: ConfigDict, p: Patch, steps: int, repeats: int,
               log: Log = print) -> dict[str, BenchmarkResult]:
    """Stage 7: baseline vs patched, alternating repeats (cached)."""
    arms = {
        "baseline": {"config": config.values(), "script": workload.script},
        "patched": {"config": p.new_config, "script": Path(p.patched_file or workload.script), "env": p.env,
                    "unset_env": p.unset_env},
    }
    return benchmark(workload, runner, arms, steps=steps, repeats=repeats, log=log)


@dataclass
class AuditResult:
    """Everything one audit produced; ``frames`` are the warehouse rows."""

    audit_id: str
    workload: Workload
    config: ConfigDict
    before: RunMetrics
    after: RunMetrics
    matches: list[RuleMatch]
    patch: Patch
    bench: dict[str, BenchmarkResult]
    report: AuditReport
    report_path: Path
    markdown: str
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The ``goblin audit --json`` object (keys are a contract: extend, never rename)."""
        return {
            "audit_id": self.audit_id,
            "workload": self.workload.name,
            "config": json.loads(self.config.model_dump_json(exclude={"raw_source"})),
            "baseline": json.loads(self.before.model_dump_json()),
            "patched": json.loads(self.after.model_dump_json()),
            "benchmark": {k: json.loads(v.model_dump_json(exclude={"metrics"})) for k, v in self.bench.items()},
            "measured_speedup": self.report.measured_speedup,
            "predicted_speedup": [self.report.predicted_low, self.report.predicted_high],
            "confidence": self.report.confidence,
            "rules": [a.rule_id for a in self.patch.applied],
            "dropped_rules": self.patch.dropped,
            "diff": redact(self.patch.diff),
            "report_path": str(self.report_path),
        }


def audit_frames(audit_id: str, wl: Workload, before: RunMetrics, after: RunMetrics, sketches: pd.DataFrame,
                 patterns: pd.DataFrame, matches: list[RuleMatch], bench: dict[str, BenchmarkResult],
                 rep: AuditReport, p: Patch, report_path: Path) -> dict[str, pd.DataFrame]:
    """All warehouse rows of one audit, by table."""
    before_id, after_id = f"{audit_id}-profile", f"{audit_id}-patched"
    runs = pd.concat([F.runs_frame(before, before_id, "profile", audit_id),
                      F.runs_frame(after, after_id, "patched", audit_id)], ignore_index=True)
    return {
        "runs": runs,
        "kernels": pd.concat([F.kernels_frame(before, before_id), F.kernels_frame(after, after_id)],
                             ignore_index=True),
        "waste_budget": pd.concat([F.waste_frame(before, before_id, "profile"),
                                   F.waste_frame(after, after_id, "patched")], ignore_index=True),
        "sketches": sketches,
        "patterns": patterns,
        "kb_matches": F.kb_frame(matches, audit_id, wl.name),
        "benchmarks": F.bench_frame(bench, audit_id, wl.name),
        "audits": F.audit_frame(audit_id, wl.name, before_id, after_id, rep, p, report_path),
    }


def run_audit(workload: Workload, runner: Runner | None = None, steps: int = 10, bench_steps: int = 20,
              repeats: int = 3, sketch_steps: int = 3, kb: KnowledgeBase | None = None,
              log: Log = print) -> AuditResult:
    """Run every audit stage on ``workload`` (no Dagster); nothing is written to the warehouse.

    Raises
    ------
    RunFailed, ConfigParseError, KBError, PatchError
        A stage failed; the message names the file and the reason.
    """
    runner = runner or make_runner("local")
    kb = kb or load_kb()
    audit_id = uuid.uuid4().hex[:12]
    out_dir = goblin_home() / "audits" / f"{workload.name}-{audit_id}"
    log(f"[1/8] training_config: parsing {workload.config_file.name}")
    config = training_config(workload)
    log(f"[2/8] profile_run: {steps} steps under torch.profiler after 2 warm-up steps")
    before = profile(workload, runner, steps, label="profile")
    log(f"[3/8] waste_budget: step {before.step_time_s * 1e3:.1f} ms, data_wait "
        f"{before.waste_budget['data_wait'].seconds * 1e3:.1f} ms")
    log("[4/8] tensor_sketches: tapping forward matmuls on the device")
    sketches = record_workload(workload, runner, steps=sketch_steps, run_id=f"{audit_id}-sketch")
    from goblin_assets.opscope.miner import mine_patterns  # torch: imported when an audit runs

    patterns = mine_patterns(sketches)
    log(f"[5/8] kb_matches: {len(kb.rules)} rules checked")
    matches = kb_matches(config, before, kb)
    log(f"[6/8] patch: {sum(m.fired for m in matches)} rules fired")
    p = patch(config, kb, matches, before, workload, out_dir)
    log(f"[7/8] benchmark: baseline vs patched, {repeats} alternating repeats of {bench_steps} steps")
    bench = benchmarks(workload, runner, config, p, bench_steps, repeats, log=log)
    after = profile(workload, runner, steps, p=p, label="patched")
    log("[8/8] audit_report")
    rep = compare_runs(before, after, bench, p, config, model=workload.model)
    report_path = write_report(rep, out_dir)
    frames = audit_frames(audit_id, workload, before, after, sketches, patterns, matches, bench, rep, p, report_path)
    return AuditResult(audit_id=audit_id, workload=workload, config=config, before=before, after=after,
                       matches=matches, patch=p, bench=bench, report=rep, report_path=report_path,
                       markdown=render_markdown(rep, "report.png"), frames=frames)
