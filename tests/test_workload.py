"""Workload folders: loading and clear errors naming the file."""
from __future__ import annotations

import pytest

from goblin_assets.errors import WorkloadError, WorkloadSpecError
from goblin_assets.runners.workload import entry_kind, list_workloads, load_workload
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


@pytest.mark.parametrize("typo, meant", [("units", "unit"), ("batch_feild", "batch_field"), ("mask_fields", "mask_field"),
                                         ("entrypoint", "entry")])
def test_misspelled_key_is_rejected_with_the_closest_known_key(tmp_path, typo, meant):
    (tmp_path / "train.py").write_text("print(1)\n")
    spec = tmp_path / "workload.yaml"
    spec.write_text(f"entry: train.py\n{typo}: 0\n" if typo != "entrypoint" else "entrypoint: train.py\n")
    with pytest.raises(WorkloadSpecError) as err:
        load_workload(tmp_path)
    assert str(err.value) == f"{spec}: unknown key '{typo}' (did you mean '{meant}'?)"
    assert (err.value.file, err.value.key, err.value.suggestion) == (str(spec), typo, meant)


def test_unknown_key_with_nothing_close_lists_the_known_keys(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "workload.yaml").write_text("entry: train.py\nroot: /elsewhere\n")  # internal, not a spec key
    with pytest.raises(WorkloadSpecError, match=r"unknown key 'root' \(known keys: entry, args, unit, "):
        load_workload(tmp_path)


@pytest.mark.parametrize("body, key, why", [
    ("args: --lr 3e-4", "args", r"field 'args': Input should be a valid list \(got '--lr 3e-4'\)"),
    ("model: [a, b]", "model", r"field 'model': Input should be a valid string"),
    ("batch_field: [0]", "batch_field", r"field 'batch_field"),
])
def test_wrong_value_type_names_file_key_and_value(tmp_path, body, key, why):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "workload.yaml").write_text(f"entry: train.py\n{body}\n")
    with pytest.raises(WorkloadSpecError, match=why) as err:
        load_workload(tmp_path)
    assert err.value.key == key and "\n" not in str(err.value)


def test_numbers_in_args_are_command_line_text(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "workload.yaml").write_text("entry: train.py\nargs: [--lr, 0.1, --epochs, 3]\n")
    assert load_workload(tmp_path).args == ["--lr", "0.1", "--epochs", "3"]


def test_config_file_as_entry_is_refused(tmp_path):
    (tmp_path / "train.toml").write_text("lr = 0.1\n")
    spec = tmp_path / "workload.yaml"
    spec.write_text("entry: train.toml\n")
    with pytest.raises(WorkloadSpecError) as err:
        load_workload(tmp_path)
    assert str(err.value).startswith(f"{spec}: field 'entry': 'train.toml' is not a Python script (.py) or a "
                                     "launch script (.sh, .bash)")
    assert "a config file goes under config:" in str(err.value)
    with pytest.raises(WorkloadError, match="train.toml: a workload is a folder with workload.yaml, a Python script"):
        load_workload(tmp_path / "train.toml")


def test_entry_kinds(tmp_path):
    for name, text in {"a.py": "", "run.sh": "", "b.bash": "", "tool": "#!/usr/bin/env python3\n",
                       "go": "#!/bin/bash\n", "notes": "no shebang\n", "c.toml": ""}.items():
        (tmp_path / name).write_text(text)
    kinds = {n: entry_kind(tmp_path / n) for n in ("a.py", "run.sh", "b.bash", "tool", "go", "notes", "c.toml")}
    assert kinds == {"a.py": "python", "run.sh": "launch", "b.bash": "launch", "tool": "python", "go": "launch",
                     "notes": None, "c.toml": None}
    (tmp_path / "workload.yaml").write_text("entry: run.sh\nconfig: c.toml\n")
    wl = load_workload(tmp_path)
    assert wl.kind == "launch"
    # a patched copy of the config (inside a copy of the folder) runs the copy's entry, never the config
    copy = tmp_path / "patched" / "workload"
    assert wl.program(copy / "c.toml") == copy / "run.sh"
    assert wl.program() == wl.script and wl.program(copy / "run.sh") == copy / "run.sh"


def test_cli_prints_a_bad_key_as_one_line_and_exits_2(tmp_path, goblin_home, capsys):
    from goblin_assets.cli import main

    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "workload.yaml").write_text("entry: train.py\nunits: tokens\n")
    assert main(["audit", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"goblin audit: error: {tmp_path / 'workload.yaml'}: unknown key 'units' (did you mean 'unit'?)"
