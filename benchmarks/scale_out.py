"""Wall time of 8 replay audits started at once: the embedded DuckDB file vs a DuckLake with 2 and 4 Celery workers.

    .venv/bin/python benchmarks/scale_out.py [--partitions 8]

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
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from goblin_assets import stack  # noqa: E402
from goblin_assets.audit.corpus import scenarios  # noqa: E402

FILE_INSTANCE = "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n"


def _run(env: dict[str, str], parts: list[str]) -> float:
    stack.add_partitions(env, parts)
    kb = stack.materialize(env, stack.KB_SELECTION)
    out = kb.communicate(timeout=900)[0]
    if kb.returncode:
        raise SystemExit(f"kb index failed:\n{out[-3000:]}")
    wall, runs = stack.audit_partitions(env, parts)
    bad = {p: text[-2000:] for p, (rc, text) in runs.items() if rc}
    if bad:
        raise SystemExit(f"failed audits: {sorted(bad)}\n{next(iter(bad.values()))}")
    return wall


def file_arm(root: Path, parts: list[str]) -> float:
    home = root / "home"
    (home / "dagster").mkdir(parents=True)
    (home / "dagster" / "dagster.yaml").write_text(FILE_INSTANCE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOBLIN_WAREHOUSE", "GOBLIN_DUCKLAKE",
                                                                    "GOBLIN_EXECUTOR"))}
    env.update(GOBLIN_HOME=str(home), DAGSTER_HOME=str(home / "dagster"))
    return _run(env, parts)


def lake_arm(root: Path, parts: list[str], workers: int) -> float:
    s = stack.start(workers=workers, root=root / "stack")
    try:
        env = s.env()
        env["GOBLIN_HOME"] = str(root / "home")
        return _run(env, parts)
    finally:
        s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=8)
    a = ap.parse_args()
    missing = stack.missing_servers()
    if missing:
        print(f"cannot run: missing {missing} (make system-deps)")
        return 2
    parts = [f"synthetic/{f.name}" for f in scenarios()][:a.partitions]
    rows = []
    with tempfile.TemporaryDirectory(prefix="goblin-scale-") as tmp:
        t = Path(tmp)
        rows.append(("file (pool limit 1, multiprocess executor)", file_arm(t / "file", parts)))
        for w in (2, 4):
            rows.append((f"ducklake, {w} celery workers", lake_arm(t / f"lake{w}", parts, w)))
    base = rows[0][1]
    print(f"{len(parts)} replay audits started at once, {os.cpu_count()} cores")
    print(f"{'arm':46s} {'wall s':>8s} {'vs file':>8s}")
    for name, wall in rows:
        print(f"{name:46s} {wall:8.1f} {base / wall:7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
