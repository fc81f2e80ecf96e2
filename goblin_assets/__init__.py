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


def cache_dir() -> Path:
    """Where goblin keeps what any warehouse can reuse (the KB's sentence embeddings): ``$GOBLIN_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/goblin``, else ``~/.cache/goblin``.  Not created here; nothing in it is needed:
    a missing or unreadable entry is computed again."""
    explicit = os.environ.get("GOBLIN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser().resolve() / "goblin"


def warehouse_path() -> Path:
    """The DuckDB warehouse file: ``$GOBLIN_HOME/warehouse.duckdb``."""
    return goblin_home() / "warehouse.duckdb"


def workloads_root() -> Path:
    """The folder whose sub-folders are the workload partitions: ``$GOBLIN_WORKLOADS``, default ``workloads/``."""
    return Path(os.environ.get("GOBLIN_WORKLOADS", REPO_ROOT / "workloads")).resolve()
