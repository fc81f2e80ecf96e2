"""Opscope mining assets (unpartitioned, group ``mining``): each calls one core function of
``goblin_assets.opscope`` on the latest recorded rows in the warehouse and writes its findings back."""

import json

import dagster as dg
import pandas as pd
from dagster_duckdb import DuckDBResource

from goblin_assets.warehouse.db import ensure_tables, write_frames
from goblin_assets.warehouse.tables import TABLES

POOL = "warehouse_writer"  # every asset that writes DuckDB: one writer at a time
_KW = dict(group_name="mining", pool=POOL, kinds={"pytorch", "duckdb"})


def _latest_sketches(duckdb: DuckDBResource, roles: tuple[str, ...]) -> pd.DataFrame:
    """The rows of the most recently written sketch run that has rows of ``roles`` (empty if none)."""
    in_roles = ", ".join(f"'{r}'" for r in roles)
    with duckdb.get_connection() as con:
        ensure_tables(con)
        last = con.execute(f"""SELECT run_id FROM sketches WHERE role IN ({in_roles})
                               GROUP BY run_id ORDER BY max(rowid) DESC LIMIT 1""").fetchall()
        if not last:
            return pd.DataFrame(columns=[c for c, _, _ in TABLES["sketches"]])
        return con.execute("SELECT * FROM sketches WHERE run_id = ?", [last[0][0]]).df()


def _result(duckdb: DuckDBResource, frames: dict[str, pd.DataFrame], summary: pd.DataFrame,
            note: str = "") -> dg.MaterializeResult:
    """Write ``frames`` in one transaction; metadata: row counts, the findings as markdown, the schema."""
    with duckdb.get_connection() as con:
        ensure_tables(con)
        counts = write_frames(con, frames)
    first = next(iter(frames))
    cols = [c for c in ("site", "role", "finding", "score") if c in summary.columns]
    md = summary[cols].head(30).to_markdown(index=False) if not summary.empty else f"_no findings_ {note}"
    return dg.MaterializeResult(metadata={
        "dagster/row_count": dg.MetadataValue.int(sum(counts.values())),
        "rows_by_table": dg.MetadataValue.json(counts),
        "findings": dg.MetadataValue.md(md),
        "dagster/column_schema": dg.MetadataValue.table_schema(
            dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t, _ in TABLES[first]])),
        "dagster/table_name": dg.MetadataValue.text(f"warehouse.{first}"),
    })


#: The recording drivers whose sketch rows the miners read (goblin_assets/defs/opscope.py).
_DRIVERS = [dg.AssetKey(k) for k in ("opscope_sweep", "opscope_seq", "opscope_digits", "opscope_minilm")]


