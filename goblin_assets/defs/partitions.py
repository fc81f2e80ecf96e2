"""One dynamic partition per workload folder, kept in sync by a sensor."""

import dagster as dg

from goblin_assets.runners.workload import list_workloads

workloads_partitions = dg.DynamicPartitionsDefinition(name="workloads")


def workload_names() -> list[str]:
    """Folder names under ``workloads/`` that hold a ``workload.yaml``."""
    return [p.name for p in list_workloads()]


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
