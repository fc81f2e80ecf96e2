"""One audit as one MLflow run: the config as parameters, the measured numbers as metrics, the report as artifacts.

``goblin audit --mlflow URI`` (or ``$GOBLIN_MLFLOW_TRACKING_URI``), the audit
tool of ``goblin mcp`` and the Dagster ``audit_report`` step call
:func:`log_audit` once the audit's report is written.  With
``$GOBLIN_MLFLOW_PARENT_RUN_ID`` the run is nested under that run (the
training run it audited), in that run's experiment; else it goes to the
experiment ``$GOBLIN_MLFLOW_EXPERIMENT`` (default ``goblin``; created with its
artifacts beside a SQLite store, :func:`artifact_root`).

What is logged (MLflow tracking API: ``log_params``, ``set_tags``,
``log_metrics``, ``log_artifact``; https://mlflow.org/docs/latest/ml/tracking/):

- parameters: every ConfigDict field (``undetermined`` where the file states
  none), and tags ``goblin.provenance.<field>`` = where each came from
  (literal, default, variable, env, inferred, unset), plus the audit id,
  workload, verdict, provenance of the numbers and the applied rules;
- metrics (only those the audit measured or replayed; nothing is invented):
  ``throughput_original_per_s`` / ``throughput_patched_per_s`` (benchmark
  medians), ``measured_speedup`` and its interval ``measured_speedup_low`` /
  ``_high`` (level ``measured_speedup_level``), ``predicted_speedup_low`` /
  ``_high``, ``waste_<bucket>_ms`` and ``waste_<bucket>_share`` per bucket of
  the profiled original (and ``patched_waste_<bucket>_ms``), ``step_time_ms``,
  ``mfu_pct``, ``mem_peak_gb`` (each of the original; ``patched_*`` of the patched run);
- artifacts: report.md, report.html, report.png and patch.diff from the
  audit's folder (those that exist), and the profiler traces of the original
  and patched runs under ``traces/original/`` and ``traces/patched/``; text files are uploaded redacted;
- tags of every audit: ``goblin.audit_id``, ``goblin.workload``, ``goblin.verdict`` (the headline),
  ``goblin.verdict_status`` (report/verdict.py's status: ``failed``, ``hung``, ``improved`` ...) and
  ``goblin.healthy`` (``true``/``false``).

An audit whose original program failed as written (out of memory, a crash, a
hang; the failure is the audit's finding, nothing after it ran) is logged
too, by the same :func:`log_audit` (``goblin audit``, the ``audit`` tool of
``goblin mcp`` and the Dagster ``profile_run`` step): parameters and
provenance tags of the parsed config (nothing observed it run), tags
``goblin.failure_class`` (measure/failure.py's class, ``unknown`` when
nothing named it), ``goblin.failure_kind`` (``failed`` or ``hung``),
``goblin.failure`` (the one-line reason) and ``goblin.rules`` (the rules that
match the failure); metrics ``failure_exit_status`` and
``failure_steps_completed`` where known; artifacts report.md (the diagnosis)
and ``result.json`` (the ``--json`` object, :meth:`AuditSession.failure_json`).
The MLflow run itself ends ``FINISHED``: the audit finished, its verdict says the program failed.

Strings are redacted (goblin_assets/redact.py) before they leave the machine.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goblin_assets.errors import GoblinError
from goblin_assets.measure.waste import shares
from goblin_assets.redact import redact

if TYPE_CHECKING:
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.contracts import RunMetrics

#: The environment variables this module reads.
URI_ENV, PARENT_ENV, EXPERIMENT_ENV = ("GOBLIN_MLFLOW_TRACKING_URI", "GOBLIN_MLFLOW_PARENT_RUN_ID",
                                       "GOBLIN_MLFLOW_EXPERIMENT")
#: The artifacts of an audit's folder, logged when present.
REPORT_FILES: tuple[str, ...] = ("report.md", "report.html", "report.png", "patch.diff")
#: MLflow's limit on a parameter value (characters; MLflow 2.x+ ``MAX_PARAM_VAL_LENGTH``).
MAX_PARAM_CHARS = 6000
#: Artifacts read as text and redacted before upload (``patch.diff`` on disk is the exact, unredacted diff).
TEXT_SUFFIXES = frozenset({".md", ".html", ".diff", ".json"})


class TrackingError(GoblinError):
    """The audit could not be logged to the experiment tracker (names the URI and the reason)."""


def tracking_uri(explicit: str | None = None) -> str | None:
    """The tracking URI to log to: ``explicit`` (``--mlflow``), else ``$GOBLIN_MLFLOW_TRACKING_URI``, else None."""
    return explicit or os.environ.get(URI_ENV) or None


def artifact_root(uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a local SQLite store (``<db folder>/mlruns``), else the
    tracking server's default (None).  MLflow's own default for a SQLite store is ``./mlruns`` of the
    current directory, which would write into whatever folder the audit was started from."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlruns").as_uri()


def failed_original(s: AuditSession) -> bool:
    """True when the session's original program failed as written (:attr:`AuditSession.results` ``failure``)."""
    return bool(s.results.get("failure"))


