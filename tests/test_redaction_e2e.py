"""Secrets in a user's script never reach the warehouse, the report, the logs or Dagster metadata."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from goblin_assets.warehouse.db import connect
from goblin_assets.warehouse.tables import TABLES
from tests.conftest import WORKLOADS
from tests.test_redact import SECRETS

pytestmark = pytest.mark.slow


def _seeded_workload(root: Path) -> Path:
    """digits_mlp with 20 secrets as comments right after the imports (so they sit in the diff's context)."""
    wl = root / "seeded"
    wl.mkdir(parents=True)
    src = (WORKLOADS / "digits_mlp" / "train.py").read_text()
    lines = [("# " + ln) for _, line in SECRETS for ln in line.splitlines()]
    anchor = "from torch.utils.data import DataLoader, Dataset\n"
    (wl / "train.py").write_text(src.replace(anchor, anchor + "\n".join(lines) + "\n"))
    (wl / "workload.yaml").write_text((WORKLOADS / "digits_mlp" / "workload.yaml").read_text())
    return wl


def _assert_clean(where: str, text: str) -> None:
    for secret, _ in SECRETS:
        assert secret not in text, f"{secret!r} leaked into {where}"


def test_audit_outputs_are_redacted(tmp_path):
    wl = _seeded_workload(tmp_path / "workloads")
    home = tmp_path / "home"
    env = {**os.environ, "GOBLIN_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "goblin_assets.cli", "audit", str(wl), "--steps", "3",
                        "--bench-steps", "6", "--repeats", "1", "--json"], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["rules"], "the loader rule should fire and produce a diff with the secrets in its context"
    _assert_clean("goblin audit --json", r.stdout)
    _assert_clean("goblin audit logs (stderr)", r.stderr)
    report = Path(out["report_path"])
    _assert_clean("report.md", report.read_text())
    _assert_clean("report.html", (report.parent / "report.html").read_text())
    with connect(home / "warehouse.duckdb") as con:
        for table in TABLES:
            _assert_clean(f"warehouse table {table}", con.execute(f'SELECT * FROM "{table}"').df().to_csv())
    # the exact diff stays usable on this machine
    exact = (report.parent / "patch.diff").read_text()
    assert "hf_Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVb" in exact
    subprocess.run(["patch", "-p1", "--dry-run", "--quiet"], input=exact, text=True, cwd=wl, check=True)


def test_dagster_metadata_and_logs_are_redacted(tmp_path, monkeypatch):
    wl = _seeded_workload(tmp_path / "workloads")
    monkeypatch.setenv("GOBLIN_WORKLOADS", str(wl.parent))
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    from goblin_assets.definitions import defs

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("workloads", ["seeded"])
    res = dg.materialize([*defs.assets], selection=["workload_source", "training_config"], partition_key="seeded",
                         instance=instance, resources=defs.resources)
    assert res.success
    texts = []
    for ev in res.all_events:
        texts.append(str(ev.message))
        mat = ev.step_materialization_data.materialization if ev.is_step_materialization else None
        if mat is not None:
            texts.extend(str(v.value) for v in mat.metadata.values())
    _assert_clean("Dagster events and metadata", "\n".join(texts))
