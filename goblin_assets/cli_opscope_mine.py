"""The ``goblin opscope`` mining verbs: mine, infer, probe, shapes, flow, graph, plan.

    goblin opscope mine   [--run-id ID] [--workload PATH] [--json]
    goblin opscope infer  [--run-id ID] [--json]
    goblin opscope probe  [--run-id ID] [--file TENSORS.safetensors] [--dump PATH] [--json]
    goblin opscope shapes [--run-id ID] [--trace TRACE.json] [--json]
    goblin opscope flow   [--run-id ID] [--json]
    goblin opscope graph  FILE [--run-id ID] [--json]
    goblin opscope plan   [--run-id ID] [--no-measure] [--json]

``--run-id`` selects the recorded run to read (default: the latest run of the
matching kind in the warehouse); where a verb makes its own data (probe,
flow, graph) it labels the rows it writes.  Without recorded data the verbs
fall back to real data they can make here: ``infer`` taps the packaged
MiniLM on real text, ``shapes`` profiles a MiniLM forward, ``probe`` and
``flow`` read MiniLM's real weights and exported graph.  Findings are written
to the warehouse (``patterns`` and the verb's detail table).  With ``--json``
each verb prints a list of finding objects: ``site``, ``role``, ``finding``,
``score``, ``evidence`` (the numbers behind it) and ``run_id``.
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid

import pandas as pd
from rich.console import Console
from rich.table import Table

from goblin_assets.errors import GoblinError

console = Console(stderr=True)
out = Console()


class MiningInputError(GoblinError):
    """The warehouse holds no data for the verb and no fallback applies (message says what to record)."""


def _findings_json(patterns: pd.DataFrame) -> list[dict]:
    return [{"run_id": r.run_id, "site": r.site, "role": r.role, "finding": r.finding, "score": float(r.score),
             "evidence": json.loads(r.evidence_json)} for r in patterns.itertuples()]


def _brief(ev: dict, limit: int = 160) -> str:
    """The evidence's numbers on one line (nested dicts flattened one level), for the table view."""
    flat: dict = {}
    for k, v in ev.items():
        if isinstance(v, dict):
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[k] = v
    parts = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in flat.items()
             if isinstance(v, (int, float, str, bool)) and k not in ("note", "dtype")]
    return ", ".join(parts)[:limit]


def _emit(args, title: str, patterns: pd.DataFrame, frames: dict[str, pd.DataFrame]) -> int:
    """Write ``frames`` to the warehouse (one transaction) and print the findings."""
    from goblin_assets.warehouse.db import write

    counts = write(frames)
    console.print(f"[dim]warehouse: {sum(counts.values())} rows ({', '.join(f'{k} {v}' for k, v in counts.items())})"
                  f"[/dim]")
    if args.json:
        sys.stdout.write(json.dumps(_findings_json(patterns), indent=2, default=str) + "\n")
        return 0
    t = Table(title=title)
    for c in ("site", "role", "finding", "score", "evidence"):
        t.add_column(c, overflow="fold")
    for r in patterns.itertuples():
        t.add_row(r.site, r.role, r.finding, f"{r.score:.3g}", _brief(json.loads(r.evidence_json)))
    out.print(t)
    return 0


def _lit(s: str) -> str:
    """A SQL string literal."""
    return "'" + str(s).replace("'", "''") + "'"


def latest_run(table: str, where: str = "TRUE", run_id: str | None = None) -> str:
    """``run_id`` if given (checked to exist in ``table``), else the most recently written run matching ``where``.

    "Most recent": the newest ``runs.created_at`` among the table's run ids
    when the ``runs`` table knows them, else the last inserted row.

    Raises
    ------
    MiningInputError
        No such run / no rows.
    """
    from goblin_assets.warehouse.db import query

    if run_id:
        n = query(f"SELECT count(*) AS n FROM \"{table}\" WHERE run_id = {_lit(run_id)}")["n"][0]
        if not n:
            raise MiningInputError(f"table {table}: no rows for run_id {run_id!r}")
        return run_id
    df = query(f"""
        WITH t AS (SELECT run_id, max(rowid) AS last_row FROM "{table}" WHERE {where} GROUP BY run_id)
        SELECT t.run_id FROM t LEFT JOIN (SELECT run_id, max(created_at) AS created_at FROM runs GROUP BY run_id) r
        USING (run_id) ORDER BY r.created_at DESC NULLS LAST, t.last_row DESC LIMIT 1""")
    if df.empty:
        raise MiningInputError(f"table {table}: no recorded rows ({where}); record some first "
                               f"(goblin opscope digits|minilm|sweep|seq, or goblin audit)")
    return str(df["run_id"][0])


