"""Goblin: audit PyTorch fine-tuning workloads and the tensors inside them."""
from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"

#: The repository root when running from a checkout (kb/, workloads/ live here).
REPO_ROOT = Path(__file__).resolve().parent.parent


def goblin_home() -> Path:
    """``$GOBLIN_HOME`` (default ``./.goblin``), created on first use."""
    home = Path(os.environ.get("GOBLIN_HOME", ".goblin")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def warehouse_path() -> Path:
    """The DuckDB warehouse file: ``$GOBLIN_HOME/warehouse.duckdb``."""
    return goblin_home() / "warehouse.duckdb"


def workloads_root() -> Path:
    """The folder whose sub-folders are the workload partitions: ``$GOBLIN_WORKLOADS``, default ``workloads/``."""
    return Path(os.environ.get("GOBLIN_WORKLOADS", REPO_ROOT / "workloads")).resolve()