@dg.asset(deps=_DRIVERS, **_KW)
def opscope_patterns(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Mined patterns of the latest recorded matmul sketches (sparse GEMM, int quantisation, LUT, delta, positional, stationarity)."""
    from goblin_assets.opscope.miner import mine_patterns

    sk = _latest_sketches(duckdb, ("lhs", "rhs", "out"))
    pat = mine_patterns(sk) if not sk.empty else pd.DataFrame(columns=[c for c, _, _ in TABLES["patterns"]])
    context.log.info(f"mined {len(pat)} findings from {sk['run_id'].nunique()} run(s)")
    return _result(duckdb, {"patterns": pat}, pat, "(no matmul sketches recorded yet)")


@dg.asset(deps=[dg.AssetKey("opscope_minilm")], **_KW)
def inference_dynamics(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Attention concentration, attention sinks and cold/hot experts from the latest softmax / top-k sketches (MiniLM on real text when none were recorded)."""
    from goblin_assets.opscope.infer import infer_dynamics, record_minilm_attention

    sk = _latest_sketches(duckdb, ("probs", "route"))
    frames = {}
    if sk.empty:
        sk = record_minilm_attention(run_id=f"infer-{context.run.run_id[:8]}")
        frames["sketches"] = sk
    pat = infer_dynamics(sk)
    return _result(duckdb, {"patterns": pat, **frames}, pat)


@dg.asset(**_KW)
def host_probes(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Host probes (2:4 feasibility, cardinality, effective/stable rank, 3/4/6/8-bit quantisation error) on MiniLM's real weights and activations."""
    from goblin_assets.opscope.probe import minilm_tensors, probe_findings, probe_frame, probe_tensor

    run_id = f"probe-{context.run.run_id[:8]}"
    tensors = minilm_tensors()
    results = {n: probe_tensor(t, channel_axis=-1 if n.endswith(".input") else 0) for n, t in tensors.items()}
    pat = probe_findings(results, run_id=run_id, workload="minilm")
    return _result(duckdb, {"probes": probe_frame(results, run_id), "patterns": pat}, pat)


@dg.asset(**_KW)
def gemm_roofline(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Roofline of the latest profiled run's GEMMs (FLOPs, bytes by real dtype, intensity, bound on MI300X/H100/H200/A100/this CPU) and the hot-shape histogram."""
    from goblin_assets import goblin_home
    from goblin_assets.opscope.roofline import profile_minilm_trace, roofline_findings, run_device_name, shapes, \
        trace_gemms

    with duckdb.get_connection() as con:
        ensure_tables(con)
        last = con.execute("SELECT run_id, workload, trace_path FROM runs WHERE trace_path IS NOT NULL "
                           "ORDER BY created_at DESC LIMIT 1").fetchall()
    if last:
        run_id, workload, trace = last[0]
    else:
        run_id, workload = f"shapes-{context.run.run_id[:8]}", "minilm"
        trace = str(profile_minilm_trace(goblin_home() / "traces" / f"{run_id}.json"))
    gemms, gpu = trace_gemms(trace)
    roof = shapes(gemms, run_id=run_id, source=str(trace))
    pat = roofline_findings(roof, run_device_name(gpu), run_id=run_id, workload=workload)
    return _result(duckdb, {"roofline": roof, "patterns": pat}, pat)


@dg.asset(**_KW)
def fusion_candidates(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Repeated dataflow sub-DAGs of MiniLM's exported graph (merkle cones grown in lockstep) named as fusion candidates."""
    from goblin_assets.opscope.dataflow import flow, flow_findings, minilm_graph

    pat = flow_findings(flow(minilm_graph()), run_id=f"flow-{context.run.run_id[:8]}", workload="minilm")
    return _result(duckdb, {"patterns": pat}, pat)


@dg.asset(deps=[opscope_patterns], **_KW)
def actuation_plan(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Per site: exploit, guard, guard stability across steps, estimated and measured (A/B micro-benchmark, median of repeats) speedup."""
    from goblin_assets.opscope.miner import mine_patterns
    from goblin_assets.opscope.plan import plan, plan_findings

    sk = _latest_sketches(duckdb, ("lhs", "rhs", "out"))
    if sk.empty:
        pl = pd.DataFrame(columns=[c for c, _, _ in TABLES["plan"]])
    else:
        found = mine_patterns(sk)
        context.log.info(f"actuation_plan: {len(found)} findings over {found['site'].nunique()} sites of run "
                         f"{sk['run_id'].iat[0]}; guards and A/B micro-benchmarks next")
        pl = plan(found, sk)
        context.log.info(f"actuation_plan: {len(pl)} sites planned, {int(pl['measured_speedup'].notna().sum())} "
                         f"measured")
    return _result(duckdb, {"plan": pl}, plan_findings(pl) if not pl.empty else pl,
                   "(no matmul sketches recorded yet)")


@dg.asset(**_KW)
def online_sketches(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Bounded one-pass recorders (Apache DataSketches KLL, HLL, var-opt) of MiniLM's FFN activations over sampled real-text requests."""
    from goblin_assets.opscope.infer import stdlib_texts
    from goblin_assets.opscope.online import record_online
    from goblin_assets.opscope.probe import minilm_tensors

    run_id = f"online-{context.run.run_id[:8]}"
    streams: dict[str, list] = {}
    pool = stdlib_texts(32)
    for req in range(4):  # four sampled "requests" of real text
        texts = pool[req * 8:(req + 1) * 8]
        for name, t in minilm_tensors(texts).items():
            if name.endswith(".input"):
                streams.setdefault(name, []).append(t)
    df = record_online(streams, run_id=run_id, seed=0)
    summary = pd.DataFrame([{"site": r.name, "role": r.kind, "finding": "online_sketch",
                             "score": float(r.n)} for r in df.itertuples()])
    context.log.info(json.dumps({"sites": len(streams)}))
    return _result(duckdb, {"online_sketches": df}, summary)


MINING_ASSETS = [opscope_patterns, inference_dynamics, host_probes, gemm_roofline, fusion_candidates,
                 actuation_plan, online_sketches]