def _sketches(run_id: str) -> pd.DataFrame:
    from goblin_assets.warehouse.db import query

    return query(f"SELECT * FROM sketches WHERE run_id = {_lit(run_id)}")


# ---------------------------------------------------------------- verbs

def cmd_mine(args) -> int:
    from goblin_assets.opscope.miner import mine_patterns

    frames: dict[str, pd.DataFrame] = {}
    if args.workload:
        from goblin_assets.opscope.record import record_workload
        from goblin_assets.runners.local import LocalRunner
        from goblin_assets.runners.workload import load_workload

        sk = record_workload(load_workload(args.workload), LocalRunner(), steps=args.steps,
                             run_id=args.run_id or f"mine-{uuid.uuid4().hex[:8]}")
        frames["sketches"] = sk
    else:
        sk = _sketches(latest_run("sketches", "role IN ('lhs', 'rhs', 'out')", args.run_id))
    pat = mine_patterns(sk)
    frames["patterns"] = pat
    return _emit(args, f"goblin opscope mine: {sk['run_id'].iloc[0]}", pat, frames)


def cmd_infer(args) -> int:
    from goblin_assets.opscope.infer import infer_dynamics, record_minilm_attention

    frames: dict[str, pd.DataFrame] = {}
    try:
        sk = _sketches(latest_run("sketches", "role IN ('probs', 'route')", args.run_id))
    except MiningInputError:
        if args.run_id:
            raise
        console.print("[dim]no softmax/top-k sketches recorded: tapping MiniLM (eager attention) on real text[/dim]")
        sk = record_minilm_attention(run_id=f"infer-{uuid.uuid4().hex[:8]}")
        frames["sketches"] = sk
    pat = infer_dynamics(sk)
    frames["patterns"] = pat
    return _emit(args, f"goblin opscope infer: {sk['run_id'].iloc[0]}", pat, frames)


def cmd_probe(args) -> int:
    from goblin_assets.opscope.probe import load_tensor, minilm_tensors, probe_findings, probe_frame, probe_tensor, \
        save_tensor

    run_id = args.run_id or f"probe-{uuid.uuid4().hex[:8]}"
    if args.file:
        tensors = load_tensor(args.file)
    else:
        console.print("[dim]probing the packaged MiniLM's real weights and activations[/dim]")
        tensors = minilm_tensors()
    if args.dump:
        save_tensor(args.dump, tensors)
        console.print(f"[dim]tensors dumped to {args.dump}[/dim]")
    results = {n: probe_tensor(t, channel_axis=-1 if n.endswith(".input") else 0) for n, t in tensors.items()}
    pat = probe_findings(results, run_id=run_id, workload="minilm" if not args.file else "dump")
    return _emit(args, f"goblin opscope probe: {run_id}", pat, {"probes": probe_frame(results, run_id),
                                                                "patterns": pat})


def cmd_shapes(args) -> int:
    from goblin_assets import goblin_home
    from goblin_assets.opscope.roofline import profile_minilm_trace, roofline_findings, run_device_name, shapes, \
        trace_gemms
    from goblin_assets.warehouse.db import query

    run_id, trace, workload = args.run_id, args.trace, "trace"
    if not trace:
        where = f"run_id = {_lit(run_id)}" if run_id else "TRUE"
        df = query(f"SELECT run_id, workload, trace_path FROM runs WHERE {where} AND trace_path IS NOT NULL "
                   f"ORDER BY created_at DESC LIMIT 1")
        if not df.empty:
            run_id, workload, trace = str(df["run_id"][0]), str(df["workload"][0]), str(df["trace_path"][0])
        elif run_id:
            raise MiningInputError(f"runs: no run {run_id!r} with a trace")
        else:
            console.print("[dim]no profiled run with a trace: profiling one MiniLM forward on real text[/dim]")
            run_id, workload = f"shapes-{uuid.uuid4().hex[:8]}", "minilm"
            trace = str(profile_minilm_trace(goblin_home() / "traces" / f"{run_id}.json"))
    run_id = run_id or f"shapes-{uuid.uuid4().hex[:8]}"
    gemms, gpu = trace_gemms(trace)
    roof = shapes(gemms, run_id=run_id, source=str(trace))
    pat = roofline_findings(roof, run_device_name(gpu), run_id=run_id, workload=workload)
    return _emit(args, f"goblin opscope shapes: {run_id}", pat, {"roofline": roof, "patterns": pat})


