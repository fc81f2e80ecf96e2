"""One dynamic partition per workload folder under ``workloads/``, kept in sync by a sensor."""

from pathlib import Path

import dagster as dg

from goblin_assets import workloads_root
from goblin_assets.runners.workload import list_workloads

workloads_partitions = dg.DynamicPartitionsDefinition(name="workloads")


def workload_names() -> list[str]:
    """Partition keys: each workload folder's path under the workloads root, e.g. ``digits_mlp``, ``synthetic/fp32_on_mi300x``.

    Runnable folders (``workload.yaml``) and replay folders (``cached_metrics.json``,
    the synthetic corpus) alike; see :func:`goblin_assets.runners.workload.list_workloads`.
    """
    root = workloads_root()
    return [p.relative_to(root).as_posix() for p in list_workloads(root)]


def sync_partitions(context: dg.SensorEvaluationContext, partitions: dg.DynamicPartitionsDefinition,
                    on_disk: list[str]) -> dg.SensorResult:
    """Add a partition for each key in ``on_disk`` the instance lacks, delete those no longer on disk."""
    have, known = set(on_disk), set(context.instance.get_dynamic_partitions(partitions.name))
    requests = []
    if have - known:
        requests.append(partitions.build_add_request(sorted(have - known)))
    if known - have:
        requests.append(partitions.build_delete_request(sorted(known - have)))
    return dg.SensorResult(dynamic_partitions_requests=requests)


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def workload_folders_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Add a partition for each new workload folder, delete those whose folder is gone."""
    return sync_partitions(context, workloads_partitions, workload_names())


def files_under(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    """Partition keys of the files under ``root`` whose names end with one of ``suffixes``: each file's path
    relative to ``root`` (``rank0.json.gz``, ``run3/oom.pickle``), sorted; [] when ``root`` is not a folder."""
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name.endswith(suffixes))
