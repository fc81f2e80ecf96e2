"""The ``goblin opscope`` recording commands: run a driver, write its sketch rows, print a summary.

    goblin opscope sweep  [--steps N] [--shapes MxKxN,...] [--parquet PATH] [--json]
    goblin opscope seq    [--steps N] [--parquet PATH] [--json]
    goblin opscope digits [--steps N] [--batch B] [--mnist DIR] [--no-train] [--parquet PATH] [--json]
    goblin opscope minilm [--steps N] [--batch B] [--seq-len L] [--parquet PATH] [--json]

Every verb writes the run's rows to the warehouse's ``sketches`` table in one
transaction (``$GOBLIN_HOME/warehouse.duckdb``), optionally also to Parquet.
With ``--json`` it prints one object with ``run_id``, ``rows`` (rows written),
``sites``, ``gate_passed`` and ``summary`` (per site and role: density, absmax,
mean).  A failed correctness gate or a bad input is one error line (exit 2).
"""
from __future__ import annotations

import argparse
import json
import sys

from rich.table import Table

from goblin_assets.cli_common import console, out



def _shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    try:
        shapes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: expected MxKxN[,MxKxN...]") from None
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: expected MxKxN[,MxKxN...] with positive sizes")
    return shapes


def cmd_opscope_record(args) -> int:
    """Run one driver (``args.driver``), write its rows, print the summary or the JSON object."""
    from goblin_assets.opscope.drivers import run_driver, write_result

    opts = {"steps": args.steps, "device": args.device}
    for k in ("shapes", "batch", "mnist", "seq_len"):
        if getattr(args, k, None) is not None:
            opts[k] = getattr(args, k)
    if getattr(args, "no_train", False):
        opts["train"] = False
    with console.status(f"goblin opscope {args.driver}: recording") as status:
        res = run_driver(args.driver, **opts, progress=lambda line: status.update(f"goblin opscope {line}"))
        status.update(f"goblin opscope {args.driver}: writing {len(res.rows)} rows")
        n = write_result(res, parquet=args.parquet)
    if args.json:
        sys.stdout.write(json.dumps(res.to_json(rows_written=n), indent=2, default=str) + "\n")
        return 0
    t = Table(title=f"goblin opscope {args.driver}: {res.model}")
    for c in ("dist", "site", "role", "density", "absmax", "mean"):
        t.add_column(c, overflow="fold", no_wrap=c != "site")
    for r in res.summary.itertuples(index=False):
        t.add_row(r.dist, r.site, r.role, *("" if v != v else f"{v:.4g}" for v in (r.density, r.absmax, r.mean)))
    out.print(t)
    for note in res.notes:
        out.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    out.print(f"run {res.run_id}: {n} rows in warehouse table sketches, {len(res.sites)} sites, "
              f"correctness gate {'passed' if res.gate_passed else 'FAILED'} "
              f"({len(res.gates)} checks), {res.wall_s:.1f} s" + (f"; parquet: {args.parquet}" if args.parquet else ""),
              highlight=False)
    return 0


def add_opscope_parser(subparsers) -> argparse._SubParsersAction:
    """Register ``goblin opscope sweep|seq|digits|minilm`` on the top-level ``subparsers``.

    Returns the ``opscope`` sub-command action, so that other opscope verbs
    (mining, probes) can be added to the same command.
    """
    op = subparsers.add_parser("opscope", help="record and mine tensor sketches of real models (opscope)")
    verbs = op.add_subparsers(dest="opscope_cmd", required=True)
    helps = {
        "sweep": "one GEMM per shape x 7 input distributions, gate on every site",
        "seq": "decode-like stepped sequence: fixed weights, drifting activations",
        "digits": "MLP trained on real handwritten digits (scikit-learn, or MNIST with --mnist)",
        "minilm": "pretrained all-MiniLM-L6-v2 on standard-library docstrings, eager attention",
    }
    for name, text in helps.items():
        v = verbs.add_parser(name, help=text)
        v.add_argument("--steps", type=int, default=None, help="recorded steps (driver default when omitted)")
        v.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
        v.add_argument("--parquet", default=None, metavar="PATH", help="also write the rows to this Parquet file")
        v.add_argument("--json", action="store_true", help="print one JSON object")
        if name == "sweep":
            v.add_argument("--shapes", type=_shapes, default=None, help="MxKxN[,MxKxN...]")
        if name in ("digits", "minilm"):
            v.add_argument("--batch", type=int, default=None)
        if name == "digits":
            v.add_argument("--mnist", default=None, metavar="DIR", help="torchvision-format MNIST folder (IDX files)")
            v.add_argument("--no-train", action="store_true", help="optimizer off: weights stay fixed")
        if name == "minilm":
            v.add_argument("--seq-len", type=int, default=None)
        v.set_defaults(fn=cmd_opscope_record, driver=name)
    return verbs
