"""An entry is run only when it is a Python file or a launch script; a launch script's python runs in the harness.

Both children start at once (a thread each), so the file costs about one torch import.
"""
from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor

from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload

TRAIN = """\
    import sys
    import torch
    if sys.argv[1:] != ["--lr", "0.1"]:
        sys.exit(f"unexpected arguments {sys.argv[1:]}")
    w = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([w], lr=float(sys.argv[2]))
    for _ in range(100):
        (w.sum() ** 2).backward()
        opt.step()
        opt.zero_grad()
    """

LAUNCHES = {
    # a preflight `python -c` runs as it is; the training command runs in the harness with its own arguments;
    # a second training command after the budget is spent is skipped
    "launch": "#!/bin/bash\nset -e\npython -c \"print('preflight')\"\npython3 -u train.py --lr 0.1\n"
              "python train.py --lr 0.1\n",
    # a launch script that never runs a script through python: nothing to measure, and the run says why
    "no_python": "#!/bin/bash\necho 'nothing to launch'\n",
}


def test_launch_scripts_run_their_python_in_the_harness(tmp_path, goblin_home):
    def one(name: str):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.py").write_text(textwrap.dedent(TRAIN))
        (folder / f"{name}.sh").write_text(LAUNCHES[name])
        (folder / "workload.yaml").write_text(f"entry: {name}.sh\n")
        return LocalRunner(device="cpu", timeout_s=60.0).run(load_workload(folder), "benchmark", steps=3, warmup=2)

    with ThreadPoolExecutor(max_workers=len(LAUNCHES)) as pool:
        runs = dict(zip(LAUNCHES, pool.map(one, LAUNCHES)))
    raw = runs["launch"]
    assert raw.ok, raw.failure
    assert len(raw.result.per_step) == 3 and raw.result.reached_budget
    assert (raw.run_dir / "stdout.txt").read_text().strip() == "preflight"
    assert "the step budget is spent; skipping python train.py --lr 0.1" in raw.stderr_tail
    bad = runs["no_python"]
    assert not bad.ok and bad.failure.startswith("no_python.sh: the launch script ran no Python script through "
                                                 "python/python3")
    assert "name the training script as entry: and keep the launch script under config:" in bad.failure


def test_a_config_file_given_as_the_program_is_never_run(tmp_path, goblin_home):
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "train.toml").write_text("lr = 0.1\n")
    wl = load_workload(tmp_path / "train.py")
    raw = LocalRunner(device="cpu").run(wl, "benchmark", steps=2, script=tmp_path / "train.toml")
    assert not raw.ok and raw.returncode is None
    assert raw.failure == "train.toml: not a Python script (.py) or a launch script (.sh, .bash); nothing was run"
