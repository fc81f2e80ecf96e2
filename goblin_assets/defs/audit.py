"""Audit assets, one per stage of the audit session, partitioned by workload.

Each asset opens an :class:`~goblin_assets.audit.session.AuditSession` seeded
with its upstream assets' values, calls the one stage it is named after,
writes that stage's rows through the warehouse resource and returns its value
with metadata and its in-asset checks' results (goblin_assets/defs/checks.py).
Nothing here runs, parses or decides anything itself.
"""

import base64
import warnings

import dagster as dg
import pandas as pd
from dagster_pandera import pandera_schema_to_dagster_type

from goblin_assets import workloads_root
from goblin_assets.audit.session import AuditSession
from goblin_assets.contracts import BenchmarkResult, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.defs.automation import BUILD_WHEN_MISSING, REAUDIT, rocm_image
from goblin_assets.defs.checks import (
    check_specs,
    kb_corpus_recall,
    rows_check,
    scenario_expected_findings,
    scenario_recording,
    waste_budget_sums_to_step_time,
)
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.defs.resources import POOL, RunnerResource, WarehouseResource
from goblin_assets.errors import RunFailed
from goblin_assets.kb.encoder import MODEL_NAME
from goblin_assets.kb.retrieval import KBIndex
from goblin_assets.kb.rules import KnowledgeBase, load_kb
from goblin_assets.measure.calibration import HISTORY_SQL
from goblin_assets.measure.compile_counters import compile_stats
from goblin_assets.redact import redact
from goblin_assets.report.compare import AuditReport
from goblin_assets.report.markdown import report_markdown, speedup_text
from goblin_assets.runners.workload import Workload, load_workload
from goblin_assets.tracking.mlflow_run import log_audit
from goblin_assets.warehouse.tables import schema


def table_type(table: str) -> dg.DagsterType:
    """A Dagster type that validates a frame with the warehouse table's pandera schema (dagster-pandera)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=dg.BetaWarning)
        return pandera_schema_to_dagster_type(schema(table))


_KW = dict(partitions_def=workloads_partitions, kinds={"python"})


def value_type(cls: type, name: str | None = None) -> dg.DagsterType:
    """The Dagster type of an asset's value returned through ``MaterializeResult(value=...)``.

    An asset with in-asset checks cannot annotate ``-> MaterializeResult[T]`` (Dagster 1.13 then asks for a
    tuple of outputs), so the type is named here: the UI shows it and the step checks ``isinstance``.
    """
    return dg.PythonObjectDagsterType(cls, name=name or cls.__name__)
_AUTO = dict(automation_condition=REAUDIT)  # stages downstream of rocm_image: re-run when it changes


def audit_session(context: dg.AssetExecutionContext, workload: Workload, runner: RunnerResource,
                  kb: KnowledgeBase | None = None, **seeds) -> AuditSession:
    """The partition's audit session: this run's audit id, the runner resource's settings, ``seeds`` by stage.

    A context built for a direct call (``dg.build_asset_context``) has no run: the audit id is then a fresh one.
    """
    try:
        token = context.run.run_id
    except dg.DagsterError:  # DagsterInvalidPropertyError: no run behind a directly built context
        token = None
    return AuditSession.open(workload, settings=runner.settings(), runner=runner.get_runner(workload), kb=kb,
                             token=token, log=context.log.info, **seeds)


def _not_observable(s: AuditSession, stage: str) -> dict:
    reason = s.not_observable.get(stage, "")
    return {"status": "not_observable" if reason else "measured", "reason": reason}


@dg.asset(group_name="configs", check_specs=check_specs("workload_source"), dagster_type=value_type(Workload), **_KW)
def workload_source(context: dg.AssetExecutionContext):
    """The workload folder of this partition: `workloads/<name>/workload.yaml` and its entry script, or a replay folder (`synthetic/<scenario>`: a recorded `cached_metrics.json` and a config file, never run)."""
    wl = load_workload(workloads_root() / context.partition_key)
    return dg.MaterializeResult(value=wl, check_results=[scenario_recording(context.partition_key)], metadata={
        "entry": dg.MetadataValue.path(str(wl.script)), "unit": wl.unit, "script_sha256": wl.script_hash(),
        "runs_as": "replay" if wl.replay else "script",
        "recording": dg.MetadataValue.path(str(wl.root / wl.recording)) if wl.recording else "none"})


@dg.asset(group_name="configs", code_version="parse-v1", pool=POOL, check_specs=check_specs("training_config"),
          dagster_type=value_type(ConfigDict), **_KW)
def training_config(context: dg.AssetExecutionContext, workload_source: Workload, runner: RunnerResource,
                    warehouse: WarehouseResource):
    """The training configuration parsed from the user's file, with per-field provenance and warnings (table `configs`)."""
    s = audit_session(context, workload_source, runner)
    cfg = s.training_config()
    rows = "\n".join(f"| {k} | {v} | {cfg.provenance[k].kind if k in cfg.provenance else ''} |"
                     for k, v in cfg.values().items())
    written = warehouse.write(s.rows("training_config"))
    return dg.MaterializeResult(value=cfg, check_results=[rows_check("training_config", "configs", written, warehouse)],
                                metadata={**written, "warnings": dg.MetadataValue.json(cfg.warnings),
                                          "config": dg.MetadataValue.md("| field | value | from |\n|---|---|---|\n"
                                                                        + rows)})


