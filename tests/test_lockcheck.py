"""The install lock (goblin_assets/lockcheck.py): the comparison on hand-made inputs, the CLI, and the lock itself."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from goblin_assets import lockcheck
from goblin_assets.lockcheck import Disagreement, compare, matches, parse_lock, render_lock

REPO = Path(__file__).resolve().parents[1]


def _env(**versions: str) -> dict[str, tuple[str, str]]:
    return {lockcheck.canonical(k): (k, v) for k, v in versions.items()}


def test_matching_environment_passes_and_extras_are_ignored():
    locked = parse_lock("# a comment\n\nnumpy==2.4.6\nPyYAML==6.0.4  # trailing comment\n")
    installed = _env(numpy="2.4.6", pyyaml="6.0.4", ipython="9.0.0")  # ipython: installed by hand, not locked
    assert compare(locked, installed) == []


def test_version_mismatch_and_missing_package_are_each_named():
    locked = parse_lock("transformers==5.24.0\npytest==9.2.0\nnumpy==2.4.6\n")
    bad = compare(locked, _env(transformers="5.25.0", numpy="2.4.6"))
    assert bad == [Disagreement("pytest", "9.2.0", None), Disagreement("transformers", "5.24.0", "5.25.0")]
    text = lockcheck.report(bad, Path("requirements.lock"), len(locked))
    assert "FAILED: 2 of 3 packages" in text
    assert "  pytest: missing (locked 9.2.0)" in text
    assert "  transformers: installed 5.25.0, locked 5.24.0" in text
    assert "numpy" not in text and "make lock" in text


def test_names_compare_as_pep503():
    locked = parse_lock("typing_extensions==4.16.0\nHolisticTraceAnalysis==0.5.0\n")
    assert compare(locked, _env(**{"typing-extensions": "4.16.0", "holistictraceanalysis": "0.5.0"})) == []


@pytest.mark.parametrize(("locked", "installed", "ok"), [
    ("2.13.0", "2.13.0", True),
    ("2.13.0", "2.13.0+cpu", True),        # the pinned CPU wheel: the lock names the release, any build of it matches
    ("2.13.0", "2.13.0+rocm6.4", True),    # a ROCm/CUDA build of the same release, installed into .venv first
    ("2.13.0", "2.14.1+cpu", False),       # another release is a mismatch whatever its label
    ("2.13.0", "2.13.01", False),
    ("2.13.0+cpu", "2.13.0+cpu", True),    # a label written in the lock is matched exactly
    ("2.13.0+cpu", "2.13.0+cu128", False),
    ("2.13.0+cpu", "2.13.0", False),
])
def test_local_version_label(locked, installed, ok):
    assert matches(locked, installed) is ok


def test_torch_build_label_is_accepted_but_release_is_checked():
    locked = parse_lock("torch==2.13.0\n")
    assert compare(locked, _env(torch="2.13.0+cpu")) == []
    assert compare(locked, _env(torch="2.14.1+cpu")) == [Disagreement("torch", "2.13.0", "2.14.1+cpu")]


@pytest.mark.parametrize("text", ["torch>=2.4\n", "-e .\n", "numpy==1.0\nNumPy==2.0\n"])
def test_parse_rejects_what_a_lock_never_holds(text):
    with pytest.raises(ValueError, match="line"):
        parse_lock(text)


def test_render_drops_project_and_labels_and_round_trips():
    installed = _env(**{"goblin-assets": "0.1.0", "torch": "2.13.0+cpu", "Zeta": "1.0", "alpha": "2.0"})
    text = render_lock(installed)
    assert text.startswith(lockcheck.HEADER)
    assert "builds: torch 2.13.0+cpu" in text
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["alpha==2.0", "torch==2.13.0", "Zeta==1.0"]
    assert compare(parse_lock(text), installed) == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys; from goblin_assets import lockcheck; rc = lockcheck.main(sys.argv[1:]); "
            "assert not {'dagster', 'duckdb'} & set(sys.modules), 'lockcheck imported dagster/duckdb'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_cli_fails_loudly_naming_each_package(tmp_path):
    pip_version = next(d.version for d in lockcheck.metadata.distributions() if d.metadata["Name"] == "pip")
    good = tmp_path / "good.lock"
    good.write_text(f"pip=={pip_version}\n")
    ok = _cli("--lock", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "all 1 locked packages match" in ok.stdout

    bad = tmp_path / "bad.lock"
    bad.write_text("pip==0.0.1\nno-such-package-goblin==1.0\n")
    out = _cli("--lock", str(bad))
    assert out.returncode == 1
    assert f"  pip: installed {pip_version}, locked 0.0.1" in out.stderr
    assert "  no-such-package-goblin: missing (locked 1.0)" in out.stderr

    assert _cli("--lock", str(tmp_path / "absent.lock")).returncode == 2


def test_repository_lock_pins_every_declared_dependency():
    """A dependency added to pyproject.toml (or the Makefile's HTA) without `make lock` would float: fail here."""
    locked = parse_lock((REPO / "requirements.lock").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = [*project["dependencies"], "HolisticTraceAnalysis", "pip"]
    for req in extras["test"]:  # the test extra names the scale extra as goblin-assets[scale]: expand it
        own = re.fullmatch(r"goblin-assets\[([\w,-]+)\]", req)
        declared += [d for x in own.group(1).split(",") for d in extras[x]] if own else [req]
    names = {lockcheck.canonical(re.match(r"[A-Za-z0-9._-]+", req).group(0)) for req in declared}
    assert {"dagster-postgres", "dagster-celery", "redis"} <= names
    assert sorted(names - set(locked)) == []
    assert lockcheck.PROJECT not in locked
    # the Makefile's own pins agree with the lock (else pip's resolver refuses the install)
    makefile = (REPO / "Makefile").read_text()
    assert locked["torch"][1] == re.search(r"^TORCH := torch==(\S+)$", makefile, re.M).group(1)
    assert locked["holistictraceanalysis"][1] == re.search(r'"HolisticTraceAnalysis==([^"]+)"', makefile).group(1)
