"""Several partitions materialized at once must not fail on DuckDB's single-writer lock nor lose rows."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from goblin_assets.warehouse.db import query

pytestmark = pytest.mark.slow

TINY = Path(__file__).parent / "data" / "tiny_workload"
RUNNER_CONFIG = '{"resources": {"runner": {"config": {"profiled_steps": 2, "warmup_steps": 1}}}}'
WRITERS = "workload_source,profile_run,waste_budget"  # two warehouse writers per run, each step its own process


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
    subprocess.run([sys.executable, "-c", "import dagster as dg\n"
                    f"dg.DagsterInstance.get().add_dynamic_partitions('workloads', {names!r})"],
                   env=env, check=True, timeout=120)
    procs = [subprocess.Popen([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "goblin_assets.definitions",
                               "--select", WRITERS, "--partition", n, "--config-json", RUNNER_CONFIG],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in names]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for n, p, out in zip(names, procs, outs):
        assert p.returncode == 0, f"{n} failed:\n{out[-4000:]}"
    db = home / "warehouse.duckdb"
    runs = query("SELECT workload, count(*) n FROM runs GROUP BY workload ORDER BY workload", db)
    assert runs.to_dict("records") == [{"workload": n, "n": 1} for n in names]
    waste = query("SELECT workload, count(*) n FROM waste_budget GROUP BY workload ORDER BY workload", db)
    assert list(waste.n) == [6, 6, 6, 6]
    kern = query("SELECT r.workload, count(*) n FROM kernels JOIN runs AS r USING (run_id) GROUP BY 1 ORDER BY 1", db)
    assert len(kern) == 4 and len(set(kern.n)) == 1  # every partition's rows landed in full