def _failed_original(context: dg.AssetExecutionContext, s: AuditSession, warehouse: WarehouseResource):
    """The events of a profile run whose original failed as written (live, or a recording of a failed run).

    The failure is the audit's finding: its report is written (report.md with the diagnosis and the rules that
    match the failure), its ``run_failures`` and ``audits`` rows go to the warehouse (what ``goblin audit``
    writes for it), an observation of ``profile_run`` carries the verdict, and ``audit_report`` is recorded
    as materialized for the partition with the report (a runtime materialization: the report asset's own
    step is skipped, it has nothing measured to load).  No output is yielded, so the stages that need a run
    are skipped, not failed: the run succeeds (what ``goblin audit`` exit 0 is).  With
    ``$GOBLIN_MLFLOW_TRACKING_URI`` the failure is logged as one MLflow run (tracking/mlflow_run.py, as
    ``goblin audit`` logs it); its id is in the observation.
    """
    v, diag = s.verdict(), s.results.get("failure_diagnosis")
    fired = s.failure_rules()
    report = s.report_path.read_text(encoding="utf-8") if s.report_path else ""
    context.log.info(f"profile_run: {v.headline}")
    written = warehouse.write(s.failure_rows())
    mlflow_run = log_audit(s)
    meta = {**({"mlflow_run_id": mlflow_run} if mlflow_run else {}),
            "verdict": v.headline, "verdict_status": v.status, "healthy": v.healthy,
            "failure_class": diag.failure_class if diag is not None else "unknown",
            "fired_rules": dg.MetadataValue.json(fired), "report": dg.MetadataValue.md(report),
            "report_path": dg.MetadataValue.path(str(s.report_path))}
    yield dg.AssetObservation(asset_key=context.asset_key, partition=context.partition_key,
                              metadata={**meta, **written})
    context.log_event(dg.AssetMaterialization(asset_key=audit_report.key, partition=context.partition_key,
                                              metadata={**meta, "patch_offered": False,
                                                        "provenance": "failed as written"}))
    for spec in check_specs("profile_run"):
        yield dg.AssetCheckResult(check_name=spec.name, passed=True, metadata={
            "rows": 0, "reason": "no rows: the original program failed as written (see the profile_run observation)"})


def throughput_metadata(m: RunMetrics) -> dict:
    """``<unit>_per_sec`` when the run counted samples, else why not (never 0.0 for "none"); with
    ``torch_compile``: dynamo's record in one line when the run compiled (measure/compile_counters.py)."""
    out = ({f"{m.unit}_per_sec": m.throughput} if m.throughput is not None else
           {f"{m.unit}_per_sec": dg.MetadataValue.text("not observable (the harness counted no samples)")})
    stats = compile_stats(m.dynamo)
    if stats is not None:
        out["torch_compile"] = dg.MetadataValue.text(stats.headline())
    return out


