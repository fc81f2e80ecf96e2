"""The profiler's overhead: profiled vs unprofiled step time of the same workload, same run.

    .venv/bin/python benchmarks/profiler_overhead.py [WORKLOAD] [--steps 10] [--warmup 2] [--repeats 3]
                                                    [--device cpu] [--json]

Runs the workload (default ``workloads/digits_mlp``) through the local runner
``repeats`` times in each mode, alternating ``benchmark`` (no profiler) and
``profile`` (torch.profiler with shapes and FLOP counts, as ``profile_run``
uses it) so that machine drift hits both alike.  Each run's step time is the
median of its measured steps (the harness's clock, after the warm-up); the
overhead is the median profiled step time over the median unprofiled one.
Trace export happens after the last step and is not timed.

Prints one line per run, then the ratio (>1: the profiler slows a step).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from goblin_assets import REPO_ROOT
from goblin_assets.errors import GoblinError
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload


def _median_step_s(raw) -> float:
    return statistics.median(p.step_time_s for p in raw.result.per_step)


def measure_overhead(workload_path: str | Path, steps: int = 10, warmup: int = 2, repeats: int = 3,
                     device: str = "cpu", timeout_s: float = 600.0, log=print) -> dict:
    """Alternate unprofiled and profiled runs of one workload; return their step times and the ratio.

    Returns
    -------
    dict
        ``workload``, ``steps``, ``warmup``, ``repeats``, ``unprofiled_step_s``
        and ``profiled_step_s`` (per-run medians, seconds), their medians
        ``unprofiled_median_s`` / ``profiled_median_s``, and ``overhead_ratio``
        (profiled / unprofiled; 1.0 = no overhead).  Source: measured.

    Raises
    ------
    GoblinError
        A run failed (the message names the script and the reason).
    """
    wl = load_workload(workload_path)
    runner = LocalRunner(device=device, timeout_s=timeout_s)
    times: dict[str, list[float]] = {"benchmark": [], "profile": []}
    for rep in range(repeats):
        for mode in ("benchmark", "profile"):
            raw = runner.run(wl, mode, steps=steps, warmup=warmup, label=f"overhead-{mode}-{rep}")
            if not raw.ok:
                raise GoblinError(f"profiler overhead, {mode} run {rep + 1}: {raw.failure}")
            t = _median_step_s(raw)
            times[mode].append(t)
            log(f"repeat {rep + 1}/{repeats} {'profiled  ' if mode == 'profile' else 'unprofiled'} "
                f"median step {t * 1e3:9.2f} ms")
    unprof = statistics.median(times["benchmark"])
    prof = statistics.median(times["profile"])
    return {"workload": wl.name, "steps": steps, "warmup": warmup, "repeats": repeats,
            "unprofiled_step_s": times["benchmark"], "profiled_step_s": times["profile"],
            "unprofiled_median_s": unprof, "profiled_median_s": prof, "overhead_ratio": prof / unprof}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default=str(REPO_ROOT / "workloads" / "digits_mlp"))
    ap.add_argument("--steps", type=int, default=10, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps before them")
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode, alternating")
    ap.add_argument("--device", default="cpu", help="auto | cpu | cuda")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        res = measure_overhead(args.workload, args.steps, args.warmup, args.repeats, args.device, args.timeout,
                               log=(lambda s: print(s, file=sys.stderr)) if args.json else print)
    except GoblinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{res['workload']}: unprofiled {res['unprofiled_median_s'] * 1e3:.2f} ms/step, "
              f"profiled {res['profiled_median_s'] * 1e3:.2f} ms/step (median of {args.repeats} runs x "
              f"{args.steps} steps)")
        print(f"profiler overhead ratio: {res['overhead_ratio']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
