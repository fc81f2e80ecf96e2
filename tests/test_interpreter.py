"""The user's interpreter: a workload runs in its own environment, which needs nothing of Goblin installed.

The second interpreter is a fresh venv of the same base Python whose packages
come from a ``.pth`` line naming this project's site-packages (so torch and
scikit-learn import there) but which cannot import ``goblin_assets`` (the
editable install's own ``.pth`` is not processed through a path line).  It
also has a distribution of its own (``bitsandbytes`` 0.0.7, metadata only)
that Goblin's environment lacks: the audit must report that interpreter's
versions, not ours.
"""
from __future__ import annotations

import contextlib
import io
import json
import site
import subprocess
import sys
from pathlib import Path

import pytest

from goblin_assets.cli import main
from goblin_assets.host import InterpreterError, interpreter_packages
from goblin_assets.runners.workload import load_workload
from goblin_assets.errors import WorkloadError
from tests.conftest import WORKLOADS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def user_python(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("user_env") / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    py = venv / "bin" / "python"
    own = Path(subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip())
    (own / "goblin_test_deps.pth").write_text(site.getsitepackages()[0] + "\n")
    meta = own / "bitsandbytes-0.0.7.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.0.7\n")
    probe = subprocess.run([str(py), "-c", "import goblin_assets"], capture_output=True, text=True, cwd=venv)
    assert probe.returncode != 0 and "No module named 'goblin_assets'" in probe.stderr
    return py


def test_the_probe_reads_the_interpreters_own_versions(user_python):
    theirs = interpreter_packages(str(user_python), ("bitsandbytes", "torch", "no_such_dist"))
    assert theirs == {"bitsandbytes": "0.0.7", "torch": interpreter_packages(sys.executable, ("torch",))["torch"],
                      "no_such_dist": None}
    with pytest.raises(InterpreterError, match="cannot run the interpreter"):
        interpreter_packages("/nonexistent/python")


def test_a_workload_names_its_interpreter(tmp_path):
    wl = tmp_path / "wl"
    wl.mkdir()
    (wl / "train.py").write_text("pass\n")
    (wl / "workload.yaml").write_text("entry: train.py\npython: env/bin/python\n")
    with pytest.raises(WorkloadError, match="field 'python': 'env/bin/python' is not an executable interpreter"):
        load_workload(wl)
    (wl / "workload.yaml").write_text(f"entry: train.py\npython: {sys.executable}\n")
    assert load_workload(wl).interpreter == sys.executable


def test_audit_under_an_interpreter_that_cannot_import_goblin(user_python, goblin_home, loader_rule_kb):
    """Profiled, sketched, patched, validated and benchmarked in the user's interpreter; its versions reported
    (the loader rule fires on any data wait, so a loaded machine still yields a patch to benchmark)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["audit", str(WORKLOADS / "digits_mlp"), "--python", str(user_python), "--steps", "3",
                     "--bench-steps", "6", "--repeats", "1", "--kb", str(loader_rule_kb), "--json"])
    assert code == 0
    doc = json.loads(buf.getvalue())
    assert doc["host"]["python"] == str(user_python)
    assert doc["host"]["packages"]["bitsandbytes"] == "0.0.7"          # theirs: not installed in Goblin's venv
    assert doc["measured_speedup"] > 0 and doc["baseline"]["provenance"]["kind"] == "measured"
    report = Path(doc["report_path"]).read_text()
    assert f"python {user_python}" in report and "bitsandbytes 0.0.7" in report   # the report lists them too
    ran = {json.loads(p.read_text())["python"] for p in (goblin_home / "runs").glob("*/result.json")}
    assert ran == {str(user_python)}                           # every child: profile, sketch, validate, benchmark
    modes = {p.parent.name.split("-digits_mlp-")[1].split("-")[0] for p in (goblin_home / "runs").glob("*/result.json")}
    assert modes >= {"profile", "sketch", "benchmark"}
