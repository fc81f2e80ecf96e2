"""Audit assets, one per stage, partitioned by workload.  Each calls one core function."""

import base64
import warnings
from pathlib import Path

import dagster as dg
import pandas as pd
from dagster_duckdb import DuckDBResource
from dagster_pandera import pandera_schema_to_dagster_type

from goblin_assets import goblin_home, workloads_root
from goblin_assets.audit import pipeline as stages
from goblin_assets.audit import retrieval
from goblin_assets.audit.corpus import replay_report
from goblin_assets.redact import redact
from goblin_assets.audit.kb import KnowledgeBase, load_kb
from goblin_assets.audit.report import compare_runs, render_markdown, write_report
from goblin_assets.contracts import BenchmarkResult, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.defs.automation import REAUDIT, rocm_image
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.defs.resources import RunnerResource
from goblin_assets.opscope.record import record_workload
from goblin_assets.runners.replay import not_observable
from goblin_assets.runners.workload import Workload, load_workload
from goblin_assets.warehouse import frames as F
from goblin_assets.warehouse.db import ensure_tables, write_frames
from goblin_assets.warehouse.tables import TABLES, columns, schema

POOL = "warehouse_writer"  # every asset that writes DuckDB: one writer at a time


def table_type(table: str) -> dg.DagsterType:
    """A Dagster type that validates a frame with the warehouse table's pandera schema (dagster-pandera)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=dg.BetaWarning)
        return pandera_schema_to_dagster_type(schema(table))
_KW = dict(partitions_def=workloads_partitions, kinds={"python"})
_AUTO = dict(automation_condition=REAUDIT)  # stages downstream of rocm_image: re-run when it changes


def _audit_id(context: dg.AssetExecutionContext) -> str:
    return f"{context.partition_key.replace('/', '-')}-{context.run.run_id[:8]}"


def _write(duckdb: DuckDBResource, frames: dict[str, pd.DataFrame]) -> dict[str, dg.MetadataValue]:
    """Write frames in one transaction; metadata: row counts, which rows (``written``) and the first table's schema.

    ``written`` is ``table -> {"key": its id column, "ids": [...], "rows": n}``: what the table checks
    (defs/checks.py) read back from the warehouse.
    """
    with duckdb.get_connection() as con:
        ensure_tables(con)
        counts = write_frames(con, frames)
    first = next(iter(frames))
    schema = dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t, _ in TABLES[first]])
    key = {t: TABLES[t][0][0] for t in frames}
    written = {t: {"key": key[t], "ids": sorted(df[key[t]].astype(str).unique().tolist()), "rows": counts[t]}
               for t, df in frames.items()}
    return {
        "dagster/row_count": dg.MetadataValue.int(sum(counts.values())),
        "rows_by_table": dg.MetadataValue.json(counts),
        "written": dg.MetadataValue.json(written),
        "dagster/column_schema": dg.MetadataValue.table_schema(schema),
        "dagster/table_name": dg.MetadataValue.text(f"warehouse.{first}"),
    }


@dg.asset(group_name="configs", **_KW)
def workload_source(context: dg.AssetExecutionContext) -> Workload:
    """The workload folder of this partition: `workloads/<name>/workload.yaml` and its entry script, or a replay folder (`synthetic/<scenario>`: a recorded `cached_metrics.json` and a config file, never run)."""
    wl = load_workload(workloads_root() / context.partition_key)
    context.add_output_metadata({"entry": dg.MetadataValue.path(str(wl.script)), "unit": wl.unit,
                                 "script_sha256": wl.script_hash(), "runs_as": "replay" if wl.replay else "script",
                                 "recording": dg.MetadataValue.path(str(wl.root / wl.recording)) if wl.recording
                                 else "none"})
    return wl


@dg.asset(group_name="configs", code_version="parse-v1", **_KW)
def training_config(context: dg.AssetExecutionContext, workload_source: Workload) -> ConfigDict:
    """The training configuration parsed from the user's file, with per-field provenance and warnings."""
    cfg = stages.training_config(workload_source)
    rows = "\n".join(f"| {k} | {v} | {cfg.provenance[k].kind if k in cfg.provenance else ''} |"
                     for k, v in cfg.values().items())
    context.add_output_metadata({
        "config": dg.MetadataValue.md("| field | value | from |\n|---|---|---|\n" + rows),
        "warnings": dg.MetadataValue.json(cfg.warnings),
    })
    return cfg


