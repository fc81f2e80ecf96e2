"""Memory snapshots as an asset: one dynamic partition per snapshot file under ``$GOBLIN_SNAPSHOTS``.

Drop a pickle written by ``torch.cuda.memory._dump_snapshot`` (``*.pickle`` or
``*.pkl``) into the folder; the sensor adds its partition, and materializing
``memory_snapshot`` runs :func:`~goblin_assets.trace.memory_snapshot.analyze_snapshot`
(the same driver as ``goblin memory``: restricted unpickler, nothing in the file
is run) and writes its ``memory_snapshot*`` tables through the warehouse resource.
"""
import os
from pathlib import Path

import dagster as dg

from goblin_assets import REPO_ROOT
from goblin_assets.defs.partitions import files_under, sync_partitions
from goblin_assets.defs.resources import POOL, WarehouseResource

snapshots_partitions = dg.DynamicPartitionsDefinition(name="memory_snapshots")

#: File names the sensor treats as memory snapshots.
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


def snapshots_root() -> Path:
    """The folder of memory snapshots: ``$GOBLIN_SNAPSHOTS``, default ``snapshots/`` in the checkout."""
    return Path(os.environ.get("GOBLIN_SNAPSHOTS", REPO_ROOT / "snapshots")).resolve()


def snapshot_names(root: Path | None = None) -> list[str]:
    """Partition keys: each snapshot file's path under the snapshots root (``oom.pickle``, ``run3/rank0.pickle``)."""
    return files_under(root or snapshots_root(), SNAPSHOT_SUFFIXES)


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def snapshot_files_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Add a partition for each new snapshot file, delete those whose file is gone."""
    return sync_partitions(context, snapshots_partitions, snapshot_names())


@dg.asset(group_name="traces", partitions_def=snapshots_partitions, pool=POOL, kinds={"duckdb"})
def memory_snapshot(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """One memory snapshot analysed (``goblin memory``): totals, live memory by frame and category, segments with
    their largest free block, the timeline around the OOM; written to the ``memory_snapshot*`` tables."""
    from goblin_assets.trace.memory_render import snapshot_frames
    from goblin_assets.trace.memory_snapshot import analyze_snapshot, mib

    path = snapshots_root() / context.partition_key
    rep = analyze_snapshot(path, snapshot_id=context.partition_key)
    meta = warehouse.write(snapshot_frames(rep))
    t = rep.totals
    return dg.MaterializeResult(metadata={
        **meta, "snapshot_id": rep.snapshot_id, "reserved": mib(t["reserved_bytes"]),
        "allocated": mib(t["allocated_bytes"]), "largest_free_block": mib(t["largest_free_block_bytes"]),
        "oom_events": dg.MetadataValue.int(t["oom_events"]),
        "diagnosis": dg.MetadataValue.md("\n".join(f"- {d}" for d in rep.diagnosis) or "nothing to report"),
        "origin": rep.notes.get("origin", "recorded"),
    })


MEMORY_ASSETS = [memory_snapshot]
