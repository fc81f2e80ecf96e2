"""The ``goblin opscope`` mining verbs: mine, infer, probes, roofline, dataflow, plan.

    goblin opscope mine     [--run-id ID] [--workload PATH [--steps N]] [--json]
    goblin opscope infer    [--run-id ID] [--json]
    goblin opscope probes   [--run-id ID] [--file TENSORS.safetensors] [--dump PATH] [--json]   (alias: probe)
    goblin opscope roofline [--run-id ID] [--trace TRACE.json] [--json]                       (alias: shapes)
    goblin opscope dataflow [FILE] [--run-id ID] [--json]                                     (aliases: flow, graph)
    goblin opscope plan     [--run-id ID] [--no-measure] [--e2e] [--json]

Each verb calls the function of the same name in
:mod:`goblin_assets.opscope.mining` (the driver the Dagster mining assets
call too; old verb names are aliases, see ``docs/naming.md``), writes what it
returns to the warehouse in one transaction and prints the findings.

``--run-id`` selects the recorded run to read (default: the latest matching
run, :func:`goblin_assets.opscope.mining.latest_run`); where a verb makes its
own data (probes, dataflow, roofline of a ``--trace``) it labels the rows it
writes.  Without recorded data the verbs fall back to real data they can make
here: ``infer`` taps the packaged MiniLM on real text, ``roofline`` profiles a
MiniLM forward, ``probes`` and ``dataflow`` read MiniLM's real weights and
exported graph.  With ``--json`` each verb prints a list of finding objects:
``site``, ``role``, ``finding``, ``score``, ``evidence`` (the numbers behind
it) and ``run_id``.  A bad input (unknown run id, nothing recorded) is one
error line naming the table and the fix (exit 2).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from rich.table import Table

from goblin_assets.cli_common import console, out
from goblin_assets.errors import GoblinError
from goblin_assets.opscope import mining



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


def _log(line: str) -> None:
    console.print(f"[dim]{line}[/dim]", highlight=False)


def _emit(args, mined: mining.Mined) -> int:
    """Write ``mined.frames`` to the warehouse (one transaction) and print the findings (table or ``--json``)."""
    from goblin_assets.warehouse.db import write

    counts = write(mined.frames)
    _log(f"warehouse: {sum(counts.values())} rows ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    if args.json:
        sys.stdout.write(json.dumps(mined.findings_json(), indent=2, default=str) + "\n")
        return 0
    t = Table(title=f"goblin opscope {mined.title}")
    for c in ("site", "role", "finding", "score", "evidence"):
        t.add_column(c, overflow="fold")
    for f in mined.findings_json():
        t.add_row(f["site"], f["role"], f["finding"], f"{f['score']:.3g}", _brief(f["evidence"]))
    out.print(t)
    return 0


# ---------------------------------------------------------------- verbs: arguments -> one driver call

def _mine(args) -> mining.Mined:
    from goblin_assets.warehouse.db import query

    if not args.workload:
        return mining.mine(query, args.run_id, log=_log)
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.runners.workload import load_workload
    from goblin_assets.settings import AuditSettings

    # the audit session's own tensor_sketches stage (settings from GOBLIN_RUNNER_*, steps from --steps)
    _log(f"mine: recording {args.workload}'s matmul sketches ({args.steps} steps, child process)")
    s = AuditSession.open(load_workload(args.workload), settings=AuditSettings.from_env(sketch_steps=args.steps),
                          audit_id=args.run_id or mining.label("mine"), log=_log)
    return mining.mine(query, sketches=s.tensor_sketches(), log=_log)


def _infer(args) -> mining.Mined:
    from goblin_assets.warehouse.db import query

    return mining.infer(query, args.run_id, log=_log)


def _probes(args) -> mining.Mined:
    return mining.probes(args.run_id or mining.label("probes"), file=args.file, dump=args.dump, log=_log)


def _roofline(args) -> mining.Mined:
    from goblin_assets.warehouse.db import query

    return mining.roofline(query, args.run_id, trace=args.trace, log=_log)


def _dataflow(args) -> mining.Mined:
    return mining.dataflow(args.run_id or mining.label("dataflow"), file=args.file, log=_log)


def _plan(args) -> mining.Mined:
    from goblin_assets.warehouse.db import query

    return mining.plan(query, args.run_id, measure=not args.no_measure, log=_log, e2e=args.e2e)


def _options(verb: str, p: argparse.ArgumentParser) -> None:
    """The verb's own options beyond ``--run-id`` and ``--json``."""
    if verb == "mine":
        p.add_argument("--workload", default=None, help="record this workload's sketches first (child process)")
        p.add_argument("--steps", type=int, default=3, help="steps to record with --workload")
    elif verb == "probes":
        p.add_argument("--file", default=None, help="safetensors file of dumped tensors (default: MiniLM)")
        p.add_argument("--dump", default=None, help="also dump the probed tensors to this safetensors file")
    elif verb == "roofline":
        p.add_argument("--trace", default=None, help="a Chrome trace recorded with record_shapes=True")
    elif verb == "dataflow":
        p.add_argument("file", nargs="?", default=None,
                       help="edge-list graph file (see goblin_assets.opscope.dataflow; default: MiniLM's graph)")
    elif verb == "plan":
        p.add_argument("--no-measure", action="store_true", help="estimates only (no A/B micro-benchmarks)")
        p.add_argument("--e2e", action="store_true",
                       help="also time each kept candidate on the whole forward (and a training step where it "
                            "applies) of the packaged workload's model, with a 95%% interval (slow: ~30 s each)")


#: Canonical verb (= the driver function's name) -> (old names kept as aliases, help, arguments -> Mined).
VERBS: dict[str, tuple[tuple[str, ...], str, Callable[[argparse.Namespace], mining.Mined]]] = {
    "mine": ((), "mine recorded sketches: sparse GEMM, int quantisation, LUT, delta, positional, stationarity", _mine),
    "infer": ((), "attention concentration, sinks and expert load from softmax / top-k taps", _infer),
    "probes": (("probe",), "host probes on dumped tensors: 2:4, cardinality, effective rank, quantisation error",
               _probes),
    "roofline": (("shapes",), "roofline of a run's GEMMs: FLOPs, bytes, intensity, bound per device, hot shapes",
                 _roofline),
    "dataflow": (("flow", "graph"), "repeated dataflow sub-DAGs (of MiniLM's exported graph, or of an edge-list "
                                    "FILE) and their fusion candidates", _dataflow),
    "plan": ((), "actuation plan: exploit, guard, guard stability, estimated and measured speedup per site", _plan),
}


def add_mining_parsers(opscope_subparsers) -> None:
    """Register the mining verbs (and their old names as aliases) on the ``goblin opscope`` sub-parsers.

    Each sets ``fn`` (arguments -> exit code) and ``miner`` (the canonical verb).
    """
    for verb, (aliases, help_, run) in VERBS.items():
        p = opscope_subparsers.add_parser(verb, aliases=list(aliases), help=help_, description=help_)
        _options(verb, p)
        p.add_argument("--run-id", default=None,
                       help="run to read (default: the latest matching run) or to label the rows written")
        p.add_argument("--json", action="store_true", help="print the findings as a JSON list")
        p.set_defaults(fn=lambda args, run=run: _emit(args, run(args)), miner=verb)


def main(argv=None) -> int:
    """Stand-alone entry (``python -m goblin_assets.cli_opscope_mine VERB ...``); ``goblin opscope VERB`` is the same."""
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
