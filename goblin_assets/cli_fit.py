"""``goblin fit``: will the configured training step fit in memory, by how much, and which levers bring it under.

    goblin fit PATH [--device mi300x|h100|...] [--json] [--no-warehouse]

The configured run is never started: two short probes at micro-batches 2
and 4 (a copy of the user's file) measure the step's memory term by term
(:mod:`goblin_assets.audit.fit`).  ``--device`` takes the budget from the
device table; without it the budget is the runner's (the device's memory,
or on the CPU the address-space cap ``GOBLIN_RUNNER_MEM_CAP_GB`` minus what
is not tensors).  Rows go to the warehouse table ``memory_fit`` unless
``--no-warehouse``.  Exit 0 whether it fits or not; 2 on an error.
"""
from __future__ import annotations

import argparse
import json
import sys

from goblin_assets.cli_common import add_settings_options, console, open_session, out


def cmd_fit(args) -> int:
    from goblin_assets.audit.fit import fit_text
    from goblin_assets.warehouse.frames import memory_fit_frame

    s = open_session(args, with_kb=False)
    ans = s.memory_fit(args.device)
    fit_id = f"{s.audit_id}-fit"
    ans["fit_id"] = fit_id
    if not args.no_warehouse:
        from goblin_assets.warehouse.db import write

        write({"memory_fit": memory_fit_frame(ans, fit_id)})
    if args.json:
        sys.stdout.write(json.dumps(ans, indent=2, default=str) + "\n")
    else:
        out.print(fit_text(ans), highlight=False, markup=False)
    return 0


def add_fit_parser(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("fit", help="will the configured step fit in memory? the terms, the margin, the levers")
    f.add_argument("path", help="workload folder (with workload.yaml) or a training script")
    f.add_argument("--device", default=None, metavar="NAME",
                   help="a part of the device table (mi300x, h100, a100, ...): its memory is the budget "
                        "(default: the runner's device, or the CPU address-space cap)")
    add_settings_options(f, bench=False)
    f.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    f.add_argument("--no-warehouse", dest="no_warehouse", action="store_true",
                   help="do not write the memory_fit rows to the warehouse")
    f.set_defaults(fn=cmd_fit)


__all__ = ["add_fit_parser", "cmd_fit", "console"]
