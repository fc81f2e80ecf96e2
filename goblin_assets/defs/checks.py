"""Asset checks, each evaluated inside the step of the asset it judges: pandera schemas on every
table-shaped asset's warehouse rows, the waste-budget sum, and the KB's verdicts on the synthetic corpus.

In-asset checks (``check_specs`` on the asset, results returned with its
value) cost no step of their own: an audit of one partition is 11 steps, not
20, which is what a step costs on a process-per-step or Celery executor (a
fresh interpreter each).  A failing blocking check fails its asset's step
after the value and the materialization are recorded, so the stages
downstream of *that partition* do not run (Dagster 1.13, execute_step.py).

A scenario of the corpus (``synthetic/<name>``) is judged in its partition
(its recording on ``workload_source``, its expected rules on ``kb_matches``),
so a failed recording or a KB miss in one scenario never stops another
scenario or a runnable workload.  The corpus summary on ``kb_rules`` (upstream
of every partition) is not blocking: it names the failing scenarios and never
raises.
"""

import warnings
from pathlib import Path

import dagster as dg
import pandas as pd
import pandera.errors

from goblin_assets.contracts import RuleMatch, RunMetrics
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.defs.resources import WarehouseResource
from goblin_assets.warehouse.tables import TABLES, schema

#: The waste buckets must add up to the measured step time within this (issue 4).
SUM_TOLERANCE = 0.05

#: (asset, warehouse table it writes) -> what the rows are; one blocking pandera check each.
TABLE_ASSETS: dict[tuple[str, str], str] = {
    ("training_config", "configs"): "the parsed config, one row per field with its value, status and provenance",
    ("profile_run", "kernels"): "the profiled run's top kernels (name, percent of time)",
    ("waste_budget", "waste_budget"): "the profiled run's waste budget, one row per bucket",
    ("tensor_sketches", "sketches"): "sketch rows (tidy: site, role, stat, idx, value)",
    ("mined_patterns", "patterns"): "the mined findings per site and role",
    ("benchmark_baseline", "benchmarks"): "the benchmark repeats of both arms (baseline and patched)",
}

#: The other checks: name -> (asset, blocking, description).
OTHER_CHECKS: dict[str, tuple[str, bool, str]] = {
    "waste_budget_sums_to_step_time": (
        "waste_budget", True, "The waste-budget buckets add up to the measured step time within 5%."),
    "scenario_recording": (
        "workload_source", True, "A corpus scenario's files can be replayed: its expected_findings.yaml parses and "
                                 "its recording (cached_metrics.json) is a valid RunMetrics (a recording of a failed "
                                 "run is audited as that failure).  Other workloads pass."),
    "scenario_expected_findings": (
        "kb_matches", True, "A corpus scenario fires every rule of its expected_findings.yaml `must_fire` and none of "
                            "`must_not_fire`.  Other workloads pass."),
    "kb_corpus_recall": (
        "kb_rules", False, "Summary over the synthetic corpus: every scenario, replayed, fires the rules it must and "
                           "none it must not.  Names the failing scenarios; passes when there is no corpus; not "
                           "blocking (each scenario's partition is judged by its own checks)."),
}

warnings.filterwarnings("ignore", message=".*partitions_def on an AssetCheckSpec.*")


def check_specs(asset: str) -> list[dg.AssetCheckSpec]:
    """The in-asset check specs of ``asset`` (:data:`TABLE_ASSETS` schema checks and :data:`OTHER_CHECKS`).

    Partitioned like the workloads when the asset is (every asset here but ``kb_rules``).  An asset with
    none gets ``[]``.
    """
    specs = [dg.AssetCheckSpec(f"{table}_schema", asset=a, blocking=True, partitions_def=workloads_partitions,
                               description=f"The `{table}` rows this partition wrote ({what}) are all in the "
                                           f"warehouse and match its pandera schema.")
             for (a, table), what in TABLE_ASSETS.items() if a == asset]
    specs += [dg.AssetCheckSpec(name, asset=a, blocking=blocking, description=what,
                                partitions_def=None if a == "kb_rules" else workloads_partitions)
              for name, (a, blocking, what) in OTHER_CHECKS.items() if a == asset]
    return specs


