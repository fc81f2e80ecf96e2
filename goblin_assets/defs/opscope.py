"""Opscope recording assets (unpartitioned, group ``opscope``): each runs one driver of
:mod:`goblin_assets.opscope.drivers`, writes its tidy sketch rows to the warehouse and
reports the driver's correctness gate as a blocking asset check."""

import dagster as dg

from goblin_assets.defs.resources import POOL, RunnerResource, WarehouseResource
from goblin_assets.warehouse.tables import TABLES
_KW = dict(group_name="opscope", pool=POOL, kinds={"pytorch", "duckdb"})

#: The gate check's name on every driver asset.
GATE_CHECK = "correctness_gate"

#: Driver name -> the asset's description (its UI docstring).
DRIVERS: dict[str, str] = {
    "sweep": "Sketches of one GEMM per shape on inputs from seven value distributions (gaussian, uniform, "
             "relu-sparse, heavy-tailed, outlier-channel, low-rank, quantised-grid), with the correctness gate "
             "checked on every distribution.",
    "seq": "Sketches of a decode-like stepped sequence: a fixed-weight transformer MLP block, one token per "
           "sequence per step, drifting activations.",
    "digits": "Sketches of an MLP trained with SGD on scikit-learn's real handwritten digits (real pixels, real "
              "post-ReLU activations).",
    "minilm": "Sketches of every matmul and softmax of the pretrained all-MiniLM-L6-v2 (packaged weights, eager "
              "attention) on standard-library docstrings.",
}


class OpscopeConfig(dg.Config):
    """Run options: ``steps`` recorded (None: the driver's default)."""

    steps: int | None = None


def _gate_result(res) -> dg.AssetCheckResult:
    """The driver's own gate results (torch.testing.assert_close, injected vs original outputs) as a check."""
    gates = [{"passed": g.passed, "outputs_compared": g.outputs_compared, "max_abs_diff": g.max_abs_diff,
              "message": g.message} for g in res.gates]
    return dg.AssetCheckResult(check_name=GATE_CHECK, passed=res.gate_passed, metadata={
        "gate_checks": dg.MetadataValue.int(len(gates)),
        "outputs_compared": dg.MetadataValue.int(sum(g["outputs_compared"] for g in gates)),
        "max_abs_diff": dg.MetadataValue.float(max((g["max_abs_diff"] for g in gates), default=float("nan"))),
        "gates": dg.MetadataValue.json(gates)})


def _log_progress(context: dg.AssetExecutionContext, res) -> None:
    """One line per model (per GEMM shape for the sweep) of what was recorded, then the gate."""
    for model, rows in res.rows.groupby("model", sort=False):
        dists = rows["dist"].nunique()
        context.log.info(f"{res.driver} {model}: {rows['step'].nunique()} steps"
                         + (f" x {dists} distributions" if dists > 1 else "")
                         + f", {rows['site'].nunique()} sites, {len(rows)} rows")
    context.log.info(f"{res.driver}: gate {sum(g.passed for g in res.gates)}/{len(res.gates)} passed, "
                     f"{len(res.rows)} rows in {res.wall_s:.1f} s")


def _record(context: dg.AssetExecutionContext, driver: str, config: OpscopeConfig, runner: RunnerResource,
            warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Run ``driver`` on the runner's device; write its rows (only if its gate passed); attach metadata and the gate."""
    from goblin_assets.opscope.drivers import run_driver  # torch: imported when a driver runs, not at load

    context.log.info(f"{driver}: recording on {runner.device} ({config.steps or 'default'} steps)")
    res = run_driver(driver, steps=config.steps, device=runner.device, progress=context.log.info)
    _log_progress(context, res)
    n = 0
    if res.gate_passed:  # a graph whose outputs changed under the taps records nothing
        n = warehouse.write({"sketches": res.rows})["dagster/row_count"].value
    for note in res.notes:
        context.log.warning(note)
    return dg.MaterializeResult(check_results=[_gate_result(res)], metadata={
        "dagster/row_count": dg.MetadataValue.int(n),
        "run_id": dg.MetadataValue.text(res.run_id),
        "model": dg.MetadataValue.text(res.model),
        "sites": dg.MetadataValue.json(res.sites),
        "gate_passed": dg.MetadataValue.bool(res.gate_passed),
        "gate_checks": dg.MetadataValue.int(len(res.gates)),
        "gate_max_abs_diff": dg.MetadataValue.float(max((g.max_abs_diff for g in res.gates), default=0.0)),
        "summary": dg.MetadataValue.md(res.summary.head(60).to_markdown(index=False, floatfmt=".4g")),
        "notes": dg.MetadataValue.json(res.notes),
        "wall_s": dg.MetadataValue.float(round(res.wall_s, 2)),
        "dagster/column_schema": dg.MetadataValue.table_schema(
            dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t, _ in TABLES["sketches"]])),
        "dagster/table_name": dg.MetadataValue.text("warehouse.sketches"),
    })


def driver_asset(driver: str) -> dg.AssetsDefinition:
    """The ``opscope_<driver>`` asset, with its correctness gate as a blocking in-asset check."""
    name = f"opscope_{driver}"
    gate = dg.AssetCheckSpec(GATE_CHECK, asset=name, blocking=True, description=(
        "The injected graph's own outputs equal the original model's (torch.testing.assert_close), for every "
        "injection of this driver; read from the recording run itself, nothing re-runs. Blocks the miners."))

    @dg.asset(name=name, description=DRIVERS[driver], check_specs=[gate], **_KW)
    def _asset(context: dg.AssetExecutionContext, config: OpscopeConfig, runner: RunnerResource,
               warehouse: WarehouseResource) -> dg.MaterializeResult:
        return _record(context, driver, config, runner, warehouse)

    return _asset


OPSCOPE_ASSETS = [driver_asset(d) for d in DRIVERS]
