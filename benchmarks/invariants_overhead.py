"""What the run-time invariant checks cost a profiled run (issue 28: under 10 % of the profile step's time).

    .venv/bin/python benchmarks/invariants_overhead.py [WORKLOAD ...] [--steps 10] [--warmup 2] [--repeats 2]
                                                      [--json]

For each workload (default: both shipped ones, ``workloads/digits_mlp`` and
``workloads/minilm_lora_cls``) this runs the harness in ``profile`` mode
``repeats`` times with the checks on and off (``GOBLIN_INVARIANTS=0``),
alternating so that machine drift hits both alike, and reports:

* ``check_s``: the seconds the recorder spent in its own code (its
  ``cost_s``: perf_counter around every hook; the forward capture, the float64
  recomputation and the gradient and update samples all happen in the last
  warm-up step, never inside a timed step), measured;
* ``profile_wall_s``: the child's wall time of the whole profile run
  (start-up, warm-up, the profiled steps, trace export), measured;
* ``share_of_profile``: ``check_s / profile_wall_s`` (median over repeats);
* ``step_ratio``: median profiled step time with the checks over without (>1:
  the timed steps got slower; the machine's noise is in it).

Prints one line per run and one summary line per workload.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from goblin_assets import REPO_ROOT
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload

DEFAULT = [REPO_ROOT / "workloads" / "digits_mlp", REPO_ROOT / "workloads" / "minilm_lora_cls"]


def _run(workload, on: bool, steps: int, warmup: int) -> dict:
    old = os.environ.get("GOBLIN_INVARIANTS")
    os.environ["GOBLIN_INVARIANTS"] = "1" if on else "0"
    try:
        raw = LocalRunner(device="cpu", timeout_s=1200).run(workload, "profile", steps=steps, warmup=warmup)
    finally:
        os.environ.pop("GOBLIN_INVARIANTS") if old is None else os.environ.__setitem__("GOBLIN_INVARIANTS", old)
    if not raw.ok:
        raise SystemExit(f"{workload.name}: {raw.failure}")
    inv = raw.result.invariants
    return {"on": on, "wall_s": raw.wall_s, "step_s": statistics.median(p.step_time_s for p in raw.result.per_step),
            "check_s": inv["cost_s"] if inv else 0.0}


def measure(path: Path, steps: int, warmup: int, repeats: int, log=print) -> dict:
    """Alternate runs with and without the checks; the medians and ratios described in the module docstring."""
    wl = load_workload(path)
    runs = []
    for i in range(repeats):
        for on in (True, False) if i % 2 == 0 else (False, True):
            r = _run(wl, on, steps, warmup)
            runs.append(r)
            log(f"{wl.name:16s} checks {'on ' if on else 'off'} wall {r['wall_s']:7.2f} s  "
                f"step {r['step_s'] * 1e3:8.1f} ms  checks {r['check_s']:.3f} s")
    on = [r for r in runs if r["on"]]
    off = [r for r in runs if not r["on"]]
    return {"workload": wl.name, "steps": steps, "warmup": warmup, "repeats": repeats,
            "check_s": statistics.median(r["check_s"] for r in on),
            "profile_wall_s": statistics.median(r["wall_s"] for r in on),
            "share_of_profile": statistics.median(r["check_s"] / r["wall_s"] for r in on),
            "check_s_per_profiled_step_over_step_s": statistics.median(r["check_s"] / steps / r["step_s"] for r in on),
            "step_ratio": statistics.median(r["step_s"] for r in on) / statistics.median(r["step_s"] for r in off),
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = [measure(p, args.steps, args.warmup, args.repeats) for p in args.workloads]
    for r in out:
        print(f"{r['workload']}: checks {r['check_s']:.3f} s = {r['share_of_profile']:.1%} of the profile run "
              f"({r['profile_wall_s']:.1f} s); per profiled step {r['check_s_per_profiled_step_over_step_s']:.2%} of "
              f"a step; timed step with/without checks {r['step_ratio']:.3f}x")
    if args.json:
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
