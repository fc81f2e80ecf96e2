"""Dagster resources: the runner (the "MI300X runner") and the DuckDB warehouse."""

from typing import Literal

import dagster as dg
from dagster_duckdb import DuckDBResource

from goblin_assets import warehouse_path
from goblin_assets.runners.base import Runner, make_runner, runner_for
from goblin_assets.runners.workload import Workload


class RunnerResource(dg.ConfigurableResource):
    """Where and how workloads run.

    ``kind``: ``local`` (the installed torch on cpu/cuda/ROCm), ``rocprof`` (the
    same run wrapped in rocprofv3 with amd-smi polling) or ``replay`` (a recorded
    ``cached_metrics.json``, labelled replayed).  ``device``:
    ``auto``, ``cpu`` or ``cuda`` (ROCm builds use the cuda API).  ``image_tag``:
    the ROCm container image the run belongs to.  Steps and limits apply to every
    child run: ``warmup_steps`` (default 2), ``profiled_steps`` (default 10),
    ``bench_steps`` and ``bench_repeats`` for benchmarks, ``timeout_s`` (seconds),
    ``mem_cap_gb`` (address-space cap, GB).
    """

    kind: Literal["local", "rocprof", "replay"] = "local"
    device: str = "auto"
    image_tag: str = "none"
    warmup_steps: int = 2
    profiled_steps: int = 10
    bench_steps: int = 20
    bench_repeats: int = 3
    sketch_steps: int = 3
    timeout_s: float = 600.0
    mem_cap_gb: float = 16.0

    def get_runner(self, workload: Workload | None = None) -> Runner:
        """The runner of ``kind``; for a replay workload (no runnable script) always the replay runner."""
        r = make_runner(self.kind, device=self.device, timeout_s=self.timeout_s, mem_cap_gb=self.mem_cap_gb)
        return runner_for(workload, r) if workload is not None else r


def warehouse_resource() -> DuckDBResource:
    """dagster-duckdb's resource on ``$GOBLIN_HOME/warehouse.duckdb``."""
    return DuckDBResource(database=str(warehouse_path()))


def runner_from_env() -> RunnerResource:
    """The runner resource with per-machine settings from ``GOBLIN_RUNNER_*`` variables.

    ``GOBLIN_RUNNER_KIND``, ``_DEVICE``, ``_PROFILED_STEPS``, ``_BENCH_STEPS``,
    ``_BENCH_REPEATS``, ``_SKETCH_STEPS``, ``_WARMUP_STEPS``, ``_TIMEOUT_S``; unset
    ones keep the defaults.  The image tag comes from ``rocm_image`` (see
    runners/image.py).
    """
    import os

    from goblin_assets.runners.image import read_rocm_image

    fields = RunnerResource.model_fields
    kw = {}
    for name in ("kind", "device", "profiled_steps", "bench_steps", "bench_repeats", "sketch_steps",
                 "warmup_steps", "timeout_s", "mem_cap_gb"):
        raw = os.environ.get(f"GOBLIN_RUNNER_{name.upper()}")
        if raw is not None:
            ann = fields[name].annotation
            kw[name] = ann(raw) if ann in (int, float) else raw
    return RunnerResource(image_tag=read_rocm_image().version, **kw)
