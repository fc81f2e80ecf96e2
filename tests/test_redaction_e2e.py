"""Secrets in a user's script never reach Dagster metadata or logs.

The CLI side (JSON, logs, report, warehouse) is checked by the end-to-end
audit in test_audit_e2e.py, which runs on the seeded workload built here.
"""
from __future__ import annotations

from pathlib import Path

import dagster as dg

from tests.conftest import WORKLOADS, dagster_resources
from tests.test_redact import SECRETS


def seeded_workload(root: Path) -> Path:
    """digits_mlp with 20 secrets as comments right after the imports (so they sit in the diff's context)."""
    wl = root / "seeded"
    wl.mkdir(parents=True)
    src = (WORKLOADS / "digits_mlp" / "train.py").read_text()
    lines = [("# " + ln) for _, line in SECRETS for ln in line.splitlines()]
    anchor = "from torch.utils.data import DataLoader, Dataset\n"
    (wl / "train.py").write_text(src.replace(anchor, anchor + "\n".join(lines) + "\n"))
    (wl / "workload.yaml").write_text((WORKLOADS / "digits_mlp" / "workload.yaml").read_text())
    return wl


def assert_clean(where: str, text: str) -> None:
    for secret, _ in SECRETS:
        assert secret not in text, f"{secret!r} leaked into {where}"


def test_dagster_metadata_and_logs_are_redacted(tmp_path, monkeypatch):
    wl = seeded_workload(tmp_path / "workloads")
    monkeypatch.setenv("GOBLIN_WORKLOADS", str(wl.parent))
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    from goblin_assets.definitions import defs

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("workloads", ["seeded"])
    res = dg.materialize([*defs.assets], selection=["workload_source", "training_config"], partition_key="seeded",
                         instance=instance, resources=dagster_resources(tmp_path / "home" / "warehouse.duckdb"))
    assert res.success
    texts = []
    for ev in res.all_events:
        texts.append(str(ev.message))
        mat = ev.step_materialization_data.materialization if ev.is_step_materialization else None
        if mat is not None:
            texts.extend(str(v.value) for v in mat.metadata.values())
    assert_clean("Dagster events and metadata", "\n".join(texts))
