"""One dynamic partition per workload folder under ``workloads/``, kept in sync by a sensor."""

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


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def workload_folders_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Add a partition for each new workload folder, delete those whose folder is gone."""
    on_disk = set(workload_names())
    known = set(context.instance.get_dynamic_partitions(workloads_partitions.name))
    requests = []
    if on_disk - known:
        requests.append(workloads_partitions.build_add_request(sorted(on_disk - known)))
    if known - on_disk:
        requests.append(workloads_partitions.build_delete_request(sorted(known - on_disk)))
    return dg.SensorResult(dynamic_partitions_requests=requests)
