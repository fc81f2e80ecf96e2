"""Audit settings: how workloads run (steps, repeats, limits, runner kind), read from the environment in one place.

The CLI, the agent, the Dagster runner resource and the demo all start from
:meth:`AuditSettings.from_env` and override single fields from their own
options; nothing else reads ``GOBLIN_RUNNER_*`` or writes a default step
count.

Variables (unset ones keep the defaults below): ``GOBLIN_RUNNER_KIND``
(``local``, ``rocprof``, ``replay``), ``GOBLIN_RUNNER_DEVICE`` (``auto``,
``cpu``, ``cuda``), ``GOBLIN_RUNNER_WARMUP_STEPS``,
``GOBLIN_RUNNER_PROFILED_STEPS``, ``GOBLIN_RUNNER_BENCH_STEPS``,
``GOBLIN_RUNNER_BENCH_REPEATS``, ``GOBLIN_RUNNER_BENCH_BUDGET_S``, ``GOBLIN_RUNNER_BENCH_CACHE``
(``1``/``true`` or ``0``/``false``), ``GOBLIN_RUNNER_SKETCH_STEPS``,
``GOBLIN_RUNNER_TIMEOUT_S``, ``GOBLIN_RUNNER_MEM_CAP_GB``, ``GOBLIN_RUNNER_PYTHON``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from goblin_assets.errors import GoblinError

#: Prefix of every settings variable: ``GOBLIN_RUNNER_<FIELD>``.
ENV_PREFIX = "GOBLIN_RUNNER_"

RunnerKind = Literal["local", "rocprof", "replay"]


class SettingsError(GoblinError):
    """A settings variable or option has a value the field does not take (names both)."""


class AuditSettings(BaseModel):
    """Step budgets and limits of every child run of an audit.

    ``kind``: the runner (``local``: the installed torch on cpu/cuda/ROCm;
    ``rocprof``: the same run under rocprofv3 with amd-smi polling;
    ``replay``: a recorded ``cached_metrics.json``).  ``device``: ``auto``,
    ``cpu`` or ``cuda`` (ROCm builds use the cuda API).  Steps are optimizer
    steps: ``warmup_steps`` unmeasured before each run, ``profiled_steps``
    under torch.profiler, ``bench_steps`` timed per benchmark repeat,
    ``bench_repeats`` alternating repeats per arm (the minimum: more pairs
    are added while the speedup's interval is undecided and
    ``bench_budget_s``, wall-clock seconds of the whole benchmark stage, is
    not spent; measure/benchmark.py; a patch of several rules measured
    slower gets one more such budget, split between measuring each rule alone
    and the patch without the slower ones: audit/session.py), ``bench_cache`` whether a benchmark
    the cache can answer is replayed from it (False: measured afresh and the
    cache entries replaced; ``goblin audit --no-cache``), ``sketch_steps``
    recorded by the matmul tap.  ``timeout_s``: wall-clock limit per child run
    (seconds); ``mem_cap_gb``: the child's address-space cap (GB; None for
    none).  ``python``: the interpreter the user's script runs in (the user's
    own environment); None: the workload's ``python:``, else Goblin's own.
    """

    kind: RunnerKind = "local"
    device: str = "auto"
    warmup_steps: int = Field(2, ge=0)
    profiled_steps: int = Field(10, ge=1)
    bench_steps: int = Field(20, ge=1)
    bench_repeats: int = Field(3, ge=1)
    bench_budget_s: float = Field(120.0, gt=0)
    bench_cache: bool = True
    sketch_steps: int = Field(3, ge=1)
    timeout_s: float = Field(600.0, gt=0)
    mem_cap_gb: float | None = Field(16.0, gt=0)
    python: str | None = None

    @classmethod
    def env_var(cls, field: str) -> str:
        """The environment variable of ``field``: ``GOBLIN_RUNNER_<FIELD>``."""
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AuditSettings:
        """Settings from ``GOBLIN_RUNNER_*`` (default ``os.environ``), then ``overrides`` (None values ignored).

        Raises
        ------
        SettingsError
            A variable or override the field does not accept (names it).
        """
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(cls.env_var(name))
            if raw is not None and raw.strip() != "":
                data[name] = None if name == "mem_cap_gb" and raw.strip().lower() in ("none", "0") else raw.strip()
        try:
            base = cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0])
            raise SettingsError(f"{cls.env_var(name)}={data.get(name)!r}: {first['msg']}") from None
        return base.with_overrides(**overrides)

    def with_overrides(self, **overrides: Any) -> AuditSettings:
        """A copy with the non-None ``overrides`` applied and validated.

        Raises
        ------
        SettingsError
            An unknown field, or a value the field does not accept.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - set(type(self).model_fields))
        if unknown:
            raise SettingsError(f"unknown setting(s) {', '.join(unknown)} "
                                f"(settings: {', '.join(type(self).model_fields)})")
        try:
            return type(self).model_validate({**self.model_dump(), **given})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SettingsError(f"setting {first['loc'][0]}={given.get(first['loc'][0])!r}: {first['msg']}") from None

    def runner_settings(self, python: str | None = None) -> dict[str, Any]:
        """The constructor settings every runner takes: ``device``, ``timeout_s``, ``mem_cap_gb``, ``python``.

        ``python`` (the workload's interpreter) is used when the settings name none.
        """
        return {"device": self.device, "timeout_s": self.timeout_s, "mem_cap_gb": self.mem_cap_gb,
                "python": self.python or python}