def rows_check(asset: str, table: str, written: dict[str, dg.MetadataValue], warehouse: WarehouseResource,
               status: str = "written") -> dg.AssetCheckResult:
    """``table_schema`` on ``asset``: the rows just written (``written``: :meth:`WarehouseResource.write`'s
    metadata) read back from the warehouse by their ids, all there and valid (:func:`read_written`).

    A stage that wrote nothing (a replay's benchmark: not observable) passes, with ``status`` in the metadata.
    """
    w = (written["written"].value if "written" in written else {}).get(table)
    res = read_written(table, w or {"key": TABLES[table][0][0], "ids": [], "rows": 0}, warehouse, status)
    return dg.AssetCheckResult(asset_key=asset, check_name=f"{table}_schema", passed=res.passed,
                               metadata=res.metadata)


def read_written(table: str, w: dict, warehouse: WarehouseResource, status: str = "written") -> dg.AssetCheckResult:
    """Read the rows ``w`` names (``{"key": id column, "ids": [...], "rows": n}``) back from ``table`` and
    validate them (:func:`validate_rows`, with ``rows`` expected); the ids and ``status`` in the metadata."""
    df = warehouse.query(f'SELECT * FROM "{table}" WHERE list_contains(?, "{w["key"]}")', [w["ids"]])
    res = validate_rows(table, df, expected_rows=w["rows"])
    return dg.AssetCheckResult(passed=res.passed, metadata={**res.metadata, "ids": dg.MetadataValue.json(w["ids"]),
                                                            "status": status})


def read_back(instance: dg.DagsterInstance, partition: str, asset: str, table: str,
              warehouse: WarehouseResource) -> dg.AssetCheckResult:
    """The schema check again, later: the rows ``asset``'s latest materialization of ``partition`` recorded
    (``written`` metadata) read back from the warehouse and validated (:func:`read_written`).

    For a table edited after the audit (rows deleted, doubled): fails with the counts in the metadata.
    """
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1).records
    meta = recs[0].asset_materialization.metadata if recs and recs[0].asset_materialization else {}
    w = (meta["written"].value if "written" in meta else {}).get(table)
    return read_written(table, w or {"key": TABLES[table][0][0], "ids": [], "rows": 0}, warehouse,
                        meta["status"].value if "status" in meta else "written")


def validate_rows(table: str, df: pd.DataFrame, expected_rows: int | None = None) -> dg.AssetCheckResult:
    """Validate ``df`` with the warehouse table's pandera schema; failure cases (first 10) in the metadata.

    Also fails when ``expected_rows`` is given and the frame has another number of rows (rows lost or doubled).
    """
    meta: dict = {"rows": len(df)}
    try:
        schema(table).validate(df, lazy=True)
    except pandera.errors.SchemaErrors as exc:
        meta["failure_cases"] = dg.MetadataValue.json(exc.failure_cases.head(10).astype(str).to_dict("records"))
    if expected_rows is not None:
        meta["expected_rows"] = expected_rows
    ok = "failure_cases" not in meta and expected_rows in (None, len(df))
    return dg.AssetCheckResult(passed=ok, metadata=meta)


def waste_budget_sums_to_step_time(waste_budget: dict, profile_run: RunMetrics) -> dg.AssetCheckResult:
    """The buckets' seconds sum to the run's median step time within :data:`SUM_TOLERANCE` (on ``waste_budget``)."""
    total = sum(b["seconds"] for b in waste_budget.values())
    step = profile_run.step_time_s or 0.0
    err = abs(total - step) / step if step else float("inf")
    return dg.AssetCheckResult(
        asset_key="waste_budget", check_name="waste_budget_sums_to_step_time", passed=err <= SUM_TOLERANCE,
        metadata={"buckets_sum_s": total, "step_time_s": step, "relative_error": err,
                  "statuses": dg.MetadataValue.json({k: v["status"] for k, v in waste_budget.items()})})


