"""Re-audit automation: a new ROCm image version requests exactly the dependent audit assets."""
from __future__ import annotations

import dagster as dg

from goblin_assets.definitions import defs
from goblin_assets.defs.partitions import workloads_partitions

DEPENDENT = {"profile_run", "waste_budget", "tensor_sketches", "mined_patterns", "kb_matches", "patch",
             "benchmark_baseline", "benchmark_patched", "audit_report"}
UNRELATED = {"workload_source", "training_config", "kb_rules", "kb_index"}
#: A runnable workload and a replay scenario of the synthetic corpus: both partitions depend on rocm_image, so a new
#: tag requests both (a replay re-audit runs nothing: seconds).
PARTITIONS = ["digits_mlp", "synthetic/fp32_on_mi300x"]


def _observe(instance, version: str) -> None:
    instance.report_runless_asset_event(
        dg.AssetObservation(asset_key="rocm_image", tags={"dagster/data_version": version}))


def _materialize_everything(instance, partitions: list[str]) -> None:
    """Record every asset as materialized (runless events): the state after finished audits."""
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        if key.to_user_string() == "rocm_image":
            continue
        for part in partitions if graph.get(key).partitions_def is not None else [None]:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=part))


def _requested(result) -> dict[str, set]:
    return {k.to_user_string(): set(result.get_requested_partitions(k))
            for k in defs.resolve_asset_graph().get_all_asset_keys()
            if result.get_num_requested(k)}


def test_new_image_tag_requests_exactly_the_dependent_assets():
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, PARTITIONS)
    _observe(instance, "rocm/pytorch:6.4@sha256:aaa")
    _materialize_everything(instance, PARTITIONS)
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    # settle: nothing changed since the audit finished
    settled = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert _requested(settled) == {}
    # same tag observed again: still nothing
    _observe(instance, "rocm/pytorch:6.4@sha256:aaa")
    same = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=settled.cursor)
    assert _requested(same) == {}
    # new tag: every dependent asset of each partition, nothing else
    _observe(instance, "rocm/pytorch:7.0@sha256:bbb")
    changed = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=same.cursor)
    req = _requested(changed)
    assert set(req) == DEPENDENT
    assert all(parts == set(PARTITIONS) for parts in req.values())
    assert not (set(req) & UNRELATED)


def test_a_fresh_instance_builds_the_knowledge_base_and_nothing_else():
    """The first tick of a fresh ``make ui`` builds kb_rules and kb_index (the audit_workload job's upstream), once;
    with the knowledge base present nothing is requested."""
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, PARTITIONS)
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert _requested(first) == {"kb_rules": {None}, "kb_index": {None}}
    # the run has not finished (or failed): not requested again on the next tick
    assert _requested(dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)) == {}
    built = dg.DagsterInstance.ephemeral()
    _materialize_everything(built, PARTITIONS)
    assert _requested(dg.evaluate_automation_conditions(defs=defs, instance=built)) == {}
