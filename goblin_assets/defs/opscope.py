"""Opscope recording assets (unpartitioned, group ``opscope``): each runs one driver of
:mod:`goblin_assets.opscope.drivers` and writes its tidy sketch rows to the warehouse."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from goblin_assets.defs.resources import RunnerResource
from goblin_assets.opscope.drivers import DriverResult, run_driver
from goblin_assets.warehouse.db import ensure_tables, write_frames
from goblin_assets.warehouse.tables import TABLES

POOL = "warehouse_writer"  # every asset that writes DuckDB: one writer at a time
_KW = dict(group_name="opscope", pool=POOL, kinds={"pytorch", "duckdb"})


class OpscopeConfig(dg.Config):
    """Run options: ``steps`` recorded (None: the driver's default)."""

    steps: int | None = None


def _record(context: dg.AssetExecutionContext, driver: str, config: OpscopeConfig, runner: RunnerResource,
            duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Run ``driver`` on the runner's device, write its rows in one transaction, attach the metadata."""
    res: DriverResult = run_driver(driver, steps=config.steps, device=runner.device)
    with duckdb.get_connection() as con:
        ensure_tables(con)
        n = write_frames(con, {"sketches": res.rows})["sketches"]
    for note in res.notes:
        context.log.warning(note)
    summ = res.summary
    return dg.MaterializeResult(metadata={
        "dagster/row_count": dg.MetadataValue.int(n),
        "run_id": dg.MetadataValue.text(res.run_id),
        "model": dg.MetadataValue.text(res.model),
        "sites": dg.MetadataValue.json(res.sites),
        "gate_passed": dg.MetadataValue.bool(res.gate_passed),
        "gate_checks": dg.MetadataValue.int(len(res.gates)),
        "gate_max_abs_diff": dg.MetadataValue.float(max((g.max_abs_diff for g in res.gates), default=0.0)),
        "summary": dg.MetadataValue.md(summ.head(60).to_markdown(index=False, floatfmt=".4g")),
        "notes": dg.MetadataValue.json(res.notes),
        "wall_s": dg.MetadataValue.float(round(res.wall_s, 2)),
        "dagster/column_schema": dg.MetadataValue.table_schema(
            dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t, _ in TABLES["sketches"]])),
        "dagster/table_name": dg.MetadataValue.text("warehouse.sketches"),
    })


@dg.asset(**_KW)
def opscope_sweep(context: dg.AssetExecutionContext, config: OpscopeConfig, runner: RunnerResource,
                  duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Sketches of one GEMM per shape on inputs from seven value distributions (gaussian, uniform, relu-sparse, heavy-tailed, outlier-channel, low-rank, quantised-grid), with the correctness gate checked on every distribution."""
    return _record(context, "sweep", config, runner, duckdb)


@dg.asset(**_KW)
def opscope_seq(context: dg.AssetExecutionContext, config: OpscopeConfig, runner: RunnerResource,
                duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Sketches of a decode-like stepped sequence: a fixed-weight transformer MLP block, one token per sequence per step, drifting activations."""
    return _record(context, "seq", config, runner, duckdb)


@dg.asset(**_KW)
def opscope_digits(context: dg.AssetExecutionContext, config: OpscopeConfig, runner: RunnerResource,
                   duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Sketches of an MLP trained with SGD on scikit-learn's real handwritten digits (real pixels, real post-ReLU activations)."""
    return _record(context, "digits", config, runner, duckdb)


@dg.asset(**_KW)
def opscope_minilm(context: dg.AssetExecutionContext, config: OpscopeConfig, runner: RunnerResource,
                   duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Sketches of every matmul and softmax of the pretrained all-MiniLM-L6-v2 (packaged weights, eager attention) on standard-library docstrings."""
    return _record(context, "minilm", config, runner, duckdb)


OPSCOPE_ASSETS = [opscope_sweep, opscope_seq, opscope_digits, opscope_minilm]
