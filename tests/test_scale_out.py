"""The scaled-out stack for real on one machine: PostgreSQL (Dagster's instance and the DuckLake catalog),
Redis (the Celery broker), two ``dagster-celery`` workers (two pool processes each), and 8 replay audits run at once into the DuckLake,
each pinned to one worker ("GPU host") by the queue its run config names.

Every table holds exactly the rows the same 8 audits write into an embedded DuckDB file (the default
backend, materialized in this process), every step of an audit ran on the worker of its queue (the runs'
event logs in PostgreSQL say which), no run hit a lock, and ``goblin sql`` on the DuckLake sees every
audit.  Every process the stack started is stopped, also when the test fails (goblin_assets/stack.py).
Skipped only when the servers are not installed (``make system-deps`` installs them).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import dagster as dg
import pytest

from goblin_assets import stack
from goblin_assets.audit.corpus import scenarios
from goblin_assets.warehouse.db import query
from goblin_assets.warehouse.tables import TABLES
from tests.conftest import dagster_resources

MISSING = stack.missing_servers()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(MISSING), reason=f"servers not installed: {MISSING} (make system-deps)")]

#: 8 replay scenarios (nothing runs: each audit replays a recording).
PARTITIONS = [f"synthetic/{f.name}" for f in scenarios()][:8]
LOCK_ERROR = re.compile(r"lock on file|conflicting lock|could not set lock|database is locked", re.I)


def _counts(con_query) -> dict[str, int]:
    return {t: int(con_query(f'SELECT count(*) AS n FROM "{t}"').n[0]) for t in TABLES}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Rows per table after the same 8 audits on the embedded DuckDB file (in process)."""
    from goblin_assets.defs.agent import AGENT_ASSETS
    from goblin_assets.defs.audit import AUDIT_ASSETS
    from goblin_assets.defs.partitions import workloads_partitions

    tmp = tmp_path_factory.mktemp("reference")
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp / "home"))
    db = tmp / "wh.duckdb"
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(workloads_partitions.name, PARTITIONS)
    resources = dagster_resources(db)
    assets = [*AUDIT_ASSETS, *AGENT_ASSETS]
    sel = stack.AUDIT_SELECTION.split(",")
    assert dg.materialize(assets, selection=stack.KB_SELECTION.split(","), instance=instance,
                          resources=resources).success
    for p in PARTITIONS:
        assert dg.materialize(assets, selection=sel, partition_key=p, instance=instance, resources=resources).success
    counts = _counts(lambda sql: query(sql, db))
    mp.undo()
    return counts


def _celery_workers_per_run(env: dict[str, str]) -> dict[str, set[str]]:
    """partition -> names of the Celery workers that ran its steps (from the runs' event logs in PostgreSQL)."""
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    try:
        with dg.DagsterInstance.get() as instance:
            out: dict[str, set[str]] = {}
            for run in instance.get_runs():
                part = run.tags.get("dagster/partition")
                if not part:
                    continue
                for rec in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
                    md = rec.dagster_event.engine_event_data.metadata if rec.dagster_event else {}
                    if "Celery worker" in md:
                        out.setdefault(part, set()).add(str(md["Celery worker"].value).split("@")[0])
            return out
    finally:
        mp.undo()


def test_eight_replay_audits_on_two_celery_workers_into_one_ducklake(tmp_path, reference):
    # two steps at a time per worker: a step waits on PostgreSQL and Redis often enough that a second one in
    # the pool keeps the two cores busy (72 s -> 59 s for the 8 audits, 2026-12-06)
    s = stack.start(workers=2, root=tmp_path / "stack", concurrency=2)
    try:
        env = s.env()
        env["GOBLIN_HOME"] = str(tmp_path / "home")
        stack.add_partitions(env, PARTITIONS)
        kb = stack.materialize(env, stack.KB_SELECTION)
        out = kb.communicate(timeout=600)[0]
        assert kb.returncode == 0, out[-4000:]
        # each audit pinned to one "GPU host" (worker i listens on its own queue host<i>)
        queues = {p: stack.host_queue(k % 2) for k, p in enumerate(PARTITIONS)}
        wall, runs = stack.audit_partitions(env, PARTITIONS, queues=queues)
        for p, (rc, text) in runs.items():
            assert rc == 0, f"{p}:\n{text[-4000:]}"
            assert f'to queue "{queues[p]}"' in text, text[-2000:]
            assert not LOCK_ERROR.search(text), f"{p}: {LOCK_ERROR.search(text).group(0)}"
        assert _celery_workers_per_run(env) == {p: {f"goblin{k % 2}"} for k, p in enumerate(PARTITIONS)}
        for i in range(2):  # both workers ran steps, none hit a lock
            log = (s.logs / f"worker{i}.log").read_text(errors="replace")
            assert "succeeded" in log, log[-2000:]
            assert not LOCK_ERROR.search(log)
        # same tables, exactly the rows the embedded file holds after the same audits
        from goblin_assets.warehouse.db import connect, run_query
        from goblin_assets.settings import WarehouseSettings

        ws = WarehouseSettings.from_env(env)
        with connect(settings=ws) as con:
            lake = _counts(lambda sql: run_query(con, sql))
            workloads = sorted(run_query(con, "SELECT workload FROM audits").workload)
        assert lake == reference
        assert lake["audits"] == 8 and lake["runs"] == 8
        assert workloads == sorted(p.split("/")[1] for p in PARTITIONS)
        # goblin sql (a fresh process, backend from the environment) reads the DuckLake
        sql = subprocess.run([sys.executable, "-m", "goblin_assets.cli", "sql", "--json",
                              "SELECT workload FROM audits ORDER BY workload"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert sql.returncode == 0, sql.stderr[-3000:]
        assert [r["workload"] for r in json.loads(sql.stdout)] == workloads
    finally:
        s.stop()
    assert all(p.poll() is not None for p in s.workers + s.procs) and not s.pg_started