WarehouseBackend = Literal["file", "ducklake"]


class WarehouseSettings(BaseModel):
    """Where the warehouse lives, read from the environment here and nowhere else.

    ``GOBLIN_WAREHOUSE``: ``file`` (default: the embedded DuckDB file ``$GOBLIN_HOME/warehouse.duckdb``,
    one writing process at a time) or ``ducklake`` (a DuckLake catalog: metadata in PostgreSQL,
    ``GOBLIN_DUCKLAKE_CATALOG``, a libpq DSN such as ``host=db port=5432 user=goblin dbname=ducklake``;
    data as Parquet files under ``GOBLIN_DUCKLAKE_DATA``, a path or an object-store URL such as
    ``s3://bucket/goblin/``).  Writers in many processes and hosts commit to a DuckLake concurrently.
    """

    backend: WarehouseBackend = "file"
    catalog: str = ""
    data: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WarehouseSettings:
        """The settings of ``GOBLIN_WAREHOUSE``, ``GOBLIN_DUCKLAKE_CATALOG``, ``GOBLIN_DUCKLAKE_DATA``.

        Raises
        ------
        SettingsError
            An unknown backend, or ``ducklake`` without its catalog or data path.
        """
        env = os.environ if environ is None else environ
        backend = (env.get("GOBLIN_WAREHOUSE") or "file").strip().lower()
        catalog = (env.get("GOBLIN_DUCKLAKE_CATALOG") or "").strip()
        data = (env.get("GOBLIN_DUCKLAKE_DATA") or "").strip()
        if backend not in ("file", "ducklake"):
            raise SettingsError(f"GOBLIN_WAREHOUSE={backend!r}: must be 'file' or 'ducklake'")
        if backend == "ducklake" and not (catalog and data):
            raise SettingsError("GOBLIN_WAREHOUSE=ducklake needs GOBLIN_DUCKLAKE_CATALOG (a PostgreSQL DSN) "
                                "and GOBLIN_DUCKLAKE_DATA (where the Parquet files go)")
        return cls(backend=backend, catalog=catalog, data=data)


ExecutorKind = Literal["multiprocess", "celery"]


class ExecutorSettings(BaseModel):
    """Where a run's steps execute, read from the environment here and nowhere else.

    ``GOBLIN_EXECUTOR``: ``multiprocess`` (default: steps forked beside the run) or ``celery``
    (dagster-celery workers on any host; deploy/README.md).  ``GOBLIN_CELERY_QUEUE``: the queue a
    run's steps go to when its run config names none (default ``dagster``, the queue every
    dagster-celery worker listens on).
    """

    kind: ExecutorKind = "multiprocess"
    queue: str = "dagster"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutorSettings:
        """The settings of ``GOBLIN_EXECUTOR`` and ``GOBLIN_CELERY_QUEUE``.

        Raises
        ------
        SettingsError
            ``GOBLIN_EXECUTOR`` is neither ``multiprocess`` nor ``celery``.
        """
        env = os.environ if environ is None else environ
        kind = (env.get("GOBLIN_EXECUTOR") or "multiprocess").strip().lower()
        if kind not in ("multiprocess", "celery"):
            raise SettingsError(f"GOBLIN_EXECUTOR={kind!r}: must be 'multiprocess' (default) or 'celery'")
        return cls(kind=kind, queue=(env.get("GOBLIN_CELERY_QUEUE") or "").strip() or "dagster")
