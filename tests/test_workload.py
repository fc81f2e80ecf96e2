"""Workload folders: loading and clear errors naming the file."""
from __future__ import annotations

import pytest

from goblin_assets.errors import WorkloadError
from goblin_assets.runners.workload import list_workloads, load_workload
from tests.conftest import WORKLOADS


def test_digits_workload_loads():
    wl = load_workload(WORKLOADS / "digits_mlp")
    assert wl.name == "digits_mlp"
    assert wl.script.name == "train.py" and wl.script.is_file()
    assert wl.unit == "samples" and wl.batch_field == 0
    assert len(wl.script_hash()) == 64


def test_bundled_workloads_are_listed():
    assert "digits_mlp" in [p.name for p in list_workloads()]


def test_missing_path_names_it(tmp_path):
    with pytest.raises(WorkloadError, match="no_such_dir"):
        load_workload(tmp_path / "no_such_dir")


def test_missing_workload_yaml(tmp_path):
    with pytest.raises(WorkloadError, match="workload.yaml: missing"):
        load_workload(tmp_path)


def test_bad_field_names_file_and_field(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "workload.yaml").write_text("entry: train.py\nunit: parsecs\n")
    with pytest.raises(WorkloadError, match=r"workload.yaml: field 'unit'"):
        load_workload(tmp_path)


def test_missing_entry_script(tmp_path):
    (tmp_path / "workload.yaml").write_text("entry: nope.py\n")
    with pytest.raises(WorkloadError, match="entry script 'nope.py' not found"):
        load_workload(tmp_path)


def test_invalid_yaml(tmp_path):
    (tmp_path / "workload.yaml").write_text("entry: [unclosed\n")
    with pytest.raises(WorkloadError, match="invalid YAML"):
        load_workload(tmp_path)