def audit_params(s: AuditSession) -> tuple[dict[str, str], dict[str, str]]:
    """(parameters, provenance tags) of the config as it ran (:meth:`AuditSession.effective_config`: observed
    values over the parsed ones, as ``--json``'s ``config``; the parsed config when the original failed as
    written): every field, ``undetermined`` when unset."""
    from goblin_assets.contracts import CONFIG_FIELDS

    # a failed original was never observed running: its config is the parsed one (effective_config would run it)
    cfg = s.training_config() if failed_original(s) else s.effective_config()
    params = {f: "undetermined" if v is None else redact(str(v))[:MAX_PARAM_CHARS] for f, v in cfg.values().items()}
    tags = {f"goblin.provenance.{f}": cfg.provenance[f].kind if f in cfg.provenance else "unset"
            for f in CONFIG_FIELDS}
    return params, tags


def _run_metrics(m: RunMetrics | None, prefix: str) -> dict[str, float]:
    if m is None:
        return {}
    out = {f"{prefix}step_time_ms": m.step_time_s * 1e3 if m.step_time_s is not None else None,
           f"{prefix}mfu_pct": m.mfu_pct, f"{prefix}mem_peak_gb": m.mem_peak_gb}
    sh = shares(m.waste_budget)
    for k, b in m.waste_budget.items():
        out[f"{prefix}waste_{k}_ms"] = b.seconds * 1e3 if b.seconds is not None else None
        out[f"{prefix}waste_{k}_share"] = sh.get(k)
    return {k: float(v) for k, v in out.items() if v is not None}


def audit_metrics(s: AuditSession) -> dict[str, float]:
    """The audit's numbers as MLflow metrics (names in the module docstring); absent where the audit has none."""
    rep = s.audit_report()
    out: dict[str, float | None] = {"predicted_speedup_low": rep.predicted_low,
                                    "predicted_speedup_high": rep.predicted_high,
                                    "measured_speedup": rep.measured_speedup}
    iv = getattr(rep, "measured_interval", None)
    if iv is not None:
        out.update(measured_speedup_low=iv.low, measured_speedup_high=iv.high, measured_speedup_level=iv.level)
    out["throughput_original_per_s"] = getattr(rep, "baseline_throughput", None)
    out["throughput_patched_per_s"] = getattr(rep, "patched_throughput", None)
    metrics = {k: float(v) for k, v in out.items() if v is not None}
    return {**metrics, **_run_metrics(s.profile_run(), ""), **_run_metrics(s.patched_run(), "patched_")}


def audit_artifacts(s: AuditSession) -> list[tuple[Path, str | None]]:
    """(file, artifact folder) pairs: the report files of the audit's folder and the runs' profiler traces."""
    files: list[tuple[Path, str | None]] = [(s.out_dir / n, None) for n in REPORT_FILES if (s.out_dir / n).is_file()]
    for label, m in (("original", s.profile_run()), ("patched", s.patched_run())):
        if m is not None and m.trace_path and Path(m.trace_path).is_file():
            files.append((Path(m.trace_path), f"traces/{label}"))
    return files


def audit_tags(s: AuditSession) -> dict[str, str]:
    """The run's ``goblin.*`` tags and run name (names in the module docstring), unredacted: the verdict, and
    either the failure (class, kind, reason, matching rules) or the numbers' provenance and the applied rules."""
    v = s.verdict()
    tags = {"goblin.audit_id": s.audit_id, "goblin.workload": s.workload.name, "goblin.verdict": v.headline,
            "goblin.verdict_status": v.status, "goblin.healthy": str(v.healthy).lower(),
            "mlflow.runName": f"goblin audit {s.workload.name}"}
    if failed_original(s):
        diag = s.results.get("failure_diagnosis")
        fired = s.failure_rules()
        return tags | {"goblin.failure_class": diag.failure_class if diag is not None else "unknown",
                       "goblin.failure_kind": s.results.get("failure_kind", "failed"),
                       "goblin.failure": s.results["failure"][:MAX_PARAM_CHARS],
                       "goblin.rules": ",".join(fired) or "none"}
    return tags | {"goblin.numbers": s.profile_run().provenance.kind,
                   "goblin.rules": ",".join(a.rule_id for a in s.patch().applied) or "none"}