@dg.asset(group_name="profiling", pool=POOL, deps=[rocm_image], **_AUTO, **_KW)
def profile_run(context: dg.AssetExecutionContext, workload_source: Workload, runner: RunnerResource,
                duckdb: DuckDBResource) -> RunMetrics:
    """A few steps of the workload under torch.profiler in a child process: RunMetrics and a Chrome trace (a replay folder's recording, labelled replayed or modelled)."""
    m = stages.profile(workload_source, runner.get_runner(workload_source), runner.profiled_steps, label="profile",
                       warmup=runner.warmup_steps, log=context.log.info)
    run_id = f"{_audit_id(context)}-profile"
    meta = _write(duckdb, {"runs": F.runs_frame(m, run_id, "profile"), "kernels": F.kernels_frame(m, run_id)})
    context.add_output_metadata({**meta, "trace": dg.MetadataValue.path(m.trace_path or ""),
                                 "step_time_s": m.step_time_s, f"{m.unit}_per_sec": m.throughput or 0.0,
                                 "run_id": run_id, "provenance": m.provenance.kind})
    return m


@dg.asset(group_name="profiling", pool=POOL, **_AUTO, **_KW)
def waste_budget(context: dg.AssetExecutionContext, profile_run: RunMetrics, duckdb: DuckDBResource) -> dict:
    """Step time split into useful, data_wait, host_gap, comm_excess, precision_path and kernel_shape."""
    run_id = f"{_audit_id(context)}-profile"
    df = F.waste_frame(profile_run, run_id, "profile")
    meta = _write(duckdb, {"waste_budget": df})
    md = "| bucket | ms/step | share | status |\n|---|---|---|---|\n" + "\n".join(
        f"| {r.bucket} | {r.seconds * 1e3:.2f} | {r.share:.0%} | {r.status} |" for r in df.itertuples())
    context.add_output_metadata({**meta, "budget": dg.MetadataValue.md(md)})
    return {k: v.model_dump() for k, v in profile_run.waste_budget.items()}


@dg.asset(group_name="sketches", pool=POOL, deps=[profile_run], dagster_type=table_type("sketches"), **_AUTO, **_KW)
def tensor_sketches(context: dg.AssetExecutionContext, workload_source: Workload, runner: RunnerResource,
                    duckdb: DuckDBResource) -> pd.DataFrame:
    """The full sketch set (opscope/sketches.py: scalars, 32-bin histogram, per-channel and per-row vectors, sampled elements) of every forward matmul's lhs, rhs and out, tapped on the device (none, with the reason, for a replay)."""
    r = runner.get_runner(workload_source)
    if reason := not_observable(workload_source, r, "sketch"):
        context.log.warning(f"tensor_sketches: {reason}")
        df = pd.DataFrame(columns=columns("sketches"))
    else:
        context.log.info(f"tensor_sketches: tapping forward matmuls for {runner.sketch_steps} steps")
        df = record_workload(workload_source, r, steps=runner.sketch_steps, run_id=f"{_audit_id(context)}-sketch")
        context.log.info(f"tensor_sketches: {len(df)} rows from {df['site'].nunique()} sites")
    context.add_output_metadata({**_write(duckdb, {"sketches": df}),
                                 "status": "not_observable" if reason else "measured", "reason": reason or "",
                                 "sites": dg.MetadataValue.json(sorted(df["site"].unique().tolist()))})
    return df


@dg.asset(group_name="mining", pool=POOL, dagster_type=table_type("patterns"), **_AUTO, **_KW)
def mined_patterns(context: dg.AssetExecutionContext, tensor_sketches: pd.DataFrame,
                   duckdb: DuckDBResource) -> pd.DataFrame:
    """Findings per site and role: sparse GEMM candidates, stationary vs drifting tensors."""
    from goblin_assets.opscope.miner import mine_patterns  # torch: imported when it runs, not at load

    df = mine_patterns(tensor_sketches)
    meta = _write(duckdb, {"patterns": df})
    context.add_output_metadata({**meta, "findings": dg.MetadataValue.md(
        df[["site", "role", "finding", "score"]].to_markdown(index=False))})
    return df


