"""Opscope mining assets (unpartitioned, group ``mining``).

Each asset calls one function of :mod:`goblin_assets.opscope.mining` (the
driver the ``goblin opscope`` mining verbs call too) and writes the frames it
returns through the warehouse resource in one transaction; nothing here reads
or decides anything else.

Lineage: a miner of recorded rows mines the runs its upstream assets
produced, as their latest materializations in this Dagster instance report
them (``run_id`` for a recording asset of :mod:`goblin_assets.defs.opscope`,
``run_ids`` for a miner).  Only when none of its upstream assets has been
materialized does it read the driver's latest run
(:func:`goblin_assets.opscope.mining.latest_run`, the CLI's definition); the
``run_ids_from`` metadata says which.
"""
from collections.abc import Callable

import dagster as dg

from goblin_assets.defs.opscope import DRIVERS
from goblin_assets.defs.resources import POOL, WarehouseResource
from goblin_assets.opscope import mining
from goblin_assets.opscope.mining import Mined, MiningInputError

_KW = dict(group_name="mining", pool=POOL, kinds={"pytorch", "duckdb"})

#: The recording assets whose sketch rows :func:`opscope_patterns` mines (goblin_assets/defs/opscope.py).
RECORDINGS = [dg.AssetKey(f"opscope_{d}") for d in DRIVERS]


def upstream_run_ids(context: dg.AssetExecutionContext, keys: list[dg.AssetKey]) -> list[str] | None:
    """The run ids that ``keys``' latest materializations report; None when none of them was materialized.

    Metadata read: ``run_ids`` (a JSON list, written by the miners) or
    ``run_id`` (a recording asset; skipped when its ``dagster/row_count`` is 0:
    a failed correctness gate writes no rows).

    Raises
    ------
    MiningInputError
        Upstream assets were materialized but none wrote rows (names them and the fix).
    """
    ids: list[str] = []
    seen: list[str] = []
    for key in keys:
        event = context.instance.get_latest_materialization_event(key)
        mat = event.asset_materialization if event is not None else None
        if mat is None:
            continue
        seen.append(key.to_user_string())
        md = mat.metadata
        if "run_ids" in md:
            ids += [str(r) for r in md["run_ids"].value]
        elif "run_id" in md and ("dagster/row_count" not in md or md["dagster/row_count"].value > 0):
            ids.append(str(md["run_id"].value))
    if seen and not ids:
        raise MiningInputError(f"{', '.join(seen)}: the latest materialization wrote no rows (a failed correctness "
                               f"gate?); materialize it again")
    return ids if seen else None


def _result(context: dg.AssetExecutionContext, warehouse: WarehouseResource, mined: Mined,
            upstream: list[dg.AssetKey] = ()) -> dg.MaterializeResult:
    """Write ``mined.frames`` in one transaction; metadata: the writer's, the findings as markdown, the run ids."""
    meta = warehouse.write(mined.frames)
    f = mined.findings
    md = f[["site", "role", "finding", "score"]].head(30).to_markdown(index=False) if not f.empty else "_no findings_"
    origin = {"given": f"lineage: {', '.join(k.to_user_string() for k in upstream)}",
              "latest": "latest run (no upstream materialization in this instance)",
              "made": "made by this asset"}[mined.source]
    context.log.info(f"{mined.title}: {len(f)} findings ({origin})")
    return dg.MaterializeResult(metadata={**meta, "findings": dg.MetadataValue.md(md),
                                          "run_ids": dg.MetadataValue.json(mined.run_ids),
                                          "run_ids_from": dg.MetadataValue.text(origin)})


def _mine_upstream(context: dg.AssetExecutionContext, warehouse: WarehouseResource, miner: Callable[..., Mined],
                   upstream: list[dg.AssetKey], **kw) -> dg.MaterializeResult:
    """Run ``miner`` on the runs ``upstream`` produced (or the latest run) and write what it returns."""
    mined = miner(warehouse.query, upstream_run_ids(context, upstream), log=context.log.info, **kw)
    return _result(context, warehouse, mined, upstream)


@dg.asset(deps=RECORDINGS, **_KW)
def opscope_patterns(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Mined patterns (sparse GEMM, int quantisation, LUT, delta, positional, stationarity) of the matmul sketches the recording assets wrote (`goblin opscope mine`)."""
    return _mine_upstream(context, warehouse, mining.mine, RECORDINGS)


@dg.asset(deps=[dg.AssetKey("opscope_minilm")], **_KW)
def inference_dynamics(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Attention concentration, attention sinks and cold/hot experts of `opscope_minilm`'s softmax / top-k sketches (MiniLM on real text when none were recorded; `goblin opscope infer`)."""
    return _mine_upstream(context, warehouse, mining.infer, [dg.AssetKey("opscope_minilm")],
                          token=context.run.run_id)


@dg.asset(deps=[opscope_patterns], **_KW)
def plan(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Actuation plan of the runs `opscope_patterns` mined: per site the exploit, guard, guard stability across steps, estimated and measured (A/B micro-benchmark, median of repeats) speedup (`goblin opscope plan`)."""
    return _mine_upstream(context, warehouse, mining.plan, [opscope_patterns.key])


@dg.asset(**_KW)
def roofline(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Roofline of the latest profiled run's GEMMs (FLOPs, bytes by real dtype, intensity, bound on MI300X/H100/H200/A100/this CPU) and the hot-shape histogram (`goblin opscope roofline`)."""
    return _result(context, warehouse, mining.roofline(warehouse.query, token=context.run.run_id,
                                                       log=context.log.info))


@dg.asset(**_KW)
def probes(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Host probes (2:4 feasibility, cardinality, effective/stable rank, 3/4/6/8-bit quantisation error) on MiniLM's real weights and activations (`goblin opscope probes`)."""
    return _result(context, warehouse, mining.probes(mining.label("probes", context.run.run_id),
                                                     log=context.log.info))


@dg.asset(**_KW)
def dataflow(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Repeated dataflow sub-DAGs of MiniLM's exported graph (merkle cones grown in lockstep) named as fusion candidates (`goblin opscope dataflow`)."""
    return _result(context, warehouse, mining.dataflow(mining.label("dataflow", context.run.run_id),
                                                       log=context.log.info))


@dg.asset(**_KW)
def online_sketches(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """Bounded one-pass recorders (Apache DataSketches KLL, HLL, var-opt) of MiniLM's FFN activations over sampled real-text requests."""
    return _result(context, warehouse, mining.online_sketches(mining.label("online_sketches", context.run.run_id),
                                                              log=context.log.info))


MINING_ASSETS = [opscope_patterns, inference_dynamics, probes, roofline, dataflow, plan, online_sketches]
