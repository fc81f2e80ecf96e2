"""The audit session: the one orchestrator behind every front door.

``goblin audit``, every tool of the audit agent (``goblin chat``) and every
audit asset in Dagster call the stages of one :class:`AuditSession` and
nothing else.  A stage runs at most once per session (its result is
memoised); a session can be *seeded* with results computed elsewhere (a
Dagster asset passes its upstream assets' values), so a stage never re-runs
what it was given.

Stages, in order (each named as its asset):

=================  =====================================================  ==========================
stage              what it returns                                        warehouse tables
=================  =====================================================  ==========================
training_config    the parsed ConfigDict (per-field provenance)           configs
profile_run        a profiled run of the original (RunMetrics)            runs, kernels
waste_budget       the profiled run's buckets                             waste_budget
tensor_sketches    matmul sketch rows (tidy)                              sketches
mined_patterns     findings per site and role                             patterns
kb_index           the KB's rule embeddings (all-MiniLM-L6-v2)            kb_embeddings (new only)
kb_matches         every rule checked on config, run, host and patterns   kb_matches
patch              the fired rules applied to the user's own file         -
benchmarks         baseline vs patched, alternating repeats               benchmarks
patched_run        the patched program profiled                           runs, kernels, waste_budget
audit_report       the report (measured, or replayed for a recording)     audits
=================  =====================================================  ==========================

A *replay* workload (a folder holding a recording, ``cached_metrics.json``,
and no runnable script: the synthetic corpus) is never executed: its profile
run is the recording (labelled replayed or modelled), the stages that need a
measurement (tensor_sketches, benchmarks, patched_run) are ``not_observable``
with the reason in :attr:`AuditSession.not_observable`, and the recorded
environment (``environment.yaml``) is the session's host everywhere: rule
checks, the patch's ``cores`` and package versions.

Audit ids have one scheme, :func:`make_audit_id`; the runs of an audit are
``<audit_id>-profile``, ``-patched`` and ``-sketch``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from goblin_assets import goblin_home
from goblin_assets.config.observed import effective_config
from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import (
    CONFIG_FIELDS,
    BenchmarkResult,
    ConfigDict,
    Patch,
    RuleMatch,
    RunMetrics,
    WasteBucket,
)
from goblin_assets.errors import GoblinError, KBError, RunFailed
from goblin_assets.host import HostFacts, current_host, for_interpreter, keyword_names
from goblin_assets.ids import make_audit_id
from goblin_assets.kb.retrieval import KBIndex, embedding_frame, index_for, retrieval_scores, run_symptoms
from goblin_assets.kb.rules import (KnowledgeBase, detect_context, eval_fix_value, fix_assignments, load_kb,
                                     local_world_size, match_rules)
from goblin_assets.measure.invariants import remedy_check, warned_values
from goblin_assets.measure.benchmark import bench_interval, benchmark, rate_text
from goblin_assets.measure.calibration import Calibration, calibrate
from goblin_assets.measure.evidence import NonfiniteEvidence, nonfinite_evidence
from goblin_assets.measure.failure import diagnose_failure
from goblin_assets.measure.compile_counters import compile_events_frame, compile_stats
from goblin_assets.measure.hang import hang_section, read_hang_state
from goblin_assets.measure.profile import profile_run, timed_metrics
from goblin_assets.opscope.tensor_findings import TensorFindings
from goblin_assets.opscope.tensor_findings import tensor_findings as grade_tensors
from goblin_assets.patch.changeset import ChangeSet
from goblin_assets.patch.propose import edit_source, propose_patch, unified_diff, write_changes
from goblin_assets.redact import redact
from goblin_assets.report.compare import AuditReport, compare_runs, hazard_notes
from goblin_assets.report.html import write_html, write_report
from goblin_assets.report.markdown import ReplayReport, replay_report
from goblin_assets.report.verdict import Verdict, audit_verdict, measured_slower
from goblin_assets.runners.base import Runner
from goblin_assets.runners.devices import device_facts
from goblin_assets.runners.factory import make_runner, runner_for
from goblin_assets.runners.replay import not_observable
from goblin_assets.runners.workload import Workload
from goblin_assets.settings import AuditSettings
from goblin_assets.warehouse import frames as F
from goblin_assets.warehouse.tables import columns

Log = Callable[[str], None]

#: The keys of ``goblin audit --json``'s ``oom_fix`` object (a contract: extend, never rename).
OOM_FIX_KEYS = ("lever", "rule", "change", "global_batch_before", "global_batch_after", "ok", "failure",
                "samples_per_sec", "predicted_peak_bytes", "diff")

#: The stages of an audit, in the order a full audit runs them (each is a method of AuditSession and an asset).
STAGES: tuple[str, ...] = ("training_config", "profile_run", "waste_budget", "tensor_sketches", "mined_patterns",
                           "kb_index", "kb_matches", "patch", "benchmarks", "patched_run", "audit_report")

#: Unrecorded optimizer steps before a sketch recording (the evidence numbers training steps from it).
SKETCH_WARMUP = 1

#: Stages that run the user's program as written: when one fails, the audit fails and its report says so.
RUNS_OF_THE_ORIGINAL: tuple[str, ...] = ("profile_run", "tensor_sketches", "benchmarks")

#: Distributions whose installed version decides which config keys a patch may write (version-gated keys).
PATCH_PACKAGES: tuple[str, ...] = ("transformers", "torch", "peft", "trl", "bitsandbytes")


class WhatIfError(GoblinError):
    """A what-if change cannot be used (names the field and the reason)."""


@dataclass
class AuditSession:
    """One workload's audit: how to run it, where it belongs, and every stage result so far.

    Build one with :meth:`open`.  Stage methods are named as the Dagster
    assets; each runs at most once and raises the stage's typed error
    (ConfigParseError, RunFailed, KBError, PatchError, WarehouseError) with a
    message naming the file and the reason.
    """

    workload: Workload
    settings: AuditSettings
    runner: Runner
    host: HostFacts
    audit_id: str
    out_dir: Path
    log: Log = field(default=lambda _: None, repr=False)
    kb: KnowledgeBase | None = field(default=None, repr=False)
    cached_embeddings: pd.DataFrame | None = field(default=None, repr=False)
    history: pd.DataFrame | None = field(default=None, repr=False)
    overrides: dict[str, Any] = field(default_factory=dict)
    whatif_diff: str = ""
    results: dict[str, Any] = field(default_factory=dict, repr=False)
    not_observable: dict[str, str] = field(default_factory=dict)
    device_traces: dict[str, Any] = field(default_factory=dict, repr=False)
    variants: dict[str, AuditSession] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ building

    @classmethod
    def open(cls, workload: Workload, *, settings: AuditSettings | None = None, runner: Runner | None = None,
             kb: KnowledgeBase | None = None, host: HostFacts | None = None, token: str | None = None,
             audit_id: str | None = None, out_dir: Path | None = None, log: Log | None = None,
             cached_embeddings: pd.DataFrame | None = None, history: pd.DataFrame | None = None,
             **seeds: Any) -> AuditSession:
        """A session for ``workload``.

        Parameters
        ----------
        settings
            Step budgets and limits (default :meth:`AuditSettings.from_env`).
        runner
            Where runs happen (default: the settings' runner kind).  A replay
            workload always gets the replay runner on its recording.
        kb
            The rules (default: loaded when a stage first needs them).
        host
            The host facts (default: the recording's for a replay workload,
            else :func:`goblin_assets.host.current_host`).
        token, audit_id
            The audit id is ``audit_id``, else :func:`make_audit_id` of ``token``.
        out_dir
            Where the patched copy, ``patch.diff`` and the report go (default
            ``$GOBLIN_HOME/audits/<audit_id>``).
        cached_embeddings
            Rows of the ``kb_embeddings`` table for this KB version, when the
            caller read them from the warehouse (the index is then not encoded).
        history
            Rows of the ``audits`` table the caller read from the warehouse
            (:data:`goblin_assets.measure.calibration.HISTORY_SQL`): the applied
            rules' measured record scales the predicted range and confidence
            (:meth:`calibration`).  None: the model's prediction unscaled.
        **seeds
            Stage results computed elsewhere, by stage name (e.g. ``profile_run=m``).

        Raises
        ------
        WorkloadError
            A replay workload's ``environment.yaml`` is not a mapping.
        RunnerError
            The runner cannot be built (unknown kind or setting).
        InterpreterError
            The job's interpreter (``settings.python`` or the workload's
            ``python:``) does not run; its package versions are the host's.
        """
        settings = settings or AuditSettings.from_env()
        runner = runner_for(workload, runner or make_runner(
            settings.kind, **settings.runner_settings(python=workload.interpreter)))
        if host is None:
            recorded = workload.recorded_environment() if workload.replay else None
            host = (HostFacts.from_recording(recorded, workload.root / (workload.environment or ""))
                    if recorded is not None else for_interpreter(current_host(), getattr(runner, "python", None)))
        aid = audit_id or make_audit_id(workload.name, token)
        unknown = sorted(set(seeds) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
        return cls(workload=workload, settings=settings, runner=runner, host=host, audit_id=aid,
                   out_dir=out_dir or goblin_home() / "audits" / aid, log=log or (lambda _: None), kb=kb,
                   cached_embeddings=cached_embeddings, history=history,
                   results={k: v for k, v in seeds.items() if v is not None})

    @property
    def replay(self) -> bool:
        """True when the workload is a recording: nothing is run, measured stages are not observable."""
        return self.workload.replay

    def _memo(self, stage: str, compute: Callable[[], Any]) -> Any:
        if stage not in self.results:
            try:
                self.results[stage] = compute()
            except RunFailed as exc:
                if stage not in RUNS_OF_THE_ORIGINAL:
                    raise
                path = self._failure_report(stage, exc)
                raise RunFailed(f"{exc}\nreport: {path}", exc.metrics) from None
        return self.results[stage]

    def _failure_report(self, stage: str, exc: RunFailed) -> Path:
        """Write ``report.md`` saying the original program failed in ``stage``, why, and what was not run."""
        m = exc.metrics
        first, _, _ = str(exc).partition("\n--- stderr")
        self.results["failure"] = f"`{stage}`: {redact(first)}"
        self.results["failure_stage"] = stage
        lines = [f"# Goblin audit: {self.workload.name} (the original program failed)", "",
                 f"**The audit stopped at `{stage}`: your program failed as written, before any patch.** "
                 f"{redact(first)}", "",
                 "Nothing was benchmarked and no rule was applied: a patch is only measured against an original "
                 "that runs. Fix the failure (or audit a configuration that runs) and audit again.", ""]
        lines += self._failure_evidence(first, m)
        if "ran out of memory" in first:
            lines += self._oom_section(exc)
        hang = read_hang_state(getattr(m, "run_dir", None))
        if hang is not None:  # a run that made no progress: where each thread waited (measure/hang.py)
            self.results["failure_kind"] = "hung"
            try:
                rules = self.rules().rules
            except KBError:  # the report still says where it waited
                rules = []
            lines += hang_section(hang, rules)
        tail = (getattr(m, "stderr_tail", "") or "").strip()
        if tail:
            lines += ["## The end of its stderr", "", "```", redact(tail[-2000:]), "```", ""]
        done = [st for st in STAGES if st in self.results]
        lines += ["## Stages", "", f"Completed: {', '.join(done) or 'none'}; failed: {stage}.", "",
                  "---", f"Workload `{self.workload.name}` ({self.workload.script}), interpreter "
                  f"{getattr(self.runner, 'python', None) or 'goblin'}, runner {self.runner.kind}."]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / "report.md"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.results["report_path"] = path
        return path

    def _failure_evidence(self, first: str, m: RunMetrics | None) -> list[str]:
        """The failure as evidence: its class (measure/failure.py) and the rules that match on what it printed.

        Sets ``results["failure_diagnosis"]`` (a FailureDiagnosis) and ``results["failure_matches"]`` (every
        rule checked on the failed run's config, recording, host and failure signals); returns the report's
        "Diagnosis" section.  A rule check that cannot run is said in :attr:`not_observable` (``failure_rules``).
        """
        diag = diagnose_failure(first, getattr(m, "stderr_tail", "") or "", m)
        self.results["failure_diagnosis"] = diag
        matches: list[RuleMatch] = []
        cfg = self._failure_config(m)
        if m is not None:
            try:
                # a failed run's checks were never judged, but its warnings are in what it printed
                invariants = m.invariants or [remedy_check(m.stderr_tail or "")]
                self.results["failure_warned"] = warned_values(invariants)
                failed = m.model_copy(update={"signals": diag.signals, "invariants": invariants})
                matches = match_rules(self.rules(), detect_context(
                    cfg, failed, self.host, cores=self.cores(),
                    patterns=pd.DataFrame(columns=columns("patterns"))))
            except GoblinError as exc:
                self.not_observable["failure_rules"] = f"the rules could not be checked on the failure: {exc}"
        self.results["failure_matches"] = matches
        known = [f"exit status {diag.exit_status}" if diag.exit_status is not None else "",
                 f"{diag.last_step} steps completed" if diag.last_step else ""]
        lines = ["## Diagnosis", "", f"**{diag.label}** (class `{diag.failure_class}`)"
                 + (f": `{redact(diag.evidence)}`" if diag.evidence else "") + "."
                 + (f" {'; '.join(k for k in known if k)}." if any(known) else ""), ""]
        if diag.device_oom is not None:
            lines += [f"**The allocator's numbers** (`{diag.device_oom.kind}`): {diag.device_oom.sentence()}.", ""]
        lines += self._snapshot_evidence()
        lines += self._observed_before_failure(cfg)
        notes = hazard_notes(self.rules(), matches) if matches else []
        if notes:
            lines += ["## Rules that match the failure", ""]
            lines += [f"- **{h.rule_id}** ({h.kind}): {h.text} What to do: {h.action} Source: [{h.title}]({h.url})"
                      for h in notes]
            lines.append("")
        changes = self._failure_changes(matches)
        if changes:
            lines += ["## Changes the rules suggest for the failure (not validated by this audit unless said below)",
                      "", *changes, ""]
        return lines

    def _failure_config(self, m: RunMetrics | None) -> ConfigDict:
        """The config of a failed run: the parsed one with what the harness observed before the failure over it
        (``RunMetrics.observed`` of the failed run, written after each warm-up step), else the parsed one."""
        cfg = self._as_ran(m.observed) if m is not None and m.observed and not self.replay else \
            self.training_config()
        self.results["failure_config"] = cfg
        return cfg

    def _as_ran(self, observed: dict | None) -> ConfigDict:
        """The parsed config with a run's ``observed`` record over it (config/observed.py effective_config)."""
        entry = self.workload.config_file.resolve() == self.workload.script.resolve()
        return effective_config(self.training_config(), observed, args=list(self.workload.args or []),
                                config_is_entry=entry, source=self.workload.script)

    def _observed_before_failure(self, cfg: ConfigDict) -> list[str]:
        """The report's lines on the settings observed before the failure ([] when none were)."""
        seen = [f for f, p in cfg.provenance.items() if p.kind == "observed"]
        if not seen:
            return []
        vals = cfg.values()
        lines = ["## How it ran before the failure (observed)", "",
                 "Read from the running program after its warm-up steps (the values rules matched on): "
                 + ", ".join(f"{f} `{vals.get(f)}`" for f in seen) + ".", ""]
        lines += [f"- {d.why}" for d in cfg.disagreements]
        return lines + ([""] if cfg.disagreements else [])

    def _failure_changes(self, matches: list[RuleMatch]) -> list[str]:
        """One line per fired tuning rule with a change (its environment and config edits, its source)."""
        out = []
        by_id = self.rules().by_id if matches else {}
        cfg = self.results.get("failure_config") or self.training_config()
        values = {"cores": self.cores(), **cfg.values()} if matches else {}

        def config_edit(field: str, raw: Any) -> str:
            try:
                return f"`{field}: {values.get(field)} -> {eval_fix_value(raw, values)}`"
            except KBError:  # a value the expression needs is undetermined: show the rule's own expression
                return f"`{field}: {raw}`"

        for m in matches:
            r = by_id.get(m.rule_id) if m.fired else None
            if r is None or r.kind != "tuning":
                continue
            edits = [f"`{k}={v}`" for k, v in r.fix.env.items()] + [f"unset `{k}`" for k in r.fix.unset_env] + \
                    [config_edit(k, v) for k, v in fix_assignments(r.fix.config, self.results.get("failure_warned")
                                                                   or {})]
            if edits:
                out.append(f"- **{r.id}**: {' '.join(r.symptom.split())} Change: {', '.join(edits)}. "
                           f"Source: [{r.citation.title}]({r.citation.url})")
        return out

    def _snapshot_evidence(self) -> list[str]:
        """A memory snapshot in the workload's folder (``*.pickle``, ``torch.cuda.memory._dump_snapshot``) read
        for the failure report (trace/memory_snapshot.py: nothing in it is run); [] when there is none."""
        from goblin_assets.trace.memory_snapshot import analyze_snapshot

        lines: list[str] = []
        for path in sorted(self.workload.root.glob("*.pickle"))[:1]:
            try:
                rep = analyze_snapshot(path)
            except GoblinError as exc:
                self.not_observable["memory_snapshot"] = str(exc)
                continue
            self.results["memory_snapshot"] = rep
            lines += [f"## Memory snapshot ({path.name})", "", *[f"- {d}" for d in rep.diagnosis],
                      *[f"- {k}: {v}" for k, v in rep.notes.items()], ""]
        return lines

    def _oom_section(self, exc: RunFailed) -> list[str]:
        """The out-of-memory part of a failure report: where, the largest consumers, the validated fix
        (:func:`goblin_assets.audit.fit.oom_fix`, kept in ``results["oom_fix"]``)."""
        from goblin_assets.audit.fit import oom_fix, oom_report_lines
        from goblin_assets.runners.oom import read_oom_state

        run_dir = getattr(exc.metrics, "run_dir", None)
        found = read_oom_state(Path(run_dir)) if run_dir else None
        state = found.model_dump() if found is not None else None
        self.results["oom_state"] = state
        self.log("out of memory: probing the step's memory to split the micro-batch")
        try:
            fix = oom_fix(self)
        except GoblinError as err:
            fix, self.not_observable["oom_fix"] = None, str(err)
        self.results["oom_fix"] = fix
        try:
            rules = self.rules().by_id
        except GoblinError:
            rules = None
        return oom_report_lines(state, fix, self.not_observable.get("oom_fix"), rules)

    def memory_fit(self, device: str | None = None) -> dict[str, Any]:
        """``goblin fit``: the step's memory term by term against a budget, and the levers
        (:func:`goblin_assets.audit.fit.memory_fit`; not a stage of the audit: it runs probes only)."""
        from goblin_assets.audit.fit import memory_fit

        key = f"memory_fit:{device or ''}"
        if key not in self.results:
            self.results[key] = memory_fit(self, device)
        return self.results[key]

    def rules(self) -> KnowledgeBase:
        """The knowledge base (loaded on first use).  Raises KBError."""
        if self.kb is None:
            self.kb = load_kb()
        return self.kb


    def cores(self) -> int:
        """CPU cores of one process of the job (the ``cores`` name of detect conditions and fix expressions).

        The host's cores (its CPU affinity) shared by the processes the launcher
        starts on this node (``LOCAL_WORLD_SIZE`` and the like,
        :func:`goblin_assets.kb.rules.local_world_size`): with 8 ranks on 80 CPUs
        each rank sizes its workers and threads from 10, never from 80.
        """
        total = self.host.cores or self.host.affinity_cpus or self.host.online_cpus or 1
        return max(1, total // local_world_size(self.host.job_env()))

    def packages_seen(self) -> dict[str, str | None]:
        """The package versions of the job's environment the audit knows (interpreter or recording), by name."""
        return {**{p: self.host.package(p) for p in PATCH_PACKAGES}, **self.host.packages}

    def packages(self) -> dict[str, str | None]:
        """Versions of the libraries that gate config keys (:data:`PATCH_PACKAGES`), from the host facts."""
        return {p: self.host.package(p) for p in PATCH_PACKAGES}

    # ------------------------------------------------------------------ stages

    def training_config(self) -> ConfigDict:
        """Stage ``training_config``: the workload's config file parsed.  Raises ConfigParseError."""
        def parse() -> ConfigDict:
            self.log(f"training_config: parsing {self.workload.config_file.name}")
            return parse_config(self.workload.config_file)
        return self._memo("training_config", parse)

    def effective_config(self) -> ConfigDict:
        """The config as it ran: the parsed ConfigDict with every value the profiled run observed over it
        (provenance ``observed``; the parsed values beside them; each disagreement listed, issue 27).

        Rules, the waste-budget model, the patch's sizing and the report read
        this; the patch writes into the file's own lines (``ConfigDict.as_parsed``),
        and into the entry script's statement that set a disagreeing value when
        that is a literal of the same file (``Disagreement.patchable``); it
        refuses a field whose winning value is set where it cannot write.  A
        replay (no run, no observation) is the parsed config.  Memoised.
        """
        def merge() -> ConfigDict:
            if self.replay:
                return self.training_config()
            eff = self._as_ran(self.profile_run().observed)
            for d in eff.disagreements:
                self.log(f"effective_config: {d.why}")
            return eff
        return self._memo("effective_config", merge)

    def _profile(self, label: str, p: Patch | None = None) -> RunMetrics:
        s = self.settings
        self.log(f"{label}: {self.workload.name}, {s.warmup_steps} warm-up + {s.profiled_steps} profiled steps "
                 f"({self.runner.kind} runner)")
        t0 = time.perf_counter()
        m = profile_run(self.workload, self.runner, steps=s.profiled_steps, warmup=s.warmup_steps, label=label,
                        script=Path(p.patched_file) if p and p.patched_file else None,
                        env=p.env if p else None, unset_env=p.unset_env if p else None, host=self.host)
        if not m.ok:
            raise RunFailed(f"profile_run: {m.failure}\n--- stderr (tail) ---\n{m.stderr_tail[-1500:]}", m)
        self.log(f"{label}: done in {time.perf_counter() - t0:.1f} s ({m.provenance.kind}): {m.steps} steps, "
                 f"{(m.step_time_s or 0) * 1e3:.1f} ms/step, {rate_text(m.throughput, m.unit)}")
        return m

    def profile_run(self) -> RunMetrics:
        """Stage ``profile_run``: the original under torch.profiler (or the recording, replayed).  Raises RunFailed."""
        return self._memo("profile_run", lambda: self._profile("profile"))

    def waste_budget(self) -> dict[str, WasteBucket]:
        """Stage ``waste_budget``: the profiled run's step time split into buckets (seconds per step)."""
        return self._memo("waste_budget", lambda: self.profile_run().waste_budget)

    def _why_not(self, mode: str) -> str | None:
        reason = not_observable(self.workload, self.runner, mode)
        if reason:
            self.not_observable.setdefault("tensor_sketches" if mode == "sketch" else "benchmarks", reason)
        return reason

    def tensor_sketches(self) -> pd.DataFrame:
        """Stage ``tensor_sketches``: every forward matmul's operands sketched on the device (tidy rows).

        Empty for a replay (the reason is in :attr:`not_observable`).  Raises RunFailed.
        """
        def record() -> pd.DataFrame:
            if self._why_not("sketch"):
                self.log(f"tensor_sketches: {self.not_observable['tensor_sketches']}")
                return pd.DataFrame(columns=columns("sketches"))
            from goblin_assets.opscope.record import record_sketches  # torch: imported when a recording runs

            self.log(f"tensor_sketches: tapping forward matmuls for {self.settings.sketch_steps} steps")
            rec = record_sketches(self.workload, self.runner, steps=self.settings.sketch_steps,
                                  warmup=SKETCH_WARMUP, run_id=f"{self.audit_id}-sketch")
            self.results["sketch_run"] = timed_metrics(rec.raw, self.workload, self.host)
            self.log(f"tensor_sketches: {len(rec.rows)} rows from {rec.rows['site'].nunique()} sites")
            return rec.rows
        return self._memo("tensor_sketches", record)

    def mined_patterns(self) -> pd.DataFrame:
        """Stage ``mined_patterns``: findings per site and role of the sketches (empty when there are none)."""
        def mine() -> pd.DataFrame:
            sk = self.tensor_sketches()
            if sk.empty:
                return pd.DataFrame(columns=columns("patterns"))
            from goblin_assets.opscope.miner import mine_patterns  # torch: imported when it runs

            return mine_patterns(sk)
        return self._memo("mined_patterns", mine)

    def tensor_findings(self) -> TensorFindings:
        """Graded findings of the sketches and patterns: precision range, FP8, frozen base, sparsity (memoised).

        Empty for a replay.  FP8 readiness is stated only for a device with
        FP8 matrix units (the profiled run's device, :func:`device_facts`).
        See :mod:`goblin_assets.opscope.tensor_findings`.
        """
        def grade() -> TensorFindings:
            prov = self.profile_run().provenance
            return grade_tensors(self.tensor_sketches(), self.mined_patterns(),
                                 precision=self.effective_config().precision,
                                 device=device_facts(prov.device, prov.arch, None, self.host.cpu_bf16_matmul),
                                 sketch_warmup=SKETCH_WARMUP)
        return self._memo("tensor_findings", grade)

    def kb_index(self) -> KBIndex:
        """Stage ``kb_index``: the rules' embeddings, from the cached rows given to :meth:`open` or encoded now."""
        return self._memo("kb_index", lambda: index_for(self.rules(), self.cached_embeddings))

    def kb_matches(self) -> list[RuleMatch]:
        """Stage ``kb_matches``: retrieval proposes, detection confirms.

        Every rule's ``detect`` conditions are checked on the config, the
        profiled run, the session's host facts (the recording's for a replay)
        and the mined patterns (``patterns.<site>.<finding>``); each match also
        records the cosine similarity of the rule to a symptom sentence built
        from the run's measured waste (all-MiniLM-L6-v2, see retrieval.py).
        """
        def match() -> list[RuleMatch]:
            scores = retrieval_scores(self.kb_index(), run_symptoms(self.effective_config(), self.profile_run()))
            matches = [m.model_copy(update={"retrieval_score": scores.get(m.rule_id)}) for m in self.rule_checks()]
            self.log(f"kb_matches: {len(matches)} rules checked, {sum(m.fired for m in matches)} fired")
            return matches
        return self._memo("kb_matches", match)

    def detect_context(self) -> dict[str, Any]:
        """What detect conditions read: config, profiled run, host facts, job environment, mined patterns and
        the graded tensor findings (``tensors.<group>.<key>``)."""
        return detect_context(self.effective_config(), self.profile_run(), self.host, cores=self.cores(),
                              patterns=self.mined_patterns(), tensors=self.tensor_findings())

    def rule_checks(self) -> list[RuleMatch]:
        """Every rule's detect conditions on :meth:`detect_context` (fired first), without retrieval scores.

        :meth:`kb_matches` is this plus the retrieval scores; the KB's corpus
        recall reads this alone (no embedding model needed).
        """
        return self._memo("rule_checks", lambda: match_rules(self.rules(), self.detect_context()))

    def patch(self) -> Patch:
        """Stage ``patch``: the fired rules applied to a copy of the user's own file.

        Writes the patched copy (``out_dir/workload``) and ``patch.diff`` (the
        exact, unredacted diff, for ``git apply``) on this machine only; rules
        are sized for the session host's cores and package versions.
        Raises PatchError.
        """
        def propose() -> Patch:
            p = propose_patch(self.effective_config(), self.rules(), self.kb_matches(), self.profile_run(),
                              cores=self.cores(), workload_root=self.workload.root, out_dir=self.out_dir,
                              source=self.workload.config_file, packages=self.packages(),
                              signatures=self.signatures)
            p = self._validated(p)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "patch.diff").write_text(p.diff, encoding="utf-8")
            self.log(f"patch: {len(p.applied)} rules applied, {len(p.dropped)} dropped")
            return p
        return self._memo("patch", propose)

    # ------------------------------------------------------------------ patch validation

    def _validation_failure(self, p: Patch) -> str | None:
        """Run the patched program for one optimizer step (same runner, same sandbox): None, or why it failed."""
        raw = self.runner.run(self.workload, "benchmark", steps=1, warmup=0,
                              script=Path(p.patched_file or self.workload.script), env=p.env, unset_env=p.unset_env,
                              label="validate")
        self.results.setdefault("patch_validation", []).append(
            {"rules": [a.rule_id for a in p.applied], "ok": raw.ok, "failure": raw.failure})
        return None if raw.ok else raw.failure

    def signatures(self, dotted: str) -> list[str] | None:
        """Keyword names of ``dotted`` in the job's interpreter (the user's installed library decides)."""
        return keyword_names(dotted, getattr(self.runner, "python", None))

    def _written(self, cs: ChangeSet, out_dir: Path) -> Patch:
        """``cs`` written into a copy of the workload under ``out_dir`` (see :func:`write_changes`)."""
        return write_changes(self.effective_config(), cs, self.workload.config_file, self.packages(),
                             self.workload.root, out_dir, self.signatures)

    def _validated(self, p: Patch) -> Patch:
        """``p`` after validation: culprit rules dropped, each with the child's own error line.

        The patched program runs one step first.  When it fails, each applied
        rule is tried alone; the rules that fail alone are the culprits (when
        none does, the rules are added one at a time in uplift order and the
        first whose addition fails is).  The culprits are excluded from the
        change-set, which is re-resolved, written and validated again, until
        the patched program runs or no rule is left.  A replay runs nothing:
        its patch is not validated (``not_observable`` says so).
        """
        if not p.applied or p.change_set is None:
            return p
        if self._why_not("benchmark"):
            self.not_observable.setdefault("patch_validation", self.not_observable["benchmarks"])
            return p
        cs = ChangeSet.model_validate(p.change_set)
        while p.applied:
            self.log(f"patch: validating {len(p.applied)} rule(s) with one step of the patched program")
            failure = self._validation_failure(p)
            if failure is None:
                break
            culprits = self._culprits(cs, [a.rule_id for a in p.applied], failure)
            for rid, why in culprits.items():
                self.log(f"patch: dropped {rid}: the patched program failed ({why})")
            cs = cs.without({rid: f"dropped: the patched program failed in this environment ({why})"
                             for rid, why in culprits.items()})
            p = self._written(cs, self.out_dir)
        return p

    def _culprits(self, cs: ChangeSet, applied: list[str], failure: str) -> dict[str, str]:
        """The rules that make the patched program fail, each with the failure line of its own run."""
        if len(applied) == 1:
            return {applied[0]: failure}
        found: dict[str, str] = {}
        for rid in applied:
            alone = self._written(cs.without({o: "validated alone" for o in applied if o != rid}),
                                  self.out_dir / "validate" / rid)
            if alone.applied and (why := self._validation_failure(alone)) is not None:
                found[rid] = why
        if found:
            return found
        for i, rid in enumerate(applied[1:], 2):  # only a combination fails: the first rule whose addition fails
            prefix = self._written(cs.without({o: "validated later" for o in applied[i:]}),
                                   self.out_dir / "validate" / f"first-{i}")
            if (why := self._validation_failure(prefix)) is not None:
                return {rid: why}
        return {applied[-1]: failure}

    def benchmarks(self) -> dict[str, BenchmarkResult] | None:
        """Stage ``benchmarks``: baseline vs patched, alternating repeats (cached); None for a replay.

        Raises RunFailed.
        """
        def bench() -> dict[str, BenchmarkResult] | None:
            if self._why_not("benchmark") or self._no_change():
                self.log(f"benchmarks: {self.not_observable['benchmarks']}")
                return None
            s, p = self.settings, self.patch()
            self.log(f"benchmarks: at least {s.bench_repeats} alternating repeats of {s.bench_steps} steps, baseline "
                     f"and patched (more within {s.bench_budget_s:g} s until the speedup's interval decides)")
            return self._isolated(self._benchmark(p, s.bench_budget_s))
        return self._memo("benchmarks", bench)

    def _benchmark(self, p: Patch, budget_s: float | None) -> dict[str, BenchmarkResult]:
        """Baseline vs the patched program of ``p``: :func:`benchmark` with the session's settings."""
        s = self.settings
        arms = {
            "baseline": {"config": self.training_config().values(), "script": self.workload.script},
            "patched": {"config": p.new_config, "script": Path(p.patched_file or self.workload.script),
                        "env": p.env, "unset_env": p.unset_env},
        }
        return benchmark(self.workload, self.runner, arms, steps=s.bench_steps, repeats=s.bench_repeats,
                         warmup=s.warmup_steps, budget_s=budget_s, log=self.log, use_cache=s.bench_cache)

    def _isolated(self, bench: dict[str, BenchmarkResult]) -> dict[str, BenchmarkResult]:
        """``bench``, or, when a patch of several rules measured slower, the benchmark of its rules that are not.

        Each applied rule is benchmarked alone against the original (the
        session's budget split between them; :attr:`results` ``rule_isolation``
        keeps every rule's interval).  The rules measured slower alone
        (:func:`~goblin_assets.report.verdict.measured_slower`) are the
        culprits: they are excluded with "not recommended: measured alone ..."
        and the rest is written, validated and measured again (a single rule
        left reuses its own measurement).  When every rule, or none, measured
        slower alone, the whole patch stays as measured (not recommended
        together).
        """
        p = self.patch()
        try:
            interval = bench_interval(bench)
        except (KeyError, ValueError):
            return bench
        if len(p.applied) < 2 or p.change_set is None or not measured_slower(interval):
            return bench
        applied = [a.rule_id for a in p.applied]
        cs = ChangeSet.model_validate(p.change_set)
        budget = self.settings.bench_budget_s / (len(applied) + 1) if self.settings.bench_budget_s else None
        self.log(f"benchmarks: the patch of {len(applied)} rules measured {interval.headline()}: "
                 "each rule measured alone to find the slower one")
        alone: dict[str, tuple[dict[str, BenchmarkResult], Any]] = {}
        for rid in applied:
            q = self._written(cs.without({o: "measured alone" for o in applied if o != rid}),
                              self.out_dir / "isolate" / rid)
            if not q.applied:
                continue
            try:
                res = self._benchmark(q, budget)
                alone[rid] = (res, bench_interval(res))
            except (RunFailed, KeyError, ValueError) as exc:
                self.log(f"benchmarks: {rid} alone could not be measured ({str(exc).splitlines()[0]})")
        self.results["rule_isolation"] = [
            {"rule_id": rid, "interval": iv.model_dump(), "slower": measured_slower(iv)}
            for rid, (_, iv) in alone.items()]
        culprits = {rid: f"not recommended: measured alone {iv.headline()}"
                    for rid, (_, iv) in alone.items() if measured_slower(iv)}
        kept = [rid for rid in applied if rid not in culprits]
        if not culprits or not kept:
            return bench
        for rid, why in culprits.items():
            self.log(f"benchmarks: dropped {rid}: {why}")
        q = self._validated(self._written(cs.without(culprits), self.out_dir))
        (self.out_dir / "patch.diff").write_text(q.diff, encoding="utf-8")
        self.results["patch"] = q
        if [a.rule_id for a in q.applied] == kept and len(kept) == 1 and kept[0] in alone:
            return alone[kept[0]][0]
        return self._benchmark(q, budget)

    def _no_change(self) -> str | None:
        """Why the patch needs no benchmark (it changes nothing in the program), or None.

        Two runs of the same program measure nothing but noise: a patch with no
        diff and no environment change is not benchmarked, and the reason is in
        :attr:`not_observable` (``benchmarks``).
        """
        p = self.patch()
        if p.diff.strip() or p.env or p.unset_env:
            return None
        why = ("the patch changes nothing in your program: "
               + (f"the rules that fired could not be written ({'; '.join(p.dropped)})" if p.dropped
                  else "no tuning rule asked for a change") + ", so there is nothing to benchmark")
        self.not_observable.setdefault("benchmarks", why)
        return why

    def patched_run(self) -> RunMetrics | None:
        """Stage ``patched_run``: the patched program profiled; None for a replay.  Raises RunFailed."""
        def run() -> RunMetrics | None:
            if self._why_not("benchmark") or self._no_change():
                return None
            return self._profile("patched", self.patch())
        return self._memo("patched_run", run)

    def audit_report(self) -> AuditReport | ReplayReport:
        """Stage ``audit_report``: the report, written to ``out_dir`` (report.md, and .png/.html when measured).

        A replay's report (:class:`ReplayReport`) states the recorded numbers
        with their label and no measured speedup.
        """
        def report() -> AuditReport | ReplayReport:
            before, p, cfg = self.profile_run(), self.patch(), self.effective_config()
            bench, after = self.benchmarks(), self.patched_run()
            v = self.verdict()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if not v.patch_offered:  # a patch measured slower (or empty) is never handed over as a fix
                (self.out_dir / "patch.diff").unlink(missing_ok=True)
            if bench is None or after is None:
                rep = replay_report(before, p, cfg, model=self.workload.model, calibration=self.calibration(),
                                    hazards=hazard_notes(self.rules(), self.kb_matches()),
                                    tensors=self.tensor_findings(), verdict=v,
                                    not_benchmarked=self.not_observable.get("benchmarks", ""),
                                    nonfinite_markdown=self.nonfinite().markdown if self.nonfinite() else None)
                (self.out_dir / "report.md").write_text(rep.markdown, encoding="utf-8")
                if not self.replay:  # a measured profile with nothing to benchmark: its page too
                    write_html(rep, self.out_dir / "report.html")
                self.results["report_path"] = self.out_dir / "report.md"
            else:
                rep = compare_runs(before, after, bench, p, cfg, model=self.workload.model,
                                   calibration=self.calibration(), nonfinite=self.nonfinite(),
                                   python=getattr(self.runner, "python", None), packages=self.packages_seen(),
                                   hazards=hazard_notes(self.rules(), self.kb_matches()),
                                   tensors=self.tensor_findings(), verdict=v)
                a, b = self.device_trace("profile"), self.device_trace("patched")
                if a is not None and b is not None:  # GPU runs: goblin trace's diff, original vs patched
                    from goblin_assets.trace.analysis import diff_markdown

                    rep.trace_diff_markdown = diff_markdown(a, b)
                self.results["report_path"] = write_report(rep, self.out_dir)
            return rep
        return self._memo("audit_report", report)

    def verdict(self) -> Verdict:
        """The audit's ranked verdict (report/verdict.py): a failed original, a non-finite run, a hazard, then the
        patch's measured effect (memoised).

        After the original failed (:attr:`results` ``failure``, set when a run of the original raised), only
        the failure is judged: nothing else ran.
        """
        def judge() -> Verdict:
            seeded = getattr(self.results.get("audit_report"), "verdict", None)
            if seeded is not None:  # a report computed elsewhere (a Dagster step) carries its verdict
                return seeded
            if self.results.get("failure"):
                diag, fired = self.results.get("failure_diagnosis"), self.results.get("failure_matches") or []
                return audit_verdict(failure=self.results["failure"],
                                     failure_class=diag.label if diag is not None else "",
                                     hazards=hazard_notes(self.rules(), fired) if fired else None,
                                     failure_kind=self.results.get("failure_kind", "failed"))
            before, bench = self.profile_run(), self.benchmarks()
            try:
                interval = bench_interval(bench) if bench else None
            except (KeyError, ValueError):  # an arm missing, or too few repeats for an interval
                interval = None
            loss_step = next((x.step for x in before.signals or [] if x.id == "loss_nonfinite"), None)
            after = self.results.get("patched_run")
            compiled = compile_stats(after.dynamo) if after is not None else None
            return audit_verdict(
                no_change_because=f"the patched run compiled: {compiled.headline()}" if compiled else "",
                nonfinite=self.nonfinite(), loss_nonfinite_step=loss_step,
                hazards=hazard_notes(self.rules(), self.kb_matches()),
                interval=interval, patch_changes=self._no_change() is None,
                why_no_patch=self.not_observable.get("benchmarks", "") if self._no_change() else "",
                not_measured=self.not_observable.get("benchmarks", ""))
        return self._memo("verdict", judge)

    def nonfinite(self) -> NonfiniteEvidence | None:
        """Where NaN/inf appeared (mined sketches, the parameters' check) and the likely precision cause; None if
        nothing was non-finite (memoised; measure/evidence.py)."""
        return self._memo("nonfinite", lambda: nonfinite_evidence(
            self.mined_patterns(), self.profile_run(), self.effective_config(), sketch_warmup=SKETCH_WARMUP))

    def calibration(self) -> Calibration:
        """The patch's predicted range and confidence scaled by its rules' record in :attr:`history` (memoised).

        Pure given the rows passed to :meth:`open` (the session never opens the
        warehouse); equal to the model's prediction without history.
        """
        return self._memo("calibration", lambda: calibrate(self.patch(), self.history))

    @property
    def report_path(self) -> Path | None:
        """The written ``report.md`` (None before :meth:`audit_report` ran)."""
        return self.results.get("report_path")

    def run_all(self) -> AuditSession:
        """Run every stage in order (what ``goblin audit`` does); returns ``self``."""
        for i, stage in enumerate(STAGES, 1):
            self.log(f"[{i}/{len(STAGES)}] {stage}")
            getattr(self, stage)()
        return self

    # ------------------------------------------------------------------ rows and JSON

    def rows(self, stage: str) -> dict[str, pd.DataFrame]:
        """The warehouse rows of one stage (runs it if needed), by table.

        ``benchmarks`` also holds the patched run's ``runs``, ``kernels`` and
        ``waste_budget`` rows (the asset that benchmarks profiles the patched
        run too); ``kb_index`` holds ``kb_embeddings`` rows only when the
        embeddings were encoded now (not read from the warehouse).
        """
        aid, name = self.audit_id, self.workload.name
        if stage == "training_config":
            return {"configs": F.configs_frame(self.training_config(), aid, name)}
        if stage == "profile_run":
            m = self.profile_run()
            return {"runs": F.runs_frame(m, f"{aid}-profile", "profile", aid),
                    "observed_settings": F.observed_frame(self.effective_config(), aid, name, f"{aid}-profile"),
                    "kernels": F.kernels_frame(m, f"{aid}-profile"), **self._trace_rows("profile"),
                    "compile_events": compile_events_frame(compile_stats(m.dynamo), f"{aid}-profile", name)}
        if stage == "waste_budget":
            return {"waste_budget": F.waste_frame(self.profile_run(), f"{aid}-profile", "profile")}
        if stage == "tensor_sketches":
            rows = {"sketches": self.tensor_sketches()}
            if "sketch_run" in self.results:  # the recording run, so sketches join their audit through runs
                rows["runs"] = F.runs_frame(self.results["sketch_run"], f"{aid}-sketch", "sketch", aid)
            return rows
        if stage == "mined_patterns":
            return {"patterns": self.mined_patterns()}
        if stage == "kb_index":
            idx = self.kb_index()
            return {} if idx.from_cache else {"kb_embeddings": embedding_frame(self.rules(), idx)}
        if stage == "kb_matches":
            return {"kb_matches": F.kb_frame(self.kb_matches(), aid, name)}
        if stage in ("benchmarks", "patched_run"):
            bench, after = self.benchmarks(), self.patched_run()
            if bench is None or after is None:
                return {}
            pid = f"{aid}-patched"
            return {"benchmarks": F.bench_frame(bench, aid, name), "runs": F.runs_frame(after, pid, "patched", aid),
                    "waste_budget": F.waste_frame(after, pid, "patched"), "kernels": F.kernels_frame(after, pid),
                    **self._trace_rows("patched")}
        if stage == "audit_report":
            rep = self.audit_report()
            return {"audits": F.audit_frame(aid, name, f"{aid}-profile",
                                            f"{aid}-patched" if self.patched_run() else None, rep, self.patch(),
                                            self.report_path)}
        if stage == "patch":
            return {}
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")

    def device_trace(self, label: str):
        """The trace analyses (:class:`goblin_assets.trace.analysis.TraceReport`) of the ``profile`` or
        ``patched`` run when it ran on a GPU, else None (cached)."""
        from goblin_assets.trace.analysis import device_trace_report

        if label not in self.device_traces:
            m = self.profile_run() if label == "profile" else self.patched_run()
            self.device_traces[label] = device_trace_report(m, f"{self.audit_id}-{label}") if m is not None else None
        return self.device_traces[label]

    def _trace_rows(self, label: str) -> dict[str, pd.DataFrame]:
        from goblin_assets.trace.analysis import trace_frames

        rep = self.device_trace(label)
        return trace_frames(rep, audit_id=self.audit_id, with_run=False) if rep is not None else {}

    def frames(self) -> dict[str, pd.DataFrame]:
        """All warehouse rows of the audit, by table (what ``goblin audit`` writes in one transaction)."""
        # several stages write small frames of one table (runs, kernels, waste_budget): F.join_frames joins them
        return F.join_frames(self.rows(stage) for stage in (*STAGES[:9], "audit_report"))

    def to_json(self) -> dict[str, Any]:
        """The ``goblin audit --json`` object (keys are a contract: extend, never rename).

        For a replay, ``patched`` is None, ``benchmark`` is empty,
        ``measured_speedup`` is None and ``not_observable`` says why.
        ``measured_speedup_interval`` is the measured speedup's interval
        (:class:`~goblin_assets.measure.benchmark.SpeedupInterval`: ``point``,
        ``low``, ``high``, ``level``, ``pairs``, ``paired``, ``method``,
        ``verdict``, which reads "no significant change" when the interval
        contains 1.0; None for a replay); ``predicted_speedup`` is the
        prediction the report shows (calibrated by the rules' record when
        :attr:`history` has one), ``predicted_speedup_model`` the waste-budget
        model's own, ``calibration`` how one became the other.
        ``tensor_findings`` lists the graded tensor findings
        (:meth:`TensorFinding.to_json`: finding, severity, scope, site,
        role, step, train_step, text, numbers, sql); empty for a replay.
        """
        rep, p, after, bench = self.audit_report(), self.patch(), self.patched_run(), self.benchmarks() or {}
        return {
            "verdict": self.verdict().model_dump(),
            "audit_id": self.audit_id,
            "workload": self.workload.name,
            "config": json.loads(self.effective_config().model_dump_json(exclude={"raw_source"})),
            "baseline": json.loads(self.profile_run().model_dump_json()),
            "patched": json.loads(after.model_dump_json()) if after is not None else None,
            "benchmark": {k: json.loads(v.model_dump_json(exclude={"metrics"})) for k, v in bench.items()},
            "measured_speedup": rep.measured_speedup,
            "measured_speedup_interval": (json.loads(rep.measured_interval.model_dump_json())
                                          if getattr(rep, "measured_interval", None) is not None else None),
            "predicted_speedup": [rep.predicted_low, rep.predicted_high],
            "predicted_speedup_model": [p.expected_speedup_low, p.expected_speedup_high],
            "calibration": json.loads(self.calibration().model_dump_json()),
            "confidence": rep.confidence,
            "rules": [a.rule_id for a in p.applied],
            "fired_rules": [m.rule_id for m in self.kb_matches() if m.fired],
            "hazards": [h.model_dump() for h in hazard_notes(self.rules(), self.kb_matches())],
            "dropped_rules": p.dropped + ([f"{a.rule_id}: not recommended: {self.verdict().not_recommended}"
                                           for a in p.applied] if self.verdict().not_recommended else []),
            "diff": redact(p.diff),
            "report_path": str(self.report_path),
            "provenance": self.profile_run().provenance.kind,
            "host": {"source": self.host.source, "cores": self.cores(),
                     "cpu_bf16_matmul": self.host.cpu_bf16_matmul, "devices": self.host.devices,
                     "python": getattr(self.runner, "python", None), "packages": self.packages_seen()},
            "patch_validation": self.results.get("patch_validation", []),
            "rule_isolation": self.results.get("rule_isolation", []),
            "nonfinite": self.nonfinite().to_json() if self.nonfinite() is not None else None,
            "not_observable": dict(self.not_observable),
            "tensor_findings": self.tensor_findings().to_json(),
        }

    def failure_rules(self) -> list[str]:
        """Ids of the KB rules that fired on the original's failure (``results["failure_matches"]``); [] when the
        original did not fail or nothing matched."""
        return [m.rule_id for m in self.results.get("failure_matches") or [] if m.fired]

    def failure_rows(self) -> dict[str, pd.DataFrame]:
        """The warehouse rows of an audit whose original failed as written (:attr:`results` ``failure`` set):
        one ``run_failures`` row (class, diagnosis, matched rules, the out-of-memory record and its validated
        fix) and one ``audits`` row with its verdict (warehouse/frames.py ``failure_frames``).

        Raises KeyError when the original did not fail.
        """
        return F.failure_frames(self.audit_id, self.workload.name, self.workload.unit, self.results["failure_stage"],
                                self.results["failure"], self.results.get("failure_diagnosis"), self.failure_rules(),
                                self.verdict(), self.report_path, self.results.get("failure_kind") == "hung",
                                self.results.get("oom_state"), self.results.get("oom_fix"))

    def failure_json(self) -> dict[str, Any]:
        """The ``goblin audit --json`` object of an audit whose original failed as written (the failure is its
        finding; :attr:`results` ``failure`` is set): ``verdict``, ``audit_id``, ``workload``, ``failure`` (the
        one-line reason), ``report_path``, ``failure_diagnosis`` (:meth:`FailureDiagnosis.to_json`, None when
        the failure was not diagnosed), ``fired_rules`` (the rules that match the failure), ``not_observable``
        and, added later, ``oom_fix``: the out-of-memory fix validated under the same memory limit
        (``lever``, ``rule``, ``change``, ``global_batch_before``/``_after``, ``ok``, ``failure``,
        ``samples_per_sec``, ``predicted_peak_bytes``, ``diff``; :func:`goblin_assets.audit.fit.oom_fix`), None
        when there is none.

        Raises KeyError when the original did not fail.
        """
        diag = self.results.get("failure_diagnosis")
        return {"verdict": self.verdict().model_dump(), "audit_id": self.audit_id, "workload": self.workload.name,
                "failure": self.results["failure"], "report_path": str(self.report_path),
                "failure_diagnosis": diag.to_json() if diag is not None else None,
                "fired_rules": self.failure_rules(),
                "not_observable": dict(self.not_observable),
                "oom_fix": {k: fix.get(k) for k in OOM_FIX_KEYS} if (fix := self.results.get("oom_fix")) else None}

    def write_html(self, path: Path) -> Path:
        """The report as one self-contained HTML file at ``path``; returns it."""
        return write_html(self.audit_report(), path)

    # ------------------------------------------------------------------ what-if

    def what_if(self, overrides: dict[str, Any] | None) -> AuditSession:
        """The session of this workload with ``overrides`` written into a copy of its file.

        Returns ``self`` when ``overrides`` is empty or changes nothing; the
        same child session for the same overrides.  The child shares the
        runner, settings, host and rules, and is audited as a workload of its
        own (same benchmark cache).

        Raises
        ------
        WhatIfError
            Overrides on a what-if session, an unknown field, or a value the
            ConfigDict does not accept.
        PatchError
            The value cannot be written into the user's file.
        """
        if self.overrides and overrides:
            raise WhatIfError("overrides: a what-if session takes no further overrides")
        if not overrides:
            return self
        cfg = self.training_config()
        unknown = sorted(set(overrides) - set(CONFIG_FIELDS))
        if unknown:
            raise WhatIfError(f"overrides: unknown field(s) {', '.join(unknown)}; "
                              f"the fields are {', '.join(CONFIG_FIELDS)}")
        try:
            ConfigDict.model_validate({**cfg.values(), **overrides})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise WhatIfError(f"overrides.{first['loc'][0]}: {first['msg']}") from None
        changes = {k: v for k, v in overrides.items() if cfg.values()[k] != v}
        if not changes:
            return self
        key = json.dumps(changes, sort_keys=True, default=str)
        if key not in self.variants:
            src = self.workload.config_file
            original = src.read_text(encoding="utf-8")
            edited = edit_source(cfg, changes, src, self.packages())
            out = self.out_dir / f"whatif-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            copy = out / "source"  # not out/workload: the patch stage writes its patched copy there
            if copy.exists():
                shutil.rmtree(copy)
            shutil.copytree(self.workload.root, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
            rel = src.resolve().relative_to(self.workload.root.resolve()).as_posix()
            (copy / rel).write_text(edited, encoding="utf-8")
            self.variants[key] = AuditSession(
                workload=self.workload.model_copy(update={"root": copy}), settings=self.settings, runner=self.runner,
                host=self.host, audit_id=f"{self.audit_id}-whatif-{hashlib.sha256(key.encode()).hexdigest()[:6]}",
                out_dir=out, log=self.log, kb=self.kb, cached_embeddings=self.cached_embeddings, history=self.history,
                overrides=changes,
                whatif_diff=unified_diff(original, edited, rel), results=(
                    {"kb_index": self.results["kb_index"]} if "kb_index" in self.results else {}))
        return self.variants[key]