def _scenario(partition: str, check_name: str, asset: str) -> tuple[Path, dict] | dg.AssetCheckResult:
    """``(folder, expectations)`` of the partition's corpus scenario, or the check's result when there is none to
    judge: passed for a partition that is not a scenario (no expected_findings.yaml), failed (with the reason)
    for expectations that do not parse."""
    from goblin_assets import workloads_root
    from goblin_assets.audit.corpus import ScenarioError, expectations, is_scenario

    folder = workloads_root() / partition
    if not is_scenario(folder):
        return dg.AssetCheckResult(asset_key=asset, check_name=check_name, passed=True, metadata={
            "status": f"{partition} is not a corpus scenario (no expected_findings.yaml): nothing to judge"})
    try:
        return folder, expectations(folder)
    except ScenarioError as exc:
        return dg.AssetCheckResult(asset_key=asset, check_name=check_name, passed=False,
                                   metadata={"scenario": folder.name, "reason": str(exc)})


def scenario_recording(partition: str) -> dg.AssetCheckResult:
    """On ``workload_source``: fails this partition alone when its scenario cannot be replayed (the reason names
    the file); never raises."""
    from goblin_assets.audit.corpus import recording_problem

    found = _scenario(partition, "scenario_recording", "workload_source")
    if isinstance(found, dg.AssetCheckResult):
        return found
    folder, spec = found
    problem = recording_problem(folder, failed_is_evidence=True)
    failed = problem is None and recording_problem(folder) is not None  # a failed run: audited as that failure
    return dg.AssetCheckResult(asset_key="workload_source", check_name="scenario_recording", passed=problem is None,
                               metadata={"scenario": folder.name, "reason": problem or (
                                   "a recording of a failed run: audited as the failure it records" if failed
                                   else "replayable"),
                                         "must_fire": dg.MetadataValue.json(spec["must_fire"])})


def scenario_expected_findings(partition: str, kb_matches: list[RuleMatch]) -> dg.AssetCheckResult:
    """On ``kb_matches``: this partition's fired rules against its own scenario's expectations (the failing
    rules named)."""
    from goblin_assets.audit.corpus import judge, verdict_line

    found = _scenario(partition, "scenario_expected_findings", "kb_matches")
    if isinstance(found, dg.AssetCheckResult):
        return found
    folder, spec = found
    fired = {m.rule_id for m in kb_matches if m.fired}
    missing, forbidden = judge(spec, fired)
    verdict = {"passed": not missing and not forbidden, "missing": missing, "forbidden": forbidden, "error": None}
    return dg.AssetCheckResult(
        asset_key="kb_matches", check_name="scenario_expected_findings", passed=verdict["passed"], metadata={
            "scenario": folder.name, "reason": verdict_line(verdict), "missing": dg.MetadataValue.json(missing),
            "forbidden": dg.MetadataValue.json(forbidden), "fired": dg.MetadataValue.json(sorted(fired))})


def kb_corpus_recall(kb_rules) -> dg.AssetCheckResult:
    """On ``kb_rules``: the corpus verdicts (:func:`goblin_assets.audit.corpus.corpus_recall`); passes when no
    scenario fails.

    A failing scenario makes this summary fail with severity WARN and its name
    and reason in the metadata (``failed``); nothing downstream waits on it.
    """
    from goblin_assets.audit.corpus import corpus_recall

    res = corpus_recall(kb_rules)
    failed = res["failed"]
    return dg.AssetCheckResult(
        asset_key="kb_rules", check_name="kb_corpus_recall", passed=not failed, severity=dg.AssetCheckSeverity.WARN,
        description=("no corpus scenario" if not res["scenarios"] else
                     f"{len(failed)} of {res['scenarios']} scenarios failed: {', '.join(sorted(failed))}" if failed
                     else f"all {res['scenarios']} scenarios pass"),
        metadata={"recall": res["recall"] if res["recall"] is not None else dg.MetadataValue.null(),
                  "scenarios": res["scenarios"], "expected_rules": res["expected"],
                  "failed": dg.MetadataValue.json(failed)})