@dg.asset(group_name="kb", code_version="kb-v1", kinds={"yaml"})
def kb_rules(context: dg.AssetExecutionContext) -> KnowledgeBase:
    """The hand-written, cited rules of kb/rocm_rules.yaml, validated (versioned by content hash)."""
    kb = load_kb()
    counts: dict[str, int] = {}
    for r in kb.rules:
        counts[r.category] = counts.get(r.category, 0) + 1
    context.add_output_metadata({"rules": len(kb.rules), "sha256": kb.sha256,
                                 "per_category": dg.MetadataValue.json(counts)})
    return kb


@dg.asset(group_name="kb", code_version="kb-index-v1", pool=POOL, kinds={"duckdb"})
def kb_index(context: dg.AssetExecutionContext, kb_rules: KnowledgeBase, duckdb: DuckDBResource) -> dict:
    """Embeddings of every rule's symptom and fix (packaged all-MiniLM-L6-v2), cached per KB content hash."""
    with duckdb.get_connection() as con:
        ensure_tables(con)
        idx = retrieval.kb_index(kb_rules, con)
    context.add_output_metadata({"rules": len(idx.rule_ids), "kb_sha256": kb_rules.sha256,
                                 "from_cache": idx.from_cache, "dim": int(idx.vectors.shape[1])})
    return {"kb_sha256": kb_rules.sha256, "rules": len(idx.rule_ids)}


@dg.asset(group_name="kb", pool=POOL, deps=[waste_budget, mined_patterns, kb_index], **_AUTO, **_KW)
def kb_matches(context: dg.AssetExecutionContext, training_config: ConfigDict, profile_run: RunMetrics,
               kb_rules: KnowledgeBase, workload_source: Workload, duckdb: DuckDBResource) -> list[RuleMatch]:
    """Every rule's detect conditions checked on this workload's config and waste budget (in a replay's recorded environment)."""
    matches = stages.kb_matches(training_config, profile_run, kb_rules, workload_source.recorded_environment())
    meta = _write(duckdb, {"kb_matches": F.kb_frame(matches, _audit_id(context), workload_source.name)})
    top = sorted((m for m in matches if m.retrieval_score is not None), key=lambda m: -m.retrieval_score)[:5]
    context.add_output_metadata({**meta, "fired": dg.MetadataValue.json([m.rule_id for m in matches if m.fired]),
                                 "retrieval_top5": dg.MetadataValue.md("| rule | retrieval | detect | fired |\n|---|---|---|---|\n" + "\n".join(
                                     f"| {m.rule_id} | {m.retrieval_score:.3f} | {m.detect_score:.2f} | {m.fired} |"
                                     for m in top))})
    return matches


def _out_dir(context: dg.AssetExecutionContext) -> Path:
    return goblin_home() / "audits" / _audit_id(context)


@dg.asset(group_name="patches", **_AUTO, **_KW)
def patch(context: dg.AssetExecutionContext, training_config: ConfigDict, kb_rules: KnowledgeBase,
          kb_matches: list[RuleMatch], profile_run: RunMetrics, workload_source: Workload) -> Patch:
    """The fired rules applied to the config and to the user's own file, as a unified diff."""
    p = stages.patch(training_config, kb_rules, kb_matches, profile_run, workload_source, _out_dir(context))
    context.add_output_metadata({
        "diff": dg.MetadataValue.md(f"```diff\n{redact(p.diff)}\n```"),
        "rules": dg.MetadataValue.json([a.rule_id for a in p.applied]),
        "dropped": dg.MetadataValue.json(p.dropped),
        "predicted_speedup": f"{p.expected_speedup_low:.2f}x-{p.expected_speedup_high:.2f}x",
    })
    return p


