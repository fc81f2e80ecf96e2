"""A writer killed (SIGKILL) in the middle of an ingest leaves all of the run's rows or none."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from goblin_assets.warehouse.db import query

ROWS = 300_000

#: The child: writes one opscope run through goblin_assets.warehouse.db.write (one transaction), with
#: the DuckDB connection wrapped so that it announces the INSERT; ``hold`` sleeps after the INSERT,
#: before COMMIT, so the kill lands on inserted-but-uncommitted rows.
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    from goblin_assets.warehouse import db

    path, n, run_id, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = np.random.default_rng(0)
    df = pd.DataFrame({
        "run_id": run_id, "workload": "sweep", "model": "GEMM", "step": np.arange(n) // 1000, "backend": "cpu",
        "dist": "gaussian", "M": 64, "K": 128, "N": 64, "numel": 8192,
        "site": np.array(["gemm_a", "gemm_b"])[np.arange(n) % 2], "role": np.array(["lhs", "rhs", "out"])[np.arange(n) % 3],
        "stat": "pos_sumsq", "idx": np.arange(n) % 997, "value": rng.standard_normal(n)})

    real_connect = db.duckdb.connect

    class Announcing:
        def __init__(self, con):
            self._con = con
        def __getattr__(self, name):
            return getattr(self._con, name)
        def execute(self, sql, *args):
            if sql.lstrip().upper().startswith("INSERT"):
                print("INSERT-START", flush=True)
                res = self._con.execute(sql, *args)
                print("INSERT-DONE", flush=True)
                if mode == "hold":
                    time.sleep(120)
                return res
            return self._con.execute(sql, *args)

    db.duckdb.connect = lambda *a, **k: Announcing(real_connect(*a, **k))
    db.write({"sketches": df}, path)
    print("COMMITTED", flush=True)
""")


def _writer(db, run_id: str, mode: str, n: int = ROWS) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(n), run_id, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_for(proc: subprocess.Popen, marker: str) -> list[str]:
    seen = []
    while True:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=60)
            raise AssertionError(f"writer exited ({proc.returncode}) before {marker}: {proc.stderr.read()[-2000:]}")
        seen.append(line.strip())
        if line.strip() == marker:
            return seen


def _count(db, run_id: str) -> int:
    return int(query(f"SELECT count(*) AS n FROM sketches WHERE run_id = '{run_id}'", db).n[0])


@pytest.mark.slow
def test_killed_writer_leaves_all_rows_or_none(tmp_path):
    db = tmp_path / "wh.duckdb"
    prior = _writer(db, "prior", "commit", n=3000)           # an earlier run, committed
    assert prior.wait(timeout=300) == 0, prior.stderr.read()
    assert _count(db, "prior") == 3000

    # 1) killed while the INSERT of 300k rows is running (it takes ~0.8 s here)
    p = _writer(db, "mid", "commit")
    _wait_for(p, "INSERT-START")
    time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    rest = p.stdout.read()
    assert p.returncode == -signal.SIGKILL
    n_mid = _count(db, "mid")
    assert n_mid in (0, ROWS)
    if "COMMITTED" not in rest:
        assert n_mid == 0

    # 2) killed after the INSERT returned, before COMMIT: rows were in the table's transaction, none survive
    p = _writer(db, "held", "hold")
    _wait_for(p, "INSERT-DONE")
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert _count(db, "held") == 0

    # 3) not killed: all rows
    p = _writer(db, "whole", "commit")
    assert p.wait(timeout=300) == 0, p.stderr.read()
    assert _count(db, "whole") == ROWS
    assert _count(db, "prior") == 3000                        # the earlier run is untouched throughout
