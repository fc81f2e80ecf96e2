"""Child-process failure modes of the local runner: each is a failed RawRun with a reason, never a crash.

All children start at once (one module fixture, a thread each), so the file
costs about one torch import plus the hang's timeout.
"""
from __future__ import annotations

import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.result import RawRun
from goblin_assets.runners.workload import load_workload

HANG_TIMEOUT_S = 5.0

SCRIPTS = {
    "hangs": ("""\
        import time
        while True:
            time.sleep(1)
        """, {"timeout_s": HANG_TIMEOUT_S}),
    "torch_oom": ("""\
        import torch
        x = torch.empty(8 * 1024**3, dtype=torch.uint8)
        x.fill_(1)
        """, {"mem_cap_gb": 3.0}),
    "python_oom": ("""\
        buffers = [bytearray(8 * 1024**3)]
        """, {"mem_cap_gb": 3.0}),
    "oom_in_step": ("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        data = DataLoader(TensorDataset(torch.randn(64, 64), torch.zeros(64, dtype=torch.long)), batch_size=8)
        for i, (x, y) in enumerate(data):
            if i == 3:
                activations = torch.empty(8 * 1024**3, dtype=torch.uint8)
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        """, {"mem_cap_gb": 3.0}),
    "segfaults": ("""\
        import ctypes
        ctypes.string_at(0)
        """, {}),
    "aborts": ("""\
        import os
        os.abort()
        """, {}),
    "exits_3": ("""\
        import sys
        print("loading config.yaml", file=sys.stderr)
        print("fatal: learning_rate must be positive", file=sys.stderr)
        sys.exit(3)
        """, {}),
    "one_step": ("""\
        import torch
        w = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([w], lr=0.1)
        w.grad = torch.ones(3)
        opt.step()
        print("done after one step")
        """, {}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, RawRun]:
    root = tmp_path_factory.mktemp("failures")
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(root / "home"))

    def one(name: str) -> RawRun:
        body, settings = SCRIPTS[name]
        script = root / f"{name}.py"
        script.write_text(textwrap.dedent(body))
        runner = LocalRunner(device="cpu", **{"timeout_s": 60.0, "mem_cap_gb": 4.0, **settings})
        return runner.run(load_workload(script), "benchmark", steps=2, warmup=2)

    try:
        with ThreadPoolExecutor(max_workers=len(SCRIPTS)) as pool:
            return dict(zip(SCRIPTS, pool.map(one, SCRIPTS)))
    finally:
        mp.undo()


def _failed(raw: RawRun, name: str) -> str:
    assert not raw.ok
    assert raw.result is None or not raw.result.per_step
    assert raw.failure.startswith(f"{name}.py: "), raw.failure
    return raw.failure


def test_hang_times_out(runs):
    raw = runs["hangs"]
    failure = _failed(raw, "hangs")
    assert failure.startswith(f"hangs.py: timed out after {HANG_TIMEOUT_S:.0f} s (wall-clock limit) after 0 "
                              "optimizer steps; "), failure
    # the stacks are dumped before the kill (tests/test_hangs.py checks the waiting lines); a child still
    # importing torch when the limit comes has registered no handler, and the line says so
    assert ("the main thread waits in a sleep at hangs.py:3 (`time.sleep(1)`)" in failure
            or "no stack dump came back" in failure), failure
    assert raw.extra["hang"]["stopped_by"] == "timeout"
    assert raw.wall_s < HANG_TIMEOUT_S + 10


@pytest.mark.parametrize("name", ["torch_oom", "python_oom"])
def test_allocation_beyond_the_cap_is_out_of_memory(runs, name):
    raw = runs[name]
    failure = _failed(raw, name)
    assert failure.startswith(f"{name}.py: ran out of memory during setup, before the first batch, at {name}.py:")
    assert "no optimizer constructed yet" in failure
    # the cap is named as the limit that was hit, last, never as the fix
    assert failure.endswith("(mem_cap_gb=3; RLIMIT_AS counts virtual memory, mapped libraries included, "
                            "not only resident pages)")
    assert "allocate memory" in raw.stderr_tail or "MemoryError" in raw.stderr_tail


def test_out_of_memory_says_what_used_the_memory(runs):
    """The failed allocation, where, what was held, and only then the limit: the cap is never the fix."""
    raw = runs["oom_in_step"]
    failure = _failed(raw, "oom_in_step")
    held = (
        "oom_in_step.py: ran out of memory in step 4 (measured step 2), during forward (a batch loaded, no backward "
        "yet), at oom_in_step.py:9 in <module>: an allocation of 8.59 GB (8589934592 bytes) failed; held at the "
        "time: peak resident memory ")
    assert failure.startswith(held), failure
    # Linear(64, 64): 4160 fp32 parameters = 16,640 bytes; its gradients and SGD momentum the same;
    # a batch of 8 x 64 fp32 inputs + 8 int64 labels = 2,112 bytes
    assert ("parameters 16.6 kB + gradients 16.6 kB + optimizer state 16.6 kB (1 optimizer), "
            "last DataLoader batch 2.1 kB; the limit hit: the runner's address-space cap of 3.22 GB") in failure
    state = raw.extra["oom"]
    assert (state["params_bytes"], state["grads_bytes"], state["optimizer_state_bytes"], state["batch_bytes"]) == (
        16640, 16640, 16640, 2112)
    assert state["steps_done"] == 3 and state["peak_rss_bytes"] > 0
    assert "increase" not in failure.lower() and "raise the cap" not in failure.lower()


@pytest.mark.parametrize("name, sig", [("segfaults", "SIGSEGV"), ("aborts", "SIGABRT")])
def test_crash_is_killed_by_signal_with_traceback(runs, name, sig):
    raw = runs[name]
    assert _failed(raw, name) == f"{name}.py: killed by {sig}"
    assert raw.returncode < 0
    # PYTHONFAULTHANDLER in the child: the tail says where it died
    assert "Fatal Python error" in raw.stderr_tail and f"{name}.py" in raw.stderr_tail


def test_nonzero_exit_keeps_code_and_stderr_tail(runs):
    raw = runs["exits_3"]
    assert _failed(raw, "exits_3") == "exits_3.py: exited with code 3: fatal: learning_rate must be positive"
    assert raw.returncode == 3
    assert "loading config.yaml" in raw.stderr_tail


def test_ending_before_warmup_is_explained(runs):
    raw = runs["one_step"]
    assert _failed(raw, "one_step") == (
        "one_step.py: finished after 1 optimizer steps; need more than 2 warm-up steps "
        "(is optimizer.step() called?)")
    assert raw.returncode == 0


def test_a_malformed_result_names_the_file_and_the_field(tmp_path, monkeypatch):
    """A child that writes a result.json of the wrong shape is a failed run naming the file and field."""
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    fake_python = tmp_path / "fake_python"
    fake_python.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, pathlib, sys
        spec = json.loads(pathlib.Path(sys.argv[-1]).read_text())
        bad = {{"reached_budget": True, "steps_seen": 3, "device": "cpu", "torch_version": "2.x", "num_threads": 1,
                "max_rss_gb": 0.1, "per_step": [{{"samples": "many"}}]}}
        (pathlib.Path(spec["out_dir"]) / "result.json").write_text(json.dumps(bad))
        """))
    fake_python.chmod(0o755)
    script = tmp_path / "train.py"
    script.write_text("print('never run: the fake interpreter writes the result')\n")
    raw = LocalRunner(device="cpu", timeout_s=60, python=str(fake_python)).run(load_workload(script), "benchmark",
                                                                                steps=2, warmup=1)
    assert not raw.ok and raw.result is None
    assert raw.failure.startswith("train.py: the harness's results are unreadable: ")
    assert str(raw.run_dir / "result.json") in raw.failure and "field 'per_step.0.samples'" in raw.failure