@dg.multi_asset(
    group_name="benchmarks", pool=POOL, partitions_def=workloads_partitions,
    outs={"benchmark_baseline": dg.AssetOut(kinds={"python"}, **_AUTO),
          "benchmark_patched": dg.AssetOut(kinds={"python"}, **_AUTO)},
    deps=[rocm_image],
    internal_asset_deps={
        "benchmark_baseline": {dg.AssetKey("training_config"), dg.AssetKey("workload_source"), rocm_image.key},
        "benchmark_patched": {dg.AssetKey("patch"), dg.AssetKey("workload_source"), rocm_image.key}},
)
def benchmarks(context: dg.AssetExecutionContext, workload_source: Workload, training_config: ConfigDict,
               patch: Patch, runner: RunnerResource, duckdb: DuckDBResource):
    """Original vs patched for the same steps, repeats alternating; the patched run is also profiled. A replay measures nothing: both outputs are None, with the reason."""
    r = runner.get_runner(workload_source)
    if reason := not_observable(workload_source, r, "benchmark"):
        context.log.warning(f"benchmarks: {reason}")
        for lab, value in (("baseline", None), ("patched", (None, None))):
            yield dg.Output(value, output_name=f"benchmark_{lab}", metadata={"status": "not_observable",
                                                                                "reason": reason})
        return
    context.log.info(f"benchmarks: {runner.bench_repeats} alternating repeats of {runner.bench_steps} steps, "
                     f"baseline and patched")
    bench = stages.benchmarks(workload_source, r, training_config, patch, runner.bench_steps, runner.bench_repeats,
                              log=context.log.info)
    after = stages.profile(workload_source, r, runner.profiled_steps, p=patch, label="patched",
                           warmup=runner.warmup_steps, log=context.log.info)
    aid = _audit_id(context)
    meta = _write(duckdb, {
        "benchmarks": F.bench_frame(bench, aid, workload_source.name),
        "runs": F.runs_frame(after, f"{aid}-patched", "patched", aid),
        "waste_budget": F.waste_frame(after, f"{aid}-patched", "patched"),
        "kernels": F.kernels_frame(after, f"{aid}-patched"),
    })
    for lab in ("baseline", "patched"):
        b = bench[lab]
        yield dg.Output((b, after) if lab == "patched" else b, output_name=f"benchmark_{lab}", metadata={
            **meta, "status": "measured", "median": b.median, "spread": b.spread,
            "throughputs": dg.MetadataValue.json(b.throughputs), "cache_hit": b.cache_hit})


@dg.asset(group_name="reports", pool=POOL, **_AUTO, **_KW)
def audit_report(context: dg.AssetExecutionContext, profile_run: RunMetrics,
                 benchmark_baseline: BenchmarkResult | None, benchmark_patched: tuple, patch: Patch,
                 training_config: ConfigDict, workload_source: Workload, duckdb: DuckDBResource):
    """The before/after report: measured throughput, waste budget split, the diff and the citations (for a replay: the recorded numbers, labelled, and no measured speedup)."""
    bench_p, after = benchmark_patched
    out = _out_dir(context)
    if benchmark_baseline is None:  # nothing was measured: a replay
        rep = replay_report(profile_run, patch, training_config, model=workload_source.model)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "report.md"
        path.write_text(rep.markdown, encoding="utf-8")
        md = rep.markdown
    else:
        rep = compare_runs(profile_run, after, {"baseline": benchmark_baseline, "patched": bench_p}, patch,
                           training_config, model=workload_source.model)
        path = write_report(rep, out)
        png = base64.b64encode((out / "report.png").read_bytes()).decode()
        md = render_markdown(rep, f"data:image/png;base64,{png}")
    aid = _audit_id(context)
    meta = _write(duckdb, {"audits": F.audit_frame(aid, workload_source.name, f"{aid}-profile",
                                                   f"{aid}-patched" if after else None, rep, patch, path)})
    context.add_output_metadata({**meta, "report": dg.MetadataValue.md(md),
                                 "report_path": dg.MetadataValue.path(str(path)),
                                 "provenance": profile_run.provenance.kind,
                                 "measured_speedup": dg.MetadataValue.float(rep.measured_speedup)
                                 if rep.measured_speedup is not None else dg.MetadataValue.null(),
                                 "rules": dg.MetadataValue.json([a.rule_id for a in patch.applied])})
    return rep


AUDIT_ASSETS = [rocm_image, workload_source, training_config, profile_run, waste_budget, tensor_sketches, mined_patterns,
                kb_rules, kb_index, kb_matches, patch, benchmarks, audit_report]
