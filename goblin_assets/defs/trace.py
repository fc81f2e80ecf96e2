"""Recorded traces as an asset: one dynamic partition per trace file under ``$GOBLIN_TRACES``.

Drop a Kineto trace (``.json``/``.json.gz``) or rocprofv3 output (JSON or
``*_kernel_trace.csv``) into the folder; the sensor adds its partition, and
materializing ``recorded_trace`` runs :func:`~goblin_assets.trace.analysis.analyze_trace`
(the same driver as ``goblin trace``) and writes its tables through the
warehouse resource.  Nothing here analyses anything itself.
"""
import os
from pathlib import Path

import dagster as dg

from goblin_assets import REPO_ROOT
from goblin_assets.defs.partitions import files_under, sync_partitions
from goblin_assets.defs.resources import POOL, WarehouseResource

traces_partitions = dg.DynamicPartitionsDefinition(name="traces")

#: File names the sensor treats as traces.
TRACE_SUFFIXES = (".json", ".json.gz", ".csv")


def traces_root() -> Path:
    """The folder of recorded traces: ``$GOBLIN_TRACES``, default ``traces/`` in the checkout."""
    return Path(os.environ.get("GOBLIN_TRACES", REPO_ROOT / "traces")).resolve()


def trace_names(root: Path | None = None) -> list[str]:
    """Partition keys: each trace file's path under the traces root (``rank0.json.gz``, ``mi300x/run1.json``)."""
    return files_under(root or traces_root(), TRACE_SUFFIXES)


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def trace_files_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Add a partition for each new trace file, delete those whose file is gone."""
    return sync_partitions(context, traces_partitions, trace_names())


@dg.asset(group_name="traces", partitions_def=traces_partitions, pool=POOL, kinds={"duckdb"})
def recorded_trace(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Every analysis of one recorded trace (``goblin trace``), written to the warehouse's ``trace_*`` tables,
    plus the trace's RunMetrics rows (``runs``, ``waste_budget``, ``kernels``, provenance ``replayed``)."""
    from goblin_assets.ids import make_audit_id
    from goblin_assets.trace.analysis import analyze_trace, trace_frames
    from goblin_assets.trace.events import trace_stem

    path = traces_root() / context.partition_key
    try:
        token = context.run.run_id
    except dg.DagsterError:
        token = None
    rep = analyze_trace(path, trace_id=make_audit_id(f"trace-{trace_stem(path)}", token),
                        progress=context.log.info)
    meta = warehouse.write(trace_frames(rep))
    worst = [f"{f.severity}: {f.message}" for f in rep.findings if f.severity != "ok"]
    tb = rep.tables["temporal"]
    tb = tb[tb["timing"] == "recorded"] if len(tb) else tb
    return dg.MaterializeResult(metadata={
        **meta, "trace_id": rep.trace_id, "device": rep.events.device_name or "not recorded",
        "source_format": rep.events.source_format, "elapsed_s": dg.MetadataValue.float(rep.elapsed_s),
        "findings": dg.MetadataValue.md("\n".join(f"- {w}" for w in worst) or "none above ok"),
        "temporal": dg.MetadataValue.md(tb.to_markdown(index=False) if not tb.empty else "no device events"),
    })


jobs_partitions = dg.DynamicPartitionsDefinition(name="trace_jobs")


def job_names(root: Path | None = None) -> list[str]:
    """Partition keys of ``recorded_job``: each folder under the traces root holding two Kineto traces or more
    (one per rank of a job), as its path under the root (``.`` for the root itself)."""
    root = root or traces_root()
    if not root.is_dir():
        return []
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    return sorted(d.relative_to(root).as_posix() for d in folders
                  if sum(1 for q in d.iterdir() if q.is_file() and q.name.endswith((".json", ".json.gz"))) >= 2)


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def trace_jobs_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Add a partition for each folder of rank traces, delete those that are gone."""
    return sync_partitions(context, jobs_partitions, job_names())


@dg.asset(group_name="traces", partitions_def=jobs_partitions, pool=POOL, kinds={"duckdb"})
def recorded_job(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """The ranks of one job (``goblin trace DIR``): ``trace_ranks``, ``trace_collectives`` and the straggler
    finding in ``trace_findings``."""
    from goblin_assets.trace.ranks import analyze_ranks, ranks_frames

    folder = traces_root() / context.partition_key
    res = analyze_ranks([folder])
    meta = warehouse.write(ranks_frames(res, [folder]))
    return dg.MaterializeResult(metadata={**meta, "findings": dg.MetadataValue.md(
        "\n".join(f"- {f.severity}: {f.message}" for f in res["findings"]))})


TRACE_ASSETS = [recorded_trace, recorded_job]