@dg.asset(group_name="profiling", pool=POOL, deps=[rocm_image], check_specs=check_specs("profile_run"),
          dagster_type=value_type(RunMetrics), output_required=False, **_AUTO, **_KW)
def profile_run(context: dg.AssetExecutionContext, workload_source: Workload, runner: RunnerResource,
                warehouse: WarehouseResource):
    """A few steps of the workload under torch.profiler in a child process: RunMetrics and a Chrome trace (a replay folder's recording, labelled replayed or modelled).  When the original fails as written (or the recording is of a failed run), its failure report instead, and the stages that need a run are skipped."""
    s = audit_session(context, workload_source, runner)
    try:
        m = s.profile_run()
    except RunFailed:
        if not s.results.get("failure"):
            raise
        yield from _failed_original(context, s, warehouse)
        return
    written = warehouse.write(s.rows("profile_run"))
    yield dg.MaterializeResult(value=m, check_results=[rows_check("profile_run", "kernels", written, warehouse)],
                               metadata={**written, "trace": dg.MetadataValue.path(m.trace_path or ""),
                                         "step_time_s": m.step_time_s, **throughput_metadata(m),
                                         "run_id": f"{s.audit_id}-profile", "provenance": m.provenance.kind})


@dg.asset(group_name="profiling", pool=POOL, check_specs=check_specs("waste_budget"),
          dagster_type=value_type(dict, "WasteBudget"), **_AUTO, **_KW)
def waste_budget(context: dg.AssetExecutionContext, workload_source: Workload, profile_run: RunMetrics,
                 runner: RunnerResource, warehouse: WarehouseResource):
    """Step time split into useful, data_wait, host_gap, comm_excess, precision_path and kernel_shape."""
    s = audit_session(context, workload_source, runner, profile_run=profile_run)
    rows = s.rows("waste_budget")
    md = "| bucket | ms/step | share | status |\n|---|---|---|---|\n" + "\n".join(
        f"| {r.bucket} | {r.time_per_step_s * 1e3:.2f} | {r.share:.0%} | {r.status} |"
        for r in rows["waste_budget"].itertuples())
    written = warehouse.write(rows)
    budget = {k: v.model_dump() for k, v in s.waste_budget().items()}
    return dg.MaterializeResult(value=budget, metadata={**written, "budget": dg.MetadataValue.md(md)}, check_results=[
        rows_check("waste_budget", "waste_budget", written, warehouse),
        waste_budget_sums_to_step_time(budget, profile_run)])


@dg.asset(group_name="sketches", pool=POOL, deps=[profile_run], dagster_type=table_type("sketches"),
          check_specs=check_specs("tensor_sketches"), **_AUTO, **_KW)
def tensor_sketches(context: dg.AssetExecutionContext, workload_source: Workload, runner: RunnerResource,
                    warehouse: WarehouseResource):
    """The full sketch set (opscope/sketches.py: scalars, 32-bin histogram, per-channel and per-row vectors, sampled elements) of every forward matmul's lhs, rhs and out, tapped on the device (none, with the reason, for a replay)."""
    s = audit_session(context, workload_source, runner)
    df = s.tensor_sketches()
    written, status = warehouse.write(s.rows("tensor_sketches")), _not_observable(s, "tensor_sketches")
    return dg.MaterializeResult(
        value=df, check_results=[rows_check("tensor_sketches", "sketches", written, warehouse, status["status"])],
        metadata={**written, **status, "sites": dg.MetadataValue.json(sorted(df["site"].unique().tolist()))})


@dg.asset(group_name="mining", pool=POOL, dagster_type=table_type("patterns"),
          check_specs=check_specs("mined_patterns"), **_AUTO, **_KW)
