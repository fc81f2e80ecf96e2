"""``goblin memory``: read a memory snapshot recorded elsewhere (``torch.cuda.memory._dump_snapshot``).

    goblin memory SNAPSHOT.pickle [--json] [--html OUT.html] [--no-warehouse]

Nothing is run, and nothing in the pickle is executed (a restricted unpickler
refuses every global a snapshot does not hold; exit 2 with one line).  Tables go
to the warehouse (``memory_snapshots``, ``memory_snapshot_segments``,
``memory_snapshot_frames``, ``memory_snapshot_events``) unless ``--no-warehouse``.
"""
from __future__ import annotations

import argparse
import json
import sys

from goblin_assets.cli_common import console, out


def cmd_memory(args) -> int:
    from goblin_assets.trace.memory_render import snapshot_frames, write_snapshot_html
    from goblin_assets.trace.memory_snapshot import analyze_snapshot, mib
    from goblin_assets.trace.render import frame_table

    rep = analyze_snapshot(args.path)
    if not args.no_warehouse:
        from goblin_assets.warehouse.db import write

        counts = write(snapshot_frames(rep))
        console.print(f"[dim]warehouse: {sum(counts.values())} rows in {len(counts)} tables "
                      f"(snapshot_id {rep.snapshot_id})[/dim]")
    html = write_snapshot_html(rep, args.html) if args.html else None
    if args.json:
        doc = rep.to_json()
        if html:
            doc["html_path"] = str(html)
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    t = rep.totals
    out.print(f"goblin memory: {rep.path.name}: {mib(t['reserved_bytes'])} reserved, {mib(t['allocated_bytes'])} "
              f"allocated, {mib(t['reserved_minus_allocated_bytes'])} reserved minus allocated, largest free block "
              f"{mib(t['largest_free_block_bytes'])}, {t['segments']} segments, {t['oom_events']} OOM events",
              highlight=False, markup=False)
    for line in rep.diagnosis:
        out.print(f"  {line}", highlight=False, markup=False)
    wide = {"ooms": ["stack"], "segments": ["address", "stream"]}  # in --json, --html and the warehouse
    for name in ("ooms", "frames", "categories", "segments"):
        if not rep.tables[name].empty:
            out.print(frame_table(rep.tables[name].drop(columns=wide.get(name, [])), name))
    for k, v in rep.notes.items():
        out.print(f"{k}: {v}", highlight=False, markup=False)
    if html:
        out.print(f"HTML: {html}")
    return 0


def add_memory_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``goblin memory``."""
    m = sub.add_parser("memory", help="read a memory snapshot (torch.cuda.memory._dump_snapshot pickle): live "
                                      "memory by frame and category, fragmentation, the OOM")
    m.add_argument("path", metavar="SNAPSHOT.pickle")
    m.add_argument("--json", action="store_true")
    m.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page (timeline plot)")
    m.add_argument("--no-warehouse", action="store_true", help="do not write the tables to the warehouse")
    m.set_defaults(fn=cmd_memory)
