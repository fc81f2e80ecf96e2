"""Wall time of 8 replay audits started at once: the embedded DuckDB file vs a DuckLake with 2 and 4 Celery workers.

    .venv/bin/python benchmarks/scale_out.py [--partitions 8] [--repeats 1]

All three arms in the same run, each on a fresh instance and warehouse, each timed from the start of the
8 ``dagster asset materialize`` processes to the exit of the last (the knowledge-base index is built
before the clock starts):

* ``file``: the default deployment: the project's multiprocess executor, the Dagster instance in SQLite,
  the warehouse writers in the pool ``warehouse_writer`` with limit 1 (the Makefile's dagster.yaml);
* ``ducklake-2`` / ``ducklake-4``: ``make stack``'s deployment: the instance in PostgreSQL, every step a
  Celery task run by 2 or 4 ``dagster-celery`` workers, the warehouse a DuckLake (no pool).

The replays run nothing: the time is Dagster's (run and step start, event log) and the warehouse's.
On a 2-core machine the 8 run processes and the workers share two cores, which bounds what more
workers can gain.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from goblin_assets import stack  # noqa: E402
from goblin_assets.audit.corpus import scenarios  # noqa: E402

FILE_INSTANCE = "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n"


#: Default seconds an arm may take before it is reported as not finished (``--timeout``).
TIMEOUT_S = 1200.0


def _run(env: dict[str, str], parts: list[str], timeout: float) -> float:
    """Wall seconds of the audits of ``parts`` started together; ``inf`` when they did not finish in ``timeout`` s."""
    stack.add_partitions(env, parts)
    kb = stack.materialize(env, stack.KB_SELECTION)
    out = kb.communicate(timeout=900)[0]
    if kb.returncode:
        raise SystemExit(f"kb index failed:\n{out[-3000:]}")
    try:
        wall, runs = stack.audit_partitions(env, parts, timeout=timeout)
    except subprocess.TimeoutExpired:   # audit_partitions stopped every run it started
        return float("inf")
    bad = {p: text[-2000:] for p, (rc, text) in runs.items() if rc}
    if bad:
        raise SystemExit(f"failed audits: {sorted(bad)}\n{next(iter(bad.values()))}")
    return wall


def file_arm(root: Path, parts: list[str], timeout: float) -> float:
    home = root / "home"
    (home / "dagster").mkdir(parents=True)
    (home / "dagster" / "dagster.yaml").write_text(FILE_INSTANCE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOBLIN_WAREHOUSE", "GOBLIN_DUCKLAKE",
                                                                    "GOBLIN_EXECUTOR"))}
    env.update(GOBLIN_HOME=str(home), DAGSTER_HOME=str(home / "dagster"))
    return _run(env, parts, timeout)


def lake_arm(root: Path, parts: list[str], workers: int, timeout: float) -> float:
    s = stack.start(workers=workers, root=root / "stack")
    try:
        env = s.env()
        env["GOBLIN_HOME"] = str(root / "home")
        return _run(env, parts, timeout)
    finally:
        s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--arms", default="file,ducklake-2,ducklake-4",
                    help="comma-separated subset of file, ducklake-2, ducklake-4 (the first is the baseline)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds before an arm counts as not finished")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of the three arms (the order rotating each round); >1 prints each arm's range")
    a = ap.parse_args()
    missing = stack.missing_servers()
    if missing:
        print(f"cannot run: missing {missing} (make system-deps)")
        return 2
    parts = [f"synthetic/{f.name}" for f in scenarios()][:a.partitions]
    every = {"file": ("file (pool limit 1, multiprocess executor)", lambda t: file_arm(t, parts, a.timeout)),
             "ducklake-2": ("ducklake, 2 celery workers", lambda t: lake_arm(t, parts, 2, a.timeout)),
             "ducklake-4": ("ducklake, 4 celery workers", lambda t: lake_arm(t, parts, 4, a.timeout))}
    arms = dict(every[k.strip()] for k in a.arms.split(","))
    names = list(arms)
    walls: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            with tempfile.TemporaryDirectory(prefix="goblin-scale-") as tmp:
                walls[name].append(arms[name](Path(tmp)))
            print(f"round {r + 1}/{a.repeats}: {name}: {walls[name][-1]:.1f} s", flush=True)
    base = statistics.median(walls[names[0]])   # inf when the baseline did not finish: the ratios read "> ..."
    print(f"{len(parts)} replay audits started at once, {os.cpu_count()} cores, {a.repeats} round(s)")
    print(f"{'arm':46s} {'median s':>9s} {'range s':>13s} {'file/arm':>9s} {'range':>13s}")
    for name in names:
        w = walls[name]
        med = statistics.median(w)
        ratios = [f / x for f in walls[names[0]] for x in w]  # every pairing of file and arm rounds
        rng = f"{min(w):.1f}-{max(w):.1f}" if len(w) > 1 else "one run"
        rr = f"{min(ratios):.2f}-{max(ratios):.2f}x" if len(w) > 1 else "one run"
        vs = (f"> {a.timeout / med:.2f}x" if base == float("inf") and med != float("inf") else f"{base / med:.2f}x")
        print(f"{name:46s} {med:9.1f} {rng:>13s} {vs:>9s} {rr:>13s}"
              + (f"   (not finished in {a.timeout:.0f} s)" if med == float("inf") else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