def mined_patterns(context: dg.AssetExecutionContext, workload_source: Workload, tensor_sketches: pd.DataFrame,
                   runner: RunnerResource, warehouse: WarehouseResource):
    """Findings per site and role: sparse GEMM candidates, quantisation headroom, stationary vs drifting tensors (read by kb_matches as `patterns.<site>.<finding>`)."""
    s = audit_session(context, workload_source, runner, tensor_sketches=tensor_sketches)
    df = s.mined_patterns()
    written = warehouse.write(s.rows("mined_patterns"))
    return dg.MaterializeResult(
        value=df, check_results=[rows_check("mined_patterns", "patterns", written, warehouse)],
        metadata={**written, "findings": dg.MetadataValue.md(
            df[["site", "role", "finding", "score"]].to_markdown(index=False) if not df.empty else "_none_")})


@dg.asset(group_name="kb", code_version="kb-v1", kinds={"yaml"}, check_specs=check_specs("kb_rules"),
          dagster_type=value_type(KnowledgeBase), automation_condition=BUILD_WHEN_MISSING)
def kb_rules(context: dg.AssetExecutionContext):
    """The hand-written, cited rules of the packaged KB (kb/rocm_rules.yaml), validated (versioned by content hash)."""
    kb = load_kb()
    counts: dict[str, int] = {}
    for r in kb.rules:
        counts[r.category] = counts.get(r.category, 0) + 1
    return dg.MaterializeResult(value=kb, check_results=[kb_corpus_recall(kb)], metadata={
        "rules": len(kb.rules), "sha256": kb.sha256, "per_category": dg.MetadataValue.json(counts)})


@dg.asset(group_name="kb", code_version="kb-index-v2", pool=POOL, kinds={"duckdb"},
          automation_condition=BUILD_WHEN_MISSING)
def kb_index(context: dg.AssetExecutionContext, kb_rules: KnowledgeBase, warehouse: WarehouseResource) -> KBIndex:
    """Embeddings of every rule's symptom and fix (packaged all-MiniLM-L6-v2), cached in `kb_embeddings` per KB content hash."""
    from goblin_assets.kb.retrieval import embedding_frame
    from goblin_assets.kb.retrieval import kb_index as build_index

    cached = warehouse.query("SELECT * FROM kb_embeddings WHERE kb_sha256 = ? AND model = ?",
                             [kb_rules.sha256, MODEL_NAME])
    idx = build_index(kb_rules, cached)
    meta = warehouse.write({} if idx.from_cache else {"kb_embeddings": embedding_frame(kb_rules, idx)})
    context.add_output_metadata({**meta, "rules": len(idx.rule_ids), "kb_sha256": kb_rules.sha256,
                                 "from_cache": idx.from_cache, "dim": int(idx.vectors.shape[1])})
    return idx


@dg.asset(group_name="kb", pool=POOL, deps=[waste_budget], check_specs=check_specs("kb_matches"),
          dagster_type=value_type(list, "RuleMatches"), **_AUTO, **_KW)
def kb_matches(context: dg.AssetExecutionContext, workload_source: Workload, training_config: ConfigDict,
               profile_run: RunMetrics, tensor_sketches: pd.DataFrame, mined_patterns: pd.DataFrame,
               kb_rules: KnowledgeBase, kb_index: KBIndex, runner: RunnerResource, warehouse: WarehouseResource):
    """Every rule's detect conditions checked on this workload's config, waste budget, host (a replay's recorded one), mined tensor patterns and graded tensor findings (from the upstream sketches: nothing is recorded again)."""
    s = audit_session(context, workload_source, runner, kb=kb_rules, training_config=training_config,
                      profile_run=profile_run, tensor_sketches=tensor_sketches, mined_patterns=mined_patterns,
                      kb_index=kb_index)
    matches = s.kb_matches()
    top = sorted((m for m in matches if m.retrieval_score is not None), key=lambda m: -m.retrieval_score)[:5]
    return dg.MaterializeResult(value=matches, check_results=[
        scenario_expected_findings(context.partition_key, matches)], metadata={
        **warehouse.write(s.rows("kb_matches")),
        "fired": dg.MetadataValue.json([m.rule_id for m in matches if m.fired]),
        "host": dg.MetadataValue.json({"source": s.host.source, "cores": s.cores()}),
        "retrieval_top5": dg.MetadataValue.md("| rule | retrieval | detect | fired |\n|---|---|---|---|\n" + "\n".join(
            f"| {m.rule_id} | {m.retrieval_score:.3f} | {m.detect_score:.2f} | {m.fired} |" for m in top))})


