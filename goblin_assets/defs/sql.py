"""One asset per SQL model in ``dbt_like_sql/``, with upstream assets read from its SQL."""
import dagster as dg

from goblin_assets.defs.resources import POOL, WarehouseResource
from goblin_assets.warehouse.sql_models import SqlModel, build_model, load_models
from goblin_assets.warehouse.storage import STORED_AS

#: Physical table -> the tidy table it stores (``sketch_stats`` -> ``sketches``; warehouse/storage.py).
STORES: dict[str, str] = {phys: tidy for tidy, phys in STORED_AS.items()}

#: Which assets write each warehouse table (the SQL's table names map to these); every table of
#: ``warehouse.tables.TABLES`` has its writers here (tests/test_sql_models.py checks it).
TABLE_PRODUCERS: dict[str, list[str]] = {
    "configs": ["training_config"],
    "observed_settings": ["profile_run"],
    "runs": ["profile_run", "tensor_sketches", "benchmark_patched", "recorded_trace"],
    "kernels": ["profile_run", "benchmark_patched", "recorded_trace"],
    "compile_events": ["profile_run"],
    "waste_budget": ["waste_budget", "benchmark_patched", "recorded_trace"],
    "sketches": ["tensor_sketches", "opscope_sweep", "opscope_seq", "opscope_digits", "opscope_minilm",
                 "inference_dynamics"],
    "patterns": ["mined_patterns", "opscope_patterns", "inference_dynamics", "probes", "roofline", "dataflow",
                 "plan"],
    "kb_matches": ["kb_matches"],
    "kb_embeddings": ["kb_index"],
    "benchmarks": ["benchmark_baseline", "benchmark_patched"],
    # an original that failed as written: profile_run's step writes these rows with the audit_report
    # materialization it records for the partition (defs/audit.py _failed_original)
    "audits": ["audit_report"],
    "run_failures": ["audit_report"],
    "probes": ["probes"],
    "roofline": ["roofline"],
    "plan": ["plan"],
    "online_sketches": ["online_sketches"],
    "memory_fit": ["memory_fit"],
    **{t: ["memory_snapshot"] for t in ("memory_snapshots", "memory_snapshot_segments", "memory_snapshot_frames",
                                        "memory_snapshot_events")},
    # recorded traces, and the audit's own GPU runs (the same analyses: goblin_assets/trace/)
    **{t: ["recorded_trace", "profile_run", "benchmark_patched"] for t in (
        "trace_runs", "trace_temporal", "trace_idle", "trace_kernel_categories", "trace_launch",
        "trace_short_kernels", "trace_ops", "trace_recompute", "trace_critical_path", "trace_sync_root_causes",
        "trace_findings", "trace_steps")},
    **{t: ["recorded_trace", "profile_run", "benchmark_patched", "recorded_job"] for t in ("trace_runs",
                                                                                          "trace_findings")},
    "trace_ranks": ["recorded_job"],
    "trace_collectives": ["recorded_job"],
}


def _deps(model: SqlModel, names: set[str]) -> list[dg.AssetKey]:
    keys: set[str] = set()
    for table in model.upstream:
        table = STORES.get(table, table)   # a physical table (sketch_stats) is written by its tidy table's writers
        keys.update([table] if table in names else TABLE_PRODUCERS.get(table, []))
    return [dg.AssetKey(k) for k in sorted(keys)]


def _sql_asset(model: SqlModel, names: set[str]) -> dg.AssetsDefinition:
    @dg.asset(name=model.name, group_name=f"sql_{model.layer}", deps=_deps(model, names), pool=POOL,
              kinds={"duckdb", "sql"}, description=model.description or f"{model.materialized} from {model.path.name}",
              code_version=model.version, metadata={"path": dg.MetadataValue.path(str(model.path))})
    def _build(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
        with warehouse.connection() as con:
            rows = build_model(con, model)
            cols = con.execute(f'DESCRIBE "{model.name}"').fetchall()
            preview = con.execute(f'SELECT * FROM "{model.name}" LIMIT 10').df()
        return dg.MaterializeResult(metadata={
            "dagster/row_count": rows,
            "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn(c[0], str(c[1])) for c in cols]),
            "materialized": model.materialized,
            "upstream_tables": dg.MetadataValue.json(list(model.upstream)),
            "query": dg.MetadataValue.md(f"```sql\n{model.sql.strip()}\n```"),
            "preview": dg.MetadataValue.md(preview.to_markdown(index=False) if not preview.empty else "(empty)"),
        })

    return _build


def build_sql_assets() -> list[dg.AssetsDefinition]:
    """Assets for every model under ``dbt_like_sql/`` (see warehouse/sql_models.py)."""
    models = load_models()
    names = {m.name for m in models}
    return [_sql_asset(m, names) for m in models]


SQL_ASSETS = build_sql_assets()
