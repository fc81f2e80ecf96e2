"""``goblin trace``: analyse a trace recorded elsewhere (Kineto or rocprofv3), or compare two.

    goblin trace PATH [--json] [--html OUT] [--no-warehouse]
    goblin trace A B [--json] [--html OUT]     # diff: categories and ops matched across the two
    goblin trace DIR [--json] [--no-warehouse]  # the ranks of one job: every trace in DIR
    goblin trace --ranks R0 R1 ... [--json]     # the same, for files named one by one

Nothing is run.  Tables go to the warehouse (``trace_*``, plus the ``runs`` /
``waste_budget`` / ``kernels`` rows of the trace's RunMetrics) unless
``--no-warehouse``.
"""
from __future__ import annotations

import argparse
import json
import sys

from goblin_assets.cli_common import console, out


def analyse_traces(paths: list[str], progress=None, warehouse: bool = True) -> tuple[list, dict | None]:
    """(the TraceReports of one or two traces, their diff or None); the tables written to the warehouse unless
    ``warehouse`` is False.  What ``goblin trace`` and the ``trace`` tool of ``goblin mcp`` do.

    Raises GoblinError for more than two paths, and the trace readers' TraceError for a bad trace.
    """
    from goblin_assets.errors import GoblinError
    from goblin_assets.trace.analysis import analyze_trace, trace_frames
    from goblin_assets.trace.diff import category_diff, op_diff

    if not 1 <= len(paths) <= 2:
        raise GoblinError(f"goblin trace takes one trace, or two to compare, or a folder of ranks (or --ranks "
                          f"FILES); got {len(paths)} files")
    progress = progress or (lambda s: console.print(f"[dim]{s}[/dim]", highlight=False))
    reps = [analyze_trace(p, progress=progress) for p in paths]
    diff = None
    if len(reps) == 2:
        diff = {"categories": category_diff(reps[0].events, reps[1].events),
                "ops": op_diff(reps[0].events, reps[1].events)}
    if warehouse:
        from goblin_assets.warehouse.db import write

        counts = write(_merge([trace_frames(r) for r in reps]))
        progress(f"warehouse: {sum(counts.values())} rows in {len(counts)} tables "
                 f"(trace_id {', '.join(r.trace_id for r in reps)})")
    return reps, diff


def trace_json(reps: list, diff: dict | None) -> dict:
    """The ``goblin trace --json`` object: one trace's analyses, or ``a``, ``b`` and their ``diff``."""
    if len(reps) == 1:
        return reps[0].to_json()
    return {"a": reps[0].to_json(), "b": reps[1].to_json(),
            "diff": {k: json.loads(v.to_json(orient="records")) for k, v in diff.items()}}


def cmd_trace(args) -> int:
    from pathlib import Path

    from goblin_assets.trace.render import findings_table, frame_table, write_trace_html

    if args.ranks or any(Path(p).is_dir() for p in args.paths):
        return _cmd_ranks(args)
    reps, diff = analyse_traces(args.paths, warehouse=not args.no_warehouse)
    rep = reps[0]
    html = write_trace_html(rep, args.html, diff, reps[1] if len(reps) == 2 else None) if args.html else None
    if args.json:
        doc = trace_json(reps, diff)
        if html:
            doc["html_path"] = str(html)
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    if diff is not None:
        out.print(frame_table(diff["categories"], f"categories: A={reps[0].path.name} B={reps[1].path.name}"))
        cols = ["op", "input_dims", "a_gpu_time_per_step_us", "b_gpu_time_per_step_us", "time_ratio", "matched"]
        out.print(frame_table(diff["ops"][cols], "ops matched by name and input shapes (GPU µs per step; kernels "
                              "in --json/--html)", max_rows=15))
    for r in reps:
        out.print(findings_table(r))
        for name in ("temporal", "kernel_categories", "critical_path", "recompute"):
            if not r.tables[name].empty:
                out.print(frame_table(r.tables[name], f"{name} ({r.path.name})"))
        st = r.tables.get("steps")
        if st is not None and not st.empty and st["outlier"].any():
            out.print(frame_table(st.loc[st["outlier"], ["step", "step_us", "ratio_to_median", "cause", "events"]],
                                  f"outlier steps, past 1.5x the median step ({r.path.name})"))
        wb = ", ".join(f"{k} {b.seconds * 1e3:.2f} ms ({b.status})" for k, b in r.metrics.waste_budget.items())
        out.print(f"waste budget per step ({r.metrics.provenance.kind}): {wb}", highlight=False)
        out.print(f"[dim]{r.path.name}: analysed in {r.elapsed_s:.2f} s; nothing was run[/dim]")
    if html:
        out.print(f"HTML: {html}")
    return 0


def _cmd_ranks(args) -> int:
    """``goblin trace DIR`` / ``--ranks FILES``: the ranks of one job side by side (trace/ranks.py)."""
    from goblin_assets.trace.ranks import analyze_ranks, ranks_frames
    from goblin_assets.trace.render import frame_table

    res = analyze_ranks(args.paths)
    job_id = None
    if not args.no_warehouse:
        from goblin_assets.warehouse.db import write

        frames = ranks_frames(res, args.paths)
        job_id = frames["trace_runs"]["trace_id"].iloc[0]
        counts = write(frames)
        console.print(f"[dim]warehouse: {sum(counts.values())} rows in {len(counts)} tables (trace_id {job_id})"
                      "[/dim]")
    if args.json:
        doc = {"trace_id": job_id, "ranks": json.loads(res["ranks"].to_json(orient="records")),
               "collectives": json.loads(res["collectives"].to_json(orient="records")),
               "findings": [f.model_dump() for f in res["findings"]]}
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    for f in res["findings"]:
        out.print(f"[{f.severity}] {f.message}", highlight=False)
    cols = ["rank", "file", "step_us", "compute_us", "collective_us", "collective_wait_us", "loader_us", "host_us",
            "straggler", "cause"]
    out.print(frame_table(res["ranks"][cols], f"ranks ({len(res['ranks'])} traces; µs per step, median)"))
    coll = res["collectives"][["seq", "collective", "step", "size_bytes", "latency_us", "skew_us", "last_rank",
                               "algbw_GBps", "busbw_GBps", "busbw_pct_of_link"]]
    out.print(frame_table(coll, "collectives (latency: shortest across ranks; skew: spread of starts)", max_rows=20))
    return 0


def _merge(frames: list[dict]) -> dict:
    import pandas as pd

    keys = {k for f in frames for k in f}
    return {k: pd.concat([f[k] for f in frames if k in f], ignore_index=True) for k in keys}


def add_trace_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``goblin trace``."""
    t = sub.add_parser("trace", help="analyse a recorded GPU trace (Kineto .json/.json.gz, rocprofv3 JSON/CSV), "
                                     "or diff two")
    t.add_argument("paths", nargs="+", metavar="PATH",
                   help="one trace, or two to compare (A then B), or a folder holding one trace per rank")
    t.add_argument("--ranks", action="store_true", help="the PATHs are the ranks of one job (per-rank step "
                                                        "time, straggler, collectives across ranks)")
    t.add_argument("--json", action="store_true")
    t.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page")
    t.add_argument("--no-warehouse", action="store_true", help="do not write the tables to the warehouse")
    t.set_defaults(fn=cmd_trace)