@dg.asset(group_name="patches", **_AUTO, **_KW)
def patch(context: dg.AssetExecutionContext, workload_source: Workload, training_config: ConfigDict,
          kb_rules: KnowledgeBase, kb_matches: list[RuleMatch], profile_run: RunMetrics,
          runner: RunnerResource, warehouse: WarehouseResource) -> Patch:
    """The fired rules applied to the config and to the user's own file, as a unified diff; the predicted speedup scaled by the rules' measured record in `audits`."""
    s = audit_session(context, workload_source, runner, kb=kb_rules, training_config=training_config,
                      kb_matches=kb_matches, profile_run=profile_run, history=warehouse.query(HISTORY_SQL))
    p, cal = s.patch(), s.calibration()
    context.add_output_metadata({
        "diff": dg.MetadataValue.md(f"```diff\n{redact(p.diff)}\n```"),
        "rules": dg.MetadataValue.json([a.rule_id for a in p.applied]),
        "dropped": dg.MetadataValue.json(p.dropped),
        "predicted_speedup": f"{cal.low:.2f}x-{cal.high:.2f}x",
        "predicted_speedup_model": f"{p.expected_speedup_low:.2f}x-{p.expected_speedup_high:.2f}x",
        "calibration": cal.note(),
    })
    return p


@dg.multi_asset(
    group_name="benchmarks", pool=POOL, partitions_def=workloads_partitions,
    outs={"benchmark_baseline": dg.AssetOut(kinds={"python"}, **_AUTO),
          "benchmark_patched": dg.AssetOut(kinds={"python"}, **_AUTO)},
    deps=[rocm_image], check_specs=check_specs("benchmark_baseline"),
    internal_asset_deps={
        "benchmark_baseline": {dg.AssetKey("training_config"), dg.AssetKey("workload_source"), rocm_image.key},
        "benchmark_patched": {dg.AssetKey("patch"), dg.AssetKey("workload_source"), rocm_image.key}},
)
def benchmarks(context: dg.AssetExecutionContext, workload_source: Workload, training_config: ConfigDict,
               patch: Patch, runner: RunnerResource, warehouse: WarehouseResource):
    """Original vs patched for the same steps, repeats alternating; the patched run is also profiled. A replay measures nothing: both outputs are None, with the reason."""
    s = audit_session(context, workload_source, runner, training_config=training_config, patch=patch)
    bench, after = s.benchmarks(), s.patched_run()
    if bench is None or after is None:
        status = _not_observable(s, "benchmarks")
        for lab, value in (("baseline", None), ("patched", (None, None))):
            yield dg.Output(value, output_name=f"benchmark_{lab}", metadata=status)
        yield rows_check("benchmark_baseline", "benchmarks", {}, warehouse, status["status"])
        return
    meta = warehouse.write(s.rows("benchmarks"))
    for lab in ("baseline", "patched"):
        b = bench[lab]
        # the patched arm carries the patch it measured: a slower rule isolated here leaves the patch asset's
        # value behind (AuditSession._isolated), and the report must describe what was measured
        yield dg.Output((b, after, s.patch()) if lab == "patched" else b, output_name=f"benchmark_{lab}", metadata={
            **meta, "status": "measured", "median_per_s": b.median, "spread_per_s": b.spread,
            "throughputs": dg.MetadataValue.json(b.throughputs), "cache_hit": b.cache_hit})
    yield rows_check("benchmark_baseline", "benchmarks", meta, warehouse)


def measured_arms(benchmark_baseline: BenchmarkResult | None, benchmark_patched: tuple | None,
                  patch: Patch) -> tuple[dict[str, BenchmarkResult] | None, RunMetrics | None, Patch]:
    """The benchmarks stage's outputs as the session takes them: the arms by label (None when nothing was
    measured), the patched run, and the patch they measured.

    ``benchmark_patched`` is ``(result, patched run, patch measured)``, ``(None, None)`` when nothing was
    measured, or ``(result, patched run)`` as materialized before the patch was carried; the patch measured
    differs from the ``patch`` asset's value when a slower rule was withdrawn (AuditSession._isolated).
    """
    bench_p, after, *measured = benchmark_patched if benchmark_patched is not None else (None, None)
    bench = {"baseline": benchmark_baseline, "patched": bench_p} if benchmark_baseline is not None else None
    return bench, after, (measured[0] if measured else patch)


