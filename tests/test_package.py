"""The package stands alone: the wheel carries its data, and an installed copy works from any directory.

One wheel is built (``pip wheel --no-deps``) from a copy of the source tree, so
neither a stale ``build/`` nor the checkout's egg-info leak into it.  A fresh
venv on the same base interpreter gets the wheel with ``pip --python ...
install --no-deps``; the project's dependencies come from the running
environment through a ``.pth`` line (nothing is downloaded).  Only plain path
lines of a ``.pth`` are honoured for a directory added that way, so the running
environment's editable-install hook never runs there: the fresh venv imports
the wheel's copy, which a test below checks.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
#: Never copied into the build tree: VCS data, environments, build outputs, caches.
_SKIP = {".git", ".venv", ".goblin", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}
#: Suffixes of the data files the package reads with importlib.resources.
DATA_SUFFIXES = {".yaml", ".yml", ".json", ".sql", ".lock"}
#: Top-level data folders of the repository -> where the wheel carries them (setup.py's package_dir).
DATA_FOLDERS = {"kb": "goblin_assets/kb/data", "dbt_like_sql": "goblin_assets/dbt_like_sql"}


def _data_files(root: Path, inside: str) -> list[str]:
    return [f"{inside}/{p.relative_to(root).as_posix()}" for p in root.rglob("*")
            if p.suffix in DATA_SUFFIXES and "__pycache__" not in p.parts]


#: Every such file (paths inside the wheel): the image lock and categories under goblin_assets/, the KB
#: and the SQL models from their top-level folders.
PACKAGE_DATA = sorted(_data_files(REPO / "goblin_assets", "goblin_assets")
                      + [f for top, inside in DATA_FOLDERS.items() for f in _data_files(REPO / top, inside)])


def _skip(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _SKIP or n.endswith((".egg-info", ".so"))}


def _can_build_offline() -> bool:
    """Whether this environment's setuptools can build the wheel itself (>= 70.1 writes wheels without ``wheel``)."""
    try:
        return tuple(int(x) for x in version("setuptools").split(".")[:2]) >= (70, 1)
    except (PackageNotFoundError, ValueError):
        return False


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def _ok(proc: subprocess.CompletedProcess) -> str:
    """``proc``'s stdout, or a failure showing the command's output."""
    assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built without dependencies (compiles the one C file)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_skip, symlinks=True)
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp / "dist", src,
              *(["--no-build-isolation"] if _can_build_offline() else [])], timeout=600))
    (whl,) = (tmp / "dist").glob("goblin_assets-*.whl")
    return whl


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A new venv holding the wheel, with this environment's packages importable after its own."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    _ok(_run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv], timeout=120))
    py = venv / "bin" / "python"
    _ok(_run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--quiet", wheel], timeout=300))
    site = Path(_ok(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)).strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_goblin_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return venv


@pytest.fixture
def elsewhere(tmp_path) -> tuple[Path, dict[str, str]]:
    """A working directory outside the checkout and an environment with a private GOBLIN_HOME."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "GOBLIN_WORKLOADS")}
    # COLUMNS: rich must not fold the long site-packages path in `kb check`'s table title
    env.update(GOBLIN_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="400")
    (tmp_path / "cwd").mkdir()
    return tmp_path / "cwd", env


def test_wheel_contains_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [p for p in PACKAGE_DATA if p not in names] == []
    assert {"goblin_assets/kb/data/rocm_rules.yaml", "goblin_assets/kb/data/signals.yaml",
            "goblin_assets/kb/data/phrases.yaml", "goblin_assets/rocm_image.lock"} <= set(PACKAGE_DATA)
    assert any(p.startswith("goblin_assets/dbt_like_sql/staging/") for p in PACKAGE_DATA)
    assert any(p.startswith("goblin_assets/dbt_like_sql/marts/") for p in PACKAGE_DATA)
    assert "goblin_assets/runners/spawn_hook/goblin_stall_worker.py" in names  # not a package: package data


def test_fresh_venv_imports_the_wheel_not_the_checkout(fresh_venv, elsewhere):
    cwd, env = elsewhere
    code = ("import goblin_assets, importlib.resources as r; print(goblin_assets.__file__); "
            "print(r.files('goblin_assets.kb.data') / 'rocm_rules.yaml'); "
            "print(r.files('goblin_assets.dbt_like_sql.marts') / 'audit_lineage.sql')")
    out = _ok(_run([fresh_venv / "bin" / "python", "-c", code], timeout=60, cwd=cwd, env=env)).splitlines()
    assert all(Path(p).resolve().is_relative_to(fresh_venv.resolve()) for p in out), out


def test_editable_install_reads_the_top_level_folders(elsewhere):
    """The development install (``pip install -e .``) maps kb/ and dbt_like_sql/ into the package."""
    cwd, env = elsewhere
    code = ("import importlib.resources as r; print(r.files('goblin_assets.kb.data') / 'rocm_rules.yaml'); "
            "print(r.files('goblin_assets.dbt_like_sql') / 'staging' / 'stg_run_metrics.sql')")
    rules, sql = _ok(_run([sys.executable, "-c", code], timeout=60, cwd=cwd, env=env)).splitlines()
    assert Path(rules) == REPO / "kb" / "rocm_rules.yaml" and Path(rules).is_file()
    assert Path(sql) == REPO / "dbt_like_sql" / "staging" / "stg_run_metrics.sql" and Path(sql).is_file()


def test_dagster_definitions_load_from_another_directory(fresh_venv, elsewhere):
    """The installed wheel's Dagster code location loads outside the checkout: every SQL model is an asset."""
    cwd, env = elsewhere
    code = ("from goblin_assets.definitions import defs; "
            "keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}; "
            "print(sorted(k for k in keys if k in {'audit_lineage', 'stg_run_metrics', 'kb_rules'}))")
    out = _ok(_run([fresh_venv / "bin" / "python", "-c", code], timeout=300, cwd=cwd, env=env))
    assert out.strip() == "['audit_lineage', 'kb_rules', 'stg_run_metrics']"


def test_kb_check_from_another_directory(fresh_venv, elsewhere):
    cwd, env = elsewhere
    out = _ok(_run([fresh_venv / "bin" / "goblin", "kb", "check"], timeout=120, cwd=cwd, env=env))
    assert "rocm_rules.yaml" in out and "ok: every rule" in out


def test_replay_audit_from_another_directory(fresh_venv, elsewhere):
    cwd, env = elsewhere
    scenario = REPO / "workloads" / "synthetic" / "fp32_on_mi300x"
    out = _ok(_run([fresh_venv / "bin" / "goblin", "audit", scenario, "--json"], timeout=600, cwd=cwd, env=env))
    assert "audit_id" in json.loads(out)
