"""Shared fixtures: a private GOBLIN_HOME (warehouse, runs, caches) per test; the host facts every test sees.

Hermetic host: the suite never reads this machine's CPU flags, core count or
accelerators.  ``GOBLIN_HOST_FACTS`` is set here, for the whole session and
for every child process it starts (workload runs, ``goblin`` subprocesses,
Dagster step processes), to :data:`TEST_HOST`: a 2-core CPU without bf16
matrix instructions, or with ``GOBLIN_TEST_HOST_KIND=bf16`` a 2-core CPU that
has them (AMX and AVX-512 BF16: the suite must pass on both kinds, issue 24).
A test that needs another host says so with
``goblin_assets.host.use_host`` (or a HostFacts of its own).  Package versions
stay the installed ones: the lock file decides them, not the machine.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "workloads"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: The host every test runs on, whatever the machine is (set before goblin_assets reads it).
TEST_HOST = {"cores": 2, "online_cpus": 2, "affinity_cpus": 2, "numa_nodes": 1, "amx_bf16": False,
             "avx512_bf16": False, "devices": []}
#: ``GOBLIN_TEST_HOST_KIND``: ``plain`` (the default, no bf16 matrix instructions) or ``bf16``.
TEST_HOST_KIND = os.environ.get("GOBLIN_TEST_HOST_KIND", "plain")
if TEST_HOST_KIND not in ("plain", "bf16"):
    raise pytest.UsageError(f"GOBLIN_TEST_HOST_KIND={TEST_HOST_KIND!r}: expected 'plain' or 'bf16'")
if TEST_HOST_KIND == "bf16":
    TEST_HOST.update(amx_bf16=True, avx512_bf16=True)
os.environ["GOBLIN_HOST_FACTS"] = json.dumps(TEST_HOST)
#: Where goblin writes (warehouse, runs, caches) when a test sets nothing else: a private folder for
#: the session, never the checkout's ``.goblin`` (set before anything captures ``$GOBLIN_HOME``).
SESSION_HOME = Path(tempfile.mkdtemp(prefix="goblin_test_home_"))
os.environ["GOBLIN_HOME"] = str(SESSION_HOME)
atexit.register(shutil.rmtree, SESSION_HOME, ignore_errors=True)
#: What any warehouse can reuse (the KB's sentence embeddings): one folder for the session and every process it
#: starts, never the user's ``~/.cache/goblin`` (the first test that encodes the KB pays for the rest).
SESSION_CACHE = Path(tempfile.mkdtemp(prefix="goblin_test_cache_"))
os.environ["GOBLIN_CACHE_DIR"] = str(SESSION_CACHE)
atexit.register(shutil.rmtree, SESSION_CACHE, ignore_errors=True)
#: The benchmark's time budget for adding repeat pairs (seconds): short, so the suite stays lean.
TEST_BENCH_BUDGET_S = 10.0
os.environ["GOBLIN_RUNNER_BENCH_BUDGET_S"] = str(TEST_BENCH_BUDGET_S)


def dagster_resources(db: Path, **runner_settings) -> dict:
    """The Definitions' resources for a test: a local runner with ``runner_settings`` and a warehouse at ``db``."""
    from dagster_duckdb import DuckDBResource

    from goblin_assets.defs.resources import LocalRunnerResource, WarehouseResource

    return {"runner": LocalRunnerResource(**{"bench_budget_s": TEST_BENCH_BUDGET_S, **runner_settings}),
            "warehouse": WarehouseResource(duckdb=DuckDBResource(database=str(db)))}


def conversation_inputs(s) -> dict:
    """The upstream values of the ``audit_conversation`` asset, taken from a finished audit session ``s``.

    The benchmark outputs are as the ``benchmarks`` asset yields them: ``benchmark_baseline`` None and
    ``benchmark_patched`` ``(None, None)`` when nothing was benchmarked (no rule fired, or the patch changes
    nothing), else the baseline arm and ``(patched arm, patched run, patch measured)``.
    """
    from goblin_assets.kb.rules import load_kb

    bench = s.benchmarks()
    return dict(audit_report=s.audit_report(), training_config=s.training_config(), profile_run=s.profile_run(),
                kb_matches=s.kb_matches(), patch=s.patch(), workload_source=s.workload, kb_rules=load_kb(),
                benchmark_baseline=bench["baseline"] if bench else None,
                benchmark_patched=(bench["patched"], s.patched_run(), s.patch()) if bench else (None, None))


@pytest.fixture
def goblin_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "goblin_home"
    monkeypatch.setenv("GOBLIN_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def digits_profile(tmp_path_factory):
    """One real profiled run of workloads/digits_mlp (6 steps), shared by tests that only read it."""
    from goblin_assets.measure.profile import profile_run
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


def _checkout_state() -> dict[str, float]:
    """Every file under the checkout's ``.goblin`` with its modification time (empty when there is none)."""
    root = REPO / ".goblin"
    return {str(p): p.stat().st_mtime for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


@pytest.fixture(scope="session", autouse=True)
def checkout_home_untouched():
    """The suite never writes into the checkout's ``.goblin`` (the user's warehouse, runs and caches)."""
    before = _checkout_state()
    yield
    after = _checkout_state()
    changed = sorted(p for p, t in after.items() if before.get(p) != t)
    assert not changed, "tests wrote into the checkout's .goblin: " + ", ".join(changed[:5])


@pytest.fixture
def loader_rule_kb(tmp_path) -> Path:
    """The shipped rules with ``data.loader_workers_with_threads`` firing on any data wait (share > 0, not 0.30).

    For a test that needs a patch of the digits workload (a benchmark, a patched run) and is not about the
    rule's threshold: the profiled data-wait share moves with the machine's load, and a loaded CI machine
    can keep the shipped rule quiet (then no patch is written and nothing is benchmarked).
    """
    text = (REPO / "kb" / "rocm_rules.yaml").read_text(encoding="utf-8")
    assert text.count("waste.data_wait.share > 0.30") == 1, "the loader rule's threshold moved"
    path = tmp_path / "rules_loader_eager.yaml"
    path.write_text(text.replace("waste.data_wait.share > 0.30", "waste.data_wait.share > 0.0"), encoding="utf-8")
    return path


#: The host facts of a CPU without bf16 matrix instructions: :data:`TEST_HOST` of the ``plain`` kind.
PLAIN_HOST = {"amx_bf16": False, "avx512_bf16": False}


@pytest.fixture
def plain_host():
    """The test runs on the ``plain`` host kind whatever ``GOBLIN_TEST_HOST_KIND`` says: for a test whose
    expectation is that host's (no bf16 matrix instructions: the bf16 rules stay quiet)."""
    from goblin_assets.host import use_host

    with use_host(PLAIN_HOST) as h:
        yield h
