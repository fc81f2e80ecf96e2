"""Dagster resources: the runner (where workloads run) and the warehouse writer (the DuckDB file).

The runner resource is typed: :class:`RunnerResource` is abstract, with one
implementation per runner kind (:class:`LocalRunnerResource`,
:class:`RocprofRunnerResource`, :class:`ReplayRunnerResource`), each
configured from ``GOBLIN_RUNNER_*`` variables with ``dg.EnvVar`` (the
variables and defaults are :class:`goblin_assets.settings.AuditSettings`'s).

:class:`WarehouseResource` is the one way an asset or check touches the
warehouse: it writes frames in one transaction (and returns the metadata the
table checks read back), runs queries, and builds SQL models, on
dagster-duckdb's :class:`DuckDBResource` for the embedded file, or on a DuckLake
catalog (``backend="ducklake"``: :func:`goblin_assets.warehouse.db.ducklake_connection`).
On the file, every asset that writes it is in the pool :data:`POOL` (limit 1: DuckDB
allows one writing process per file); on a DuckLake there is no pool: writers commit
concurrently, each write a snapshot.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
from dagster_duckdb import DuckDBResource

from goblin_assets import warehouse_path
from goblin_assets.runners.base import Runner
from goblin_assets.runners.factory import make_runner, runner_for
from goblin_assets.runners.workload import Workload
from goblin_assets.settings import AuditSettings, SettingsError, WarehouseSettings
from goblin_assets.warehouse.db import ducklake_connection, ensure_tables, run_query, write_frames
from goblin_assets.warehouse.tables import TABLES

#: The name of the pool of the single-file warehouse's writers (the instance's dagster.yaml limits it to 1).
FILE_POOL = "warehouse_writer"


def warehouse_pool(settings: WarehouseSettings | None = None) -> str | None:
    """The pool of every asset and check that opens the warehouse: :data:`FILE_POOL` on the DuckDB file
    (one process at a time), none on a DuckLake (concurrent writers are what it is for).

    Bad warehouse variables keep the file's pool here; :func:`warehouse_resource` reports them.
    """
    if settings is None:
        try:
            settings = WarehouseSettings.from_env()
        except SettingsError:
            return FILE_POOL
    return FILE_POOL if settings.backend == "file" else None


#: The pool of this process's warehouse backend (``GOBLIN_WAREHOUSE``, read when the definitions load).
POOL = warehouse_pool()


class RunnerResource(dg.ConfigurableResource, ABC):
    """Where and how workloads run: the step budgets and limits of :class:`AuditSettings`, and the runner.

    ``device``: ``auto``, ``cpu`` or ``cuda`` (ROCm builds use the cuda API);
    ``image_tag``: the ROCm container image the run belongs to; steps,
    limits and the job's interpreter (``python``) as
    :class:`goblin_assets.settings.AuditSettings` (seconds, GB).
    """

    device: str = "auto"
    image_tag: str = "none"
    warmup_steps: int = 2
    profiled_steps: int = 10
    bench_steps: int = 20
    bench_repeats: int = 3
    bench_budget_s: float = 120.0
    bench_cache: bool = True
    sketch_steps: int = 3
    timeout_s: float = 600.0
    mem_cap_gb: float | None = 16.0
    python: str | None = None

    @property
    @abstractmethod
    def kind(self) -> str:
        """The runner kind: ``local``, ``rocprof`` or ``replay``."""

    def settings(self) -> AuditSettings:
        """These settings as the audit session's :class:`AuditSettings`.  Raises SettingsError."""
        fields = {k: getattr(self, k) for k in AuditSettings.model_fields if k != "kind"}
        return AuditSettings(kind=self.kind).with_overrides(**fields)

    def runner_options(self) -> dict[str, Any]:
        """Constructor settings of this kind's runner beyond device, timeout and memory cap."""
        return {}

    def get_runner(self, workload: Workload | None = None) -> Runner:
        """The runner of this kind; for a replay workload (no runnable script) always the replay runner.

        Raises RunnerError (a setting the runner does not take) or ToolMissingError (rocprofv3 missing).
        """
        python = workload.interpreter if workload is not None else None
        r = make_runner(self.kind, **self.settings().runner_settings(python=python), **self.runner_options())
        return runner_for(workload, r) if workload is not None else r


class LocalRunnerResource(RunnerResource):
    """The installed torch on cpu, cuda or ROCm, in a child process with a step budget."""

    @property
    def kind(self) -> str:
        return "local"


class RocprofRunnerResource(RunnerResource):
    """The local child wrapped in rocprofv3 (kernel + HIP API trace), with amd-smi polled every ``smi_interval_s``."""

    smi_interval_s: float = 1.0

    @property
    def kind(self) -> str:
        return "rocprof"

    def runner_options(self) -> dict[str, Any]:
        return {"smi_interval_s": self.smi_interval_s}


