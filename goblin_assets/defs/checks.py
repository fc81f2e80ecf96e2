"""Asset checks: pandera schemas on table-shaped assets, and the waste-budget sum."""

import warnings

import dagster as dg
import pandas as pd
import pandera.errors

from goblin_assets.contracts import RunMetrics
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.warehouse.tables import schema

#: The waste buckets must add up to the measured step time within this (issue 4).
SUM_TOLERANCE = 0.05


def _pandera_check(table: str, df: pd.DataFrame) -> dg.AssetCheckResult:
    try:
        schema(table).validate(df, lazy=True)
    except pandera.errors.SchemaErrors as exc:
        cases = exc.failure_cases.head(10).astype(str).to_dict("records")
        return dg.AssetCheckResult(passed=False, metadata={"failure_cases": dg.MetadataValue.json(cases)})
    return dg.AssetCheckResult(passed=True, metadata={"rows": len(df)})


warnings.filterwarnings("ignore", message=".*partitions_def on an AssetCheckSpec.*")


@dg.asset_check(asset="tensor_sketches", blocking=True, partitions_def=workloads_partitions,
                description="Sketch rows match the warehouse's pandera schema (tidy: site, role, stat, idx, value).")
def sketches_schema(tensor_sketches: pd.DataFrame) -> dg.AssetCheckResult:
    return _pandera_check("sketches", tensor_sketches)


@dg.asset_check(asset="mined_patterns", blocking=True, partitions_def=workloads_partitions,
                description="Pattern rows match the warehouse's pandera schema.")
def patterns_schema(mined_patterns: pd.DataFrame) -> dg.AssetCheckResult:
    return _pandera_check("patterns", mined_patterns)


@dg.asset_check(asset="waste_budget", blocking=True, partitions_def=workloads_partitions,
                additional_ins={"profile_run": dg.AssetIn()},
                description="The waste-budget buckets add up to the measured step time within 5%.")
def waste_budget_sums_to_step_time(waste_budget: dict, profile_run: RunMetrics) -> dg.AssetCheckResult:
    total = sum(b["seconds"] for b in waste_budget.values())
    step = profile_run.step_time_s or 0.0
    err = abs(total - step) / step if step else float("inf")
    return dg.AssetCheckResult(passed=err <= SUM_TOLERANCE, metadata={
        "buckets_sum_s": total, "step_time_s": step, "relative_error": err,
        "statuses": dg.MetadataValue.json({k: v["status"] for k, v in waste_budget.items()}),
    })


AUDIT_CHECKS = [sketches_schema, patterns_schema, waste_budget_sums_to_step_time]


@dg.asset_check(asset="kb_rules", blocking=True,
                description="Every synthetic-corpus scenario, replayed, fires the rules it must and none it must not.")
def kb_corpus_recall(kb_rules) -> dg.AssetCheckResult:
    from goblin_assets.audit.corpus import corpus_recall

    res = corpus_recall(kb_rules)
    bad = {k: v for k, v in res["per_scenario"].items() if v["missing"] or v["forbidden"]}
    return dg.AssetCheckResult(passed=res["recall"] == 1.0 and not bad, metadata={
        "recall": res["recall"], "scenarios": res["scenarios"], "expected_rules": res["expected"],
        "failures": dg.MetadataValue.json(bad)})


AUDIT_CHECKS.append(kb_corpus_recall)