def failure_metrics(s: AuditSession) -> dict[str, float]:
    """A failed original's numbers: ``failure_exit_status`` and ``failure_steps_completed`` where the
    diagnosis knows them (measure/failure.py); empty otherwise.  Nothing else was measured."""
    diag = s.results.get("failure_diagnosis")
    out = {"failure_exit_status": getattr(diag, "exit_status", None),
           "failure_steps_completed": getattr(diag, "last_step", None)}
    return {k: float(v) for k, v in out.items() if v is not None}


def failure_artifacts(s: AuditSession, tmp: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact folder) pairs of a failed original: its report.md (the diagnosis) when written, and
    ``result.json`` (:meth:`AuditSession.failure_json`, written into ``tmp``)."""
    result = tmp / "result.json"
    result.write_text(json.dumps(s.failure_json(), indent=2, default=str), encoding="utf-8")
    report = s.report_path
    return [*([(Path(report), None)] if report is not None and Path(report).is_file() else []), (result, None)]


def _redacted_copy(path: Path, tmp: Path) -> Path:
    """``path`` itself when binary (report.png, a gzipped trace), else a redacted copy of its text in ``tmp``."""
    if path.suffix not in TEXT_SUFFIXES:
        return path
    out = tmp / path.name
    out.write_text(redact(path.read_text(encoding="utf-8", errors="replace")), encoding="utf-8")
    return out


def log_audit(s: AuditSession, uri: str | None = None, parent_run_id: str | None = None) -> str | None:
    """Log the session's finished audit as one MLflow run; returns its run id (None when no URI is set).

    A finished audit is one whose every stage ran, or whose original program failed as written (the failure
    logged as the module docstring says); either way nothing is run here.

    ``uri``: the tracking URI (default :func:`tracking_uri`); a local folder
    or ``sqlite:///file.db`` needs no server.  ``parent_run_id`` (default
    ``$GOBLIN_MLFLOW_PARENT_RUN_ID``): the run to nest under.

    Raises
    ------
    TrackingError
        mlflow is not installed (``pip install 'goblin-assets[tracking]'``),
        or the store refused the run (the parent run does not exist, the URI
        cannot be written ...).
    """
    uri = tracking_uri(uri)
    if uri is None:
        return None
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise TrackingError(f"MLflow tracking URI {uri} is set but mlflow is not installed "
                            "(pip install 'goblin-assets[tracking]')") from None
    parent = parent_run_id or os.environ.get(PARENT_ENV) or None
    params, tags = audit_params(s)
    tags |= audit_tags(s)
    failed = failed_original(s)
    metrics = failure_metrics(s) if failed else audit_metrics(s)
    try:
        client = MlflowClient(tracking_uri=uri)
        if parent:
            exp_id = client.get_run(parent).info.experiment_id
            tags["mlflow.parentRunId"] = parent
        else:
            name = os.environ.get(EXPERIMENT_ENV) or "goblin"
            exp = client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(
                name, artifact_location=artifact_root(uri))
        run = client.create_run(exp_id, tags={k: redact(str(t)) for k, t in tags.items()})
        rid = run.info.run_id
        from mlflow.entities import Metric, Param

        now_ms = int(time.time() * 1e3)
        client.log_batch(rid, params=[Param(k, p) for k, p in params.items()],
                         metrics=[Metric(k, val, now_ms, 0) for k, val in metrics.items()])
        with tempfile.TemporaryDirectory(prefix="goblin_mlflow_") as tmp:
            (Path(tmp) / "redacted").mkdir()
            for path, folder in failure_artifacts(s, Path(tmp)) if failed else audit_artifacts(s):
                client.log_artifact(rid, str(_redacted_copy(path, Path(tmp) / "redacted")), artifact_path=folder)
        client.set_terminated(rid, "FINISHED")
    except (MlflowException, OSError) as exc:
        raise TrackingError(f"MLflow {redact(uri)}: cannot log the audit: {str(exc).splitlines()[0]}") from None
    s.log(f"mlflow: logged run {rid} to {redact(uri)}" + (f" (nested under {parent})" if parent else ""))
    return rid