@dg.asset(group_name="reports", pool=POOL, **_AUTO, **_KW)
def audit_report(context: dg.AssetExecutionContext, profile_run: RunMetrics,
                 benchmark_baseline: BenchmarkResult | None, benchmark_patched: tuple, patch: Patch,
                 training_config: ConfigDict, workload_source: Workload, kb_matches: list[RuleMatch],
                 tensor_sketches: pd.DataFrame, mined_patterns: pd.DataFrame,
                 runner: RunnerResource, warehouse: WarehouseResource):
    """The before/after report: measured throughput, waste budget split, the diff and the citations (for a replay: the recorded numbers, labelled, and no measured speedup).

    ``kb_matches``, ``tensor_sketches`` and ``mined_patterns`` are the upstream assets' values: the report
    step matches and records nothing again (in a fresh step process that would load the embedding model,
    encode the KB and run the workload under the sketch taps once more)."""
    bench, after, patch = measured_arms(benchmark_baseline, benchmark_patched, patch)
    s = audit_session(context, workload_source, runner, profile_run=profile_run, benchmarks=bench,
                      patched_run=after, patch=patch, training_config=training_config, kb_matches=kb_matches,
                      tensor_sketches=tensor_sketches, mined_patterns=mined_patterns,
                      history=warehouse.query(HISTORY_SQL))
    rep = s.audit_report()  # a replay's benchmarks are not observable: nothing runs
    png = s.out_dir / "report.png"
    md = report_markdown(rep, f"data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"
                         if png.is_file() else None)
    v = s.verdict()
    mlflow_run = log_audit(s)  # one MLflow run when $GOBLIN_MLFLOW_TRACKING_URI is set (tracking/mlflow_run.py)
    context.add_output_metadata({**({"mlflow_run_id": mlflow_run} if mlflow_run else {}), "verdict": v.headline, "verdict_status": v.status, "healthy": v.healthy,
                                 "patch_offered": v.patch_offered,
                                 **warehouse.write(s.rows("audit_report")), "report": dg.MetadataValue.md(md),
                                 "report_path": dg.MetadataValue.path(str(s.report_path)),
                                 "provenance": profile_run.provenance.kind,
                                 "measured_speedup": dg.MetadataValue.float(rep.measured_speedup)
                                 if rep.measured_speedup is not None else dg.MetadataValue.null(),
                                 "speedup": speedup_text(rep) if isinstance(rep, AuditReport) else
                                 "not observable (replayed: nothing measured)",
                                 "measured_speedup_interval": dg.MetadataValue.json(
                                     rep.measured_interval.model_dump() if rep.measured_interval else None),
                                 "rules": dg.MetadataValue.json([a.rule_id for a in patch.applied])})
    return rep


AUDIT_ASSETS = [rocm_image, workload_source, training_config, profile_run, waste_budget, tensor_sketches, mined_patterns,
                kb_rules, kb_index, kb_matches, patch, benchmarks, audit_report]

#: The stages of one workload's audit: every asset above partitioned by workload (the knowledge base,
#: unpartitioned, is upstream of them and built once: BUILD_WHEN_MISSING).
AUDIT_STAGES = [a for a in AUDIT_ASSETS if isinstance(a, dg.AssetsDefinition) and a.partitions_def == workloads_partitions]

audit_workload_job = dg.define_asset_job(
    "audit_workload", selection=dg.AssetSelection.assets(*AUDIT_STAGES),
    description="Audit one workload: pick its partition (its folder under workloads/, or under $GOBLIN_WORKLOADS; "
                "the workload_folders_sensor adds a partition for each new folder) and launch. Runs every stage "
                "once: parse, profile, waste budget, sketches, rules, patch, benchmark, report.")
