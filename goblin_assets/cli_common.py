"""What the ``goblin`` commands share: the consoles, the settings options, and opening an audit session."""
from __future__ import annotations

import argparse
import sys

from rich.console import Console

#: Progress and errors go to stderr; results to stdout.
console = Console(stderr=True, soft_wrap=True)
#: stdout: long lines (paths) are never folded; piped, tables get 120 columns instead of rich's 80
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)


def add_settings_options(p: argparse.ArgumentParser, bench: bool = True) -> None:
    """The options that override :class:`~goblin_assets.settings.AuditSettings` (defaults: ``GOBLIN_RUNNER_*``)."""
    from goblin_assets.settings import AuditSettings

    d = AuditSettings.model_fields
    p.add_argument("--steps", dest="profiled_steps", type=int, default=None,
                   help=f"profiled steps (default {d['profiled_steps'].default}, after "
                        f"{d['warmup_steps'].default} warm-up steps)")
    if bench:
        p.add_argument("--bench-steps", dest="bench_steps", type=int, default=None,
                       help=f"timed steps per benchmark repeat (default {d['bench_steps'].default})")
        p.add_argument("--repeats", dest="bench_repeats", type=int, default=None,
                       help=f"alternating benchmark repeats per arm, at least (default {d['bench_repeats'].default})")
        p.add_argument("--bench-budget", dest="bench_budget_s", type=float, default=None, metavar="SECONDS",
                       help="more alternating pairs are added until the speedup's interval decides or this "
                            f"wall-clock budget is spent (default {d['bench_budget_s'].default:g} s)")
        p.add_argument("--no-cache", dest="bench_cache", action="store_const", const=False, default=None,
                       help="measure the benchmark afresh instead of replaying cached results, and replace the "
                            "cache entries (default: replay; GOBLIN_RUNNER_BENCH_CACHE=0 for the same)")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=None,
                   help=f"wall-clock limit per child run, seconds (default {d['timeout_s'].default:g})")
    if bench:
        p.add_argument("--kb", default=None, metavar="RULES.yaml",
                       help="a knowledge base of your own (default: the packaged rules)")
    p.add_argument("--python", dest="python", default=None, metavar="PATH",
                   help="the interpreter your script runs in (your environment); default: the workload's "
                        "python:, else goblin's own")


def settings_from_args(args):
    """The audit settings: ``GOBLIN_RUNNER_*`` from the environment, then the command's own options."""
    from goblin_assets.settings import AuditSettings

    return AuditSettings.from_env(**{f: getattr(args, f, None) for f in AuditSettings.model_fields})


def cached_embeddings(kb):
    """The warehouse's ``kb_embeddings`` rows of this KB version (None when the warehouse cannot be read now)."""
    from goblin_assets.errors import WarehouseError
    from goblin_assets.kb.encoder import MODEL_NAME
    from goblin_assets.warehouse.db import query

    try:
        return query("SELECT * FROM kb_embeddings WHERE kb_sha256 = ? AND model = ?", params=[kb.sha256, MODEL_NAME])
    except WarehouseError:  # e.g. another process holds the write lock: encode instead
        return None


def audit_history():
    """The warehouse's measured ``audits`` rows (:data:`~goblin_assets.measure.calibration.HISTORY_SQL`), for
    the rules' measured/predicted record; None when the warehouse cannot be read now (the prediction is
    then the model's alone)."""
    from goblin_assets.errors import WarehouseError
    from goblin_assets.measure.calibration import HISTORY_SQL
    from goblin_assets.warehouse.db import query

    try:
        return query(HISTORY_SQL)
    except WarehouseError:  # e.g. another process holds the write lock
        return None


def open_session(args, with_kb: bool = True, workload=None, log=None, **kw):
    """The audit session of ``args.path`` (or of ``workload`` when given) with the command's settings and
    progress on stderr (or to ``log``, a callable taking one line).

    ``with_kb``: load the rules, the warehouse's cached rule embeddings and its audit history (the rules'
    measured record) up front (an audit needs all three).
    """
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.kb.rules import load_kb
    from goblin_assets.runners.workload import load_workload

    wl = workload or load_workload(args.path)
    kb = load_kb(getattr(args, "kb", None)) if with_kb else None
    return AuditSession.open(wl, settings=settings_from_args(args), kb=kb,
                             cached_embeddings=cached_embeddings(kb) if kb else None,
                             history=audit_history() if kb else None,
                             log=log or (lambda s: console.print(f"[dim]{s}[/dim]", highlight=False)), **kw)


def complete_audit(s, frames: dict | None = None, mlflow: str | None = None) -> tuple[bool, str | None]:
    """Run every stage of session ``s``, write its rows (and ``frames``) to the warehouse, log it to MLflow.

    What ``goblin audit`` and the ``audit`` tool of ``goblin mcp`` do.  Returns (completed, MLflow run id):
    completed is False when the original failed as written (:meth:`AuditSession.failure_json`; its
    ``run_failures`` and ``audits`` rows are written then, and the MLflow run holds the failure: its
    diagnosis, report and verdict), the run
    id is None without a tracking URI (``mlflow`` or ``$GOBLIN_MLFLOW_TRACKING_URI``).

    Raises the stages' GoblinErrors (a run of the patch failing included) and
    :class:`~goblin_assets.tracking.mlflow_run.TrackingError`.
    """
    from goblin_assets.errors import RunFailed
    from goblin_assets.tracking.mlflow_run import log_audit
    from goblin_assets.warehouse.db import write

    try:
        s.run_all()
    except RunFailed:
        if not s.results.get("failure"):  # a run of the patch failing is the audit's own error
            raise
        counts = write(s.failure_rows())
        console.print(f"[dim]warehouse: {sum(counts.values())} rows in {len(counts)} tables[/dim]")
        return False, log_audit(s, mlflow)  # the original failed as written: the audit's finding, with its report
    counts = write({**s.frames(), **(frames or {})})
    console.print(f"[dim]warehouse: {sum(counts.values())} rows in {len(counts)} tables[/dim]")
    return True, log_audit(s, mlflow)
