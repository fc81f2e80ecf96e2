"""Several partitions materialized at once must not fail on DuckDB's single-writer lock nor lose rows."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from goblin_assets.warehouse.db import query

pytestmark = pytest.mark.slow

TINY = Path(__file__).parent / "data" / "tiny_workload"
# The smallest run the harness allows (1 warm-up + 1 profiled step).  The project's executor (the
# multiprocess one, definitions.EXECUTOR) runs each step in its own process; the four runs' warehouse
# writers (profile_run writes `runs` and `kernels`) and the kernels_schema check reading the rows back
# contend for the one DuckDB file.  waste_budget, a second writer per run, is left out: it added three
# step processes per run (~60 s of this test on 2 cores) and no new kind of contention.
RUN_CONFIG = '{"resources": {"runner": {"config": {"profiled_steps": 1, "warmup_steps": 1}}}}'
WRITERS = "workload_source,profile_run"
CHECKS = [("profile_run", "kernels_schema")]


def test_four_partitions_at_once_share_one_warehouse(tmp_path):
    root = tmp_path / "workloads"
    names = [f"tiny_{i}" for i in range(4)]
    for n in names:
        shutil.copytree(TINY, root / n)
    home = tmp_path / "home"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    # the project's instance settings: one warehouse writer at a time across runs
    (dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    env = {**os.environ, "GOBLIN_HOME": str(home), "DAGSTER_HOME": str(dagster_home), "GOBLIN_WORKLOADS": str(root)}
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_dynamic_partitions("workloads", names)
    procs = [subprocess.Popen([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "goblin_assets.definitions",
                               "--select", WRITERS, "--partition", n, "--config-json", RUN_CONFIG],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in names]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for n, p, out in zip(names, procs, outs):
        assert p.returncode == 0, f"{n} failed:\n{out[-4000:]}"
        assert "Executing steps using multiprocess executor" in out, out[-2000:]
        for asset, check in CHECKS:  # the rows each run wrote were all there when it read them back
            assert f"Asset check '{check}' on '{asset}' passed." in out, (n, check)
    db = home / "warehouse.duckdb"
    runs = query("SELECT workload, count(*) n FROM runs GROUP BY workload ORDER BY workload", db)
    assert runs.to_dict("records") == [{"workload": n, "n": 1} for n in names]
    kern = query("SELECT r.workload, count(*) n FROM kernels JOIN runs AS r USING (run_id) GROUP BY 1 ORDER BY 1", db)
    assert len(kern) == 4 and len(set(kern.n)) == 1  # every partition's rows landed in full