def cmd_flow(args) -> int:
    from goblin_assets.opscope.dataflow import flow, flow_findings, minilm_graph

    run_id = args.run_id or f"flow-{uuid.uuid4().hex[:8]}"
    console.print("[dim]exporting the packaged MiniLM (torch.export) on real text[/dim]")
    pat = flow_findings(flow(minilm_graph()), run_id=run_id, workload="minilm")
    return _emit(args, f"goblin opscope flow: {run_id}", pat, {"patterns": pat})


def cmd_graph(args) -> int:
    from goblin_assets.opscope.dataflow import flow, flow_findings, graph

    run_id = args.run_id or f"graph-{uuid.uuid4().hex[:8]}"
    pat = flow_findings(flow(graph(args.file)), run_id=run_id, workload=str(args.file))
    return _emit(args, f"goblin opscope graph: {args.file}", pat, {"patterns": pat})


def cmd_plan(args) -> int:
    from goblin_assets.opscope.miner import mine_patterns
    from goblin_assets.opscope.plan import plan, plan_findings

    sk = _sketches(latest_run("sketches", "role IN ('lhs', 'rhs', 'out')", args.run_id))
    if not args.no_measure:
        console.print("[dim]A/B micro-benchmarks at each site's shape (median of repeats)...[/dim]")
    pl = plan(mine_patterns(sk), sk, measure=not args.no_measure)
    pat = plan_findings(pl)
    return _emit(args, f"goblin opscope plan: {sk['run_id'].iloc[0]}", pat, {"plan": pl, "patterns": pat})


_VERBS = [
    ("mine", "mine recorded sketches: sparse GEMM, int quantisation, LUT, delta, positional, stationarity", cmd_mine),
    ("infer", "attention concentration, sinks and expert load from softmax / top-k taps", cmd_infer),
    ("probe", "host probes on dumped tensors: 2:4, cardinality, effective rank, quantisation error", cmd_probe),
    ("shapes", "roofline of a run's GEMMs: FLOPs, bytes, intensity, bound per device, hot shapes", cmd_shapes),
    ("flow", "repeated dataflow sub-DAGs of MiniLM's exported graph and their fusion candidates", cmd_flow),
    ("graph", "repeated sub-DAGs of a graph dumped as an edge list (id op inputs per line)", cmd_graph),
    ("plan", "actuation plan: exploit, guard, guard stability, estimated and measured speedup per site", cmd_plan),
]


def add_mining_parsers(opscope_subparsers) -> None:
    """Register the mining verbs on the ``goblin opscope`` sub-parsers (each sets ``fn``)."""
    for verb, help_, fn in _VERBS:
        p = opscope_subparsers.add_parser(verb, help=help_, description=help_)
        if verb == "graph":
            p.add_argument("file", help="edge-list graph file (see goblin_assets.opscope.dataflow)")
        p.add_argument("--run-id", default=None,
                       help="run to read (default: the latest matching run) or to label the rows written")
        p.add_argument("--json", action="store_true", help="print the findings as a JSON list")
        if verb == "mine":
            p.add_argument("--workload", default=None, help="record this workload's sketches first (child process)")
            p.add_argument("--steps", type=int, default=3, help="steps to record with --workload")
        if verb == "probe":
            p.add_argument("--file", default=None, help="safetensors file of dumped tensors (default: MiniLM)")
            p.add_argument("--dump", default=None, help="also dump the probed tensors to this safetensors file")
        if verb == "shapes":
            p.add_argument("--trace", default=None, help="a Chrome trace recorded with record_shapes=True")
        if verb == "plan":
            p.add_argument("--no-measure", action="store_true", help="estimates only (no A/B micro-benchmarks)")
        p.set_defaults(fn=fn)


def main(argv=None) -> int:
    """Stand-alone entry (``python -m goblin_assets.cli_opscope_mine VERB ...``) for use before the lead wires it."""
    p = argparse.ArgumentParser(prog="goblin opscope")
    sub = p.add_subparsers(dest="verb", required=True)
    add_mining_parsers(sub)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except GoblinError as exc:
        console.print(f"goblin opscope {args.verb}: error: {exc}", style="bold red", highlight=False, markup=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
