"""Shared fixtures: a private GOBLIN_HOME (warehouse, runs, caches) per test."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "workloads"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def goblin_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "goblin_home"
    monkeypatch.setenv("GOBLIN_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def digits_profile(tmp_path_factory):
    """One real profiled run of workloads/digits_mlp (6 steps), shared by tests that only read it."""
    from goblin_assets.audit.profile import profile_run
    from goblin_assets.runners.local import LocalRunner
    from goblin_assets.runners.workload import load_workload

    home = tmp_path_factory.mktemp("profile_home")
    old = os.environ.get("GOBLIN_HOME")
    os.environ["GOBLIN_HOME"] = str(home)
    try:
        m = profile_run(load_workload(WORKLOADS / "digits_mlp"), LocalRunner(timeout_s=300), steps=6)
    finally:
        if old is None:
            os.environ.pop("GOBLIN_HOME", None)
        else:
            os.environ["GOBLIN_HOME"] = old
    assert m.ok, m.failure
    return m


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """Run a module's tests with one torch intra-op thread, then restore the setting."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
