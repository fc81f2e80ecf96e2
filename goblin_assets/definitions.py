"""The single place where Dagster things are wired: ``goblin_assets.definitions:defs``."""
from __future__ import annotations

import dagster as dg

from goblin_assets.defs.agent import AGENT_ASSETS
from goblin_assets.defs.audit import AUDIT_ASSETS, audit_workload_job
from goblin_assets.defs.automation import automation_sensor, observe_rocm_image_daily, observe_rocm_image_job
from goblin_assets.defs.fit import FIT_ASSETS
from goblin_assets.defs.mining import MINING_ASSETS
from goblin_assets.defs.opscope import OPSCOPE_ASSETS
from goblin_assets.defs.partitions import workload_folders_sensor
from goblin_assets.defs.sql import SQL_ASSETS
from goblin_assets.defs.memory import MEMORY_ASSETS, snapshot_files_sensor
from goblin_assets.defs.trace import TRACE_ASSETS, trace_files_sensor, trace_jobs_sensor
from goblin_assets.defs.resources import runner_from_env, warehouse_resource

#: Modules the forkserver imports once per run, so that each forked step process starts with them.
#: Measured on 2 cores (PYTHONPROFILEIMPORTTIME and the run's event log, digits_mlp audit run with
#: 1-step budgets: 89 s -> 74 s; a step's process starts in ~0.4 s instead of 1.2-1.7 s):
#:
#: - this module: Dagster and the definitions, ~5 s;
#: - torch, ~3 s in every step that profiles, sketches, mines or benchmarks.  Importing torch
#:   starts no thread pool and initialises no CUDA/HIP context, so forking after it is safe;
#: - the instance's SQLite storages (SQLAlchemy, alembic) and universal-pathlib, which every step
#:   imports when it opens the instance: ~1.1 s of each step's start.
#:
#: Python's forkserver skips a name that fails to import, so a Dagster version without one of these
#: private modules only loses the saving (tests/test_defs.py checks that they all import).
FORKSERVER_PRELOAD = [
    "goblin_assets.definitions",
    "torch",
    "dagster._core.storage.base_storage",
    "dagster._core.storage.event_log.sqlite",
    "dagster._core.storage.runs.sqlite",
    "dagster._core.storage.schedules.sqlite",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.instance.factory",
    "dagster._core.secrets.env_file",
    "upath.core",
    "upath.implementations.local",
]

#: Each step runs in its own process (so a crashing workload cannot take the run down), forked
#: from the preloaded forkserver.
EXECUTOR = dg.multiprocess_executor.configured(
    {"start_method": {"forkserver": {"preload_modules": FORKSERVER_PRELOAD}}})


def celery_config(queue: str) -> dict:
    """dagster-celery executor config sending every step of a run to the Celery queue ``queue``.

    The broker and result backend come from ``GOBLIN_CELERY_BROKER`` / ``GOBLIN_CELERY_BACKEND``;
    ``config_source.task_default_queue`` is the queue each step is published to (an op tag
    ``dagster-celery/queue`` would still win; the graph sets none)."""
    return {"broker": {"env": "GOBLIN_CELERY_BROKER"}, "backend": {"env": "GOBLIN_CELERY_BACKEND"},
            "include": ["goblin_assets.definitions"], "config_source": {"task_default_queue": queue}}


def executor_from_env() -> dg.ExecutorDefinition:
    """The project's executor (:data:`EXECUTOR`), or with ``GOBLIN_EXECUTOR=celery`` dagster-celery's.

    With Celery each step is a task that a ``dagster-celery worker`` (any host) runs, over the broker
    ``GOBLIN_CELERY_BROKER`` with results in ``GOBLIN_CELERY_BACKEND`` (deploy/README.md).  A run's
    steps all go to one queue, the run config's ``execution.config.queue`` (default ``GOBLIN_CELERY_QUEUE``,
    else ``dagster``): a GPU host's worker listening on its own queue (``-q gpu-a``) then runs the
    profile, the sketches and both benchmark arms of that audit, so they are measured on one device.

    Raises
    ------
    SettingsError
        ``GOBLIN_EXECUTOR`` is neither ``multiprocess`` nor ``celery`` (:class:`ExecutorSettings`).
    """
    from goblin_assets.settings import ExecutorSettings

    settings = ExecutorSettings.from_env()
    if settings.kind == "celery":
        from dagster_celery import celery_executor

        return celery_executor.configured(
            lambda cfg: celery_config(cfg["queue"]), name="celery",
            config_schema={"queue": dg.Field(str, default_value=settings.queue, is_required=False,
                                             description="Celery queue every step of the run is sent to "
                                                         "(one per GPU host: its worker's -q)")})
    return EXECUTOR


defs = dg.Definitions(
    assets=[*AUDIT_ASSETS, *AGENT_ASSETS, *OPSCOPE_ASSETS, *MINING_ASSETS, *SQL_ASSETS, *TRACE_ASSETS,
            *MEMORY_ASSETS, *FIT_ASSETS],
    sensors=[workload_folders_sensor, automation_sensor, trace_files_sensor, trace_jobs_sensor,
             snapshot_files_sensor],
    schedules=[observe_rocm_image_daily],
    jobs=[audit_workload_job, observe_rocm_image_job],
    resources={"runner": runner_from_env(), "warehouse": warehouse_resource()},
    executor=executor_from_env(),
)