class ReplayRunnerResource(RunnerResource):
    """Recorded RunMetrics (``cached_metrics.json``), labelled replayed: nothing runs."""

    @property
    def kind(self) -> str:
        return "replay"


RUNNER_RESOURCES: dict[str, type[RunnerResource]] = {
    "local": LocalRunnerResource, "rocprof": RocprofRunnerResource, "replay": ReplayRunnerResource}


def runner_from_env() -> RunnerResource:
    """The runner resource of ``GOBLIN_RUNNER_KIND`` (default local), each set ``GOBLIN_RUNNER_*`` as a ``dg.EnvVar``.

    Unset variables keep :class:`AuditSettings`' defaults; the values are
    validated once here (a bad value is a SettingsError naming the variable).
    The image tag comes from ``rocm_image`` (see runners/image.py).
    """
    from goblin_assets.runners.image import read_rocm_image

    settings = AuditSettings.from_env()  # validates every variable that is set
    kw: dict[str, Any] = {}
    for name, info in RunnerResource.model_fields.items():
        var = AuditSettings.env_var(name)
        if name in AuditSettings.model_fields and os.environ.get(var, "").strip():
            kw[name] = (dg.EnvVar.int(var) if info.annotation in (int, "int") else
                        dg.EnvVar(var) if info.annotation in (str, "str") else getattr(settings, name))
    return RUNNER_RESOURCES[settings.kind](image_tag=read_rocm_image().version, **kw)


class WarehouseResource(dg.ConfigurableResource):
    """The DuckDB warehouse as assets see it: write frames in one transaction, query, build SQL models.

    ``backend``: ``file`` (default) or ``ducklake``.  On the file, ``duckdb`` is
    dagster-duckdb's resource on the warehouse file (its connection retries while
    another process holds the write lock).  On a DuckLake, ``catalog`` (a
    PostgreSQL DSN) and ``data`` (where the Parquet files go) name it and
    ``duckdb`` is not used.
    """

    duckdb: DuckDBResource
    backend: str = "file"
    catalog: str = ""
    data: str = ""

    @contextmanager
    def connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """An open connection with every table created."""
        if self.backend == "ducklake":
            with ducklake_connection(self.catalog, self.data) as con:
                yield con
            return
        with self.duckdb.get_connection() as con:
            ensure_tables(con)
            yield con

    def write(self, frames: dict[str, pd.DataFrame]) -> dict[str, dg.MetadataValue]:
        """Validate and write ``frames`` in one transaction; the metadata of what was written.

        Metadata: ``dagster/row_count``, ``rows_by_table``, ``written``
        (``table -> {"key": its id column, "ids": [...], "rows": n}``: what the
        table checks read back), and the first table's ``dagster/column_schema``
        and ``dagster/table_name``.  An empty ``frames`` writes nothing.

        Raises
        ------
        WarehouseError
            A frame failed its schema (nothing written) or the insert failed (rolled back).
        """
        if not frames:
            return {"dagster/row_count": dg.MetadataValue.int(0), "rows_by_table": dg.MetadataValue.json({})}
        with self.connection() as con:
            counts = write_frames(con, frames)
        first = next(iter(frames))
        key = {t: TABLES[t][0][0] for t in frames}
        written = {t: {"key": key[t], "ids": sorted(df[key[t]].astype(str).unique().tolist()), "rows": counts[t]}
                   for t, df in frames.items()}
        return {
            "dagster/row_count": dg.MetadataValue.int(sum(counts.values())),
            "rows_by_table": dg.MetadataValue.json(counts),
            "written": dg.MetadataValue.json(written),
            "dagster/column_schema": dg.MetadataValue.table_schema(
                dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t, _ in TABLES[first]])),
            "dagster/table_name": dg.MetadataValue.text(f"warehouse.{first}"),
        }

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """Run ``sql`` (with ``?`` parameters) and return the result.  Raises WarehouseError."""
        with self.connection() as con:
            return run_query(con, sql, params)


def warehouse_resource(settings: WarehouseSettings | None = None) -> WarehouseResource:
    """The warehouse writer of ``settings`` (default from the environment, :class:`WarehouseSettings`):
    ``$GOBLIN_HOME/warehouse.duckdb``, or the DuckLake catalog.  Raises SettingsError on bad variables."""
    ws = settings or WarehouseSettings.from_env()
    if ws.backend == "ducklake":
        return WarehouseResource(duckdb=DuckDBResource(database=":memory:"), backend="ducklake",
                                 catalog=ws.catalog, data=ws.data)
    return WarehouseResource(duckdb=DuckDBResource(database=str(warehouse_path())))
