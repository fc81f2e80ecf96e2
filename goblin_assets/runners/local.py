"""The local runner: the user's script in a child process with the installed torch.

Works on ``cpu``, ``cuda`` and ROCm (ROCm builds use the ``torch.cuda`` API;
``torch.version.hip`` tells them apart).  The child is
:mod:`goblin_assets.runners.harness`; it gets a step budget (no edit of the
script), a wall-clock timeout, an address-space cap, a scrubbed environment
and a scratch working directory.  A launch script entry (``.sh``: see
:func:`~goblin_assets.runners.workload.entry_kind`) runs under bash with the
run's ``bin/`` first on ``PATH``, where ``python`` and ``python3`` run their
script inside the harness (``harness.launched``) with the launch line's own
arguments; a launcher that starts its own interpreters (torchrun,
accelerate launch) is not hooked, and the run says so.  A child that runs out
of memory fails with what used the memory (:mod:`goblin_assets.runners.oom`).
A child that hangs, runs out of memory,
crashes, exits non-zero or leaves a malformed ``result.json`` yields a
:class:`~goblin_assets.runners.result.RawRun` with ``ok=False``, the reason and
the tail of its stderr: never an exception from deep inside.
"""
from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from goblin_assets import goblin_home
from goblin_assets.contracts import RunMetrics
from goblin_assets.runners.oom import OOM_NAME, OOM_TEXT, oom_failure
from goblin_assets.runners.result import RESULT_NAME, HarnessResult, HarnessResultError, Mode, RawRun
from goblin_assets.runners.stacks import hang_failure, read_hang
from goblin_assets.runners.stall import STALL_FACTOR, STALL_MIN_S, StallWatch, dump_stacks
from goblin_assets.runners.workload import LAUNCH_SUFFIXES, PYTHON_SUFFIXES, Workload, entry_kind

#: The child harness, run by file path so that the user's interpreter needs nothing of Goblin installed.
HARNESS = Path(__file__).resolve().with_name("harness.py")
#: The folder holding the ``goblin_assets`` package (a sketch run's tap is imported from it).
GOBLIN_PATH = Path(__file__).resolve().parents[2]

#: Environment variables never passed to user code (credentials and tokens).
_SECRET_ENV = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY|^AWS_|^AZURE_|^GOOGLE_|^GCP_|^HF_TOKEN|^WANDB_API)",
    re.IGNORECASE,
)
#: The interpreter names a launch script's commands find first on PATH (the run's ``bin/``).
_SHIM_NAMES = ("python", "python3")


def scrubbed_env(extra: dict[str, str] | None = None, unset: list[str] | None = None) -> dict[str, str]:
    """The parent's environment without credentials, plus ``extra``, minus ``unset``."""
    env = {k: v for k, v in os.environ.items() if not _SECRET_ENV.search(k)}
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONPATH", None)
    for k in unset or []:
        env.pop(k, None)
    env.update(extra or {})
    return env


def _limit_memory(cap_gb: float | None):
    def apply() -> None:
        os.setsid()
        if cap_gb:
            cap = int(cap_gb * 1024**3)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return apply


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()[-n:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


class LocalRunner:
    """Run workloads with the installed torch; see the module docstring.

    Parameters
    ----------
    device:
        ``auto`` (cuda/ROCm when available, else cpu), ``cpu`` or ``cuda``.
        ``cpu`` hides accelerators from the child (``CUDA_VISIBLE_DEVICES=""``).
    timeout_s:
        Wall-clock limit per child run, seconds.
    mem_cap_gb:
        Address-space cap of the child (``RLIMIT_AS``), GB; ``None`` for none.
    python:
        The interpreter the child runs in (the user's environment: its torch,
        transformers, ...); default Goblin's own.  It needs nothing of Goblin
        installed: the harness is run by its file path (:data:`HARNESS`).
    stall_factor, stall_min_s:
        A run whose next optimizer step does not come within ``stall_factor``
        x the median step interval (and at least ``stall_min_s`` seconds) has
        hung: its stacks are dumped and it is stopped before the timeout
        (:mod:`goblin_assets.runners.stall`).
    """

    kind = "local"

    def __init__(self, device: str = "auto", timeout_s: float = 600.0, mem_cap_gb: float | None = 16.0,
                 python: str | None = None, stall_factor: float = STALL_FACTOR, stall_min_s: float = STALL_MIN_S):
        self.stall_factor, self.stall_min_s = stall_factor, stall_min_s
        self.device = device
        self.timeout_s = timeout_s
        self.mem_cap_gb = mem_cap_gb
        self.python = python or sys.executable

    def _command(self, spec_path: Path, launch: list[str] | None = None) -> list[str]:
        """The child's argv (a profiler wrapper such as rocprofv3 prefixes it).

        ``launch`` is a launch script's argv (``bash SCRIPT ARGS...``), run
        instead of the harness; its ``python`` commands reach the harness.
        """
        return launch or [self.python, str(HARNESS), str(spec_path)]

    def _shims(self, run_dir: Path, spec_path: Path) -> Path:
        """Write ``RUN_DIR/bin/python`` and ``python3``: this runner's interpreter running the harness."""
        bin_dir = run_dir / "bin"
        bin_dir.mkdir()
        line = " ".join(shlex.quote(a) for a in (self.python, str(HARNESS), "--launched", str(spec_path)))
        for name in _SHIM_NAMES:
            shim = bin_dir / name
            shim.write_text(f"#!/bin/sh\n# Goblin: runs the launched script inside the harness\nexec {line} \"$@\"\n")
            shim.chmod(0o755)
        return bin_dir

    def run(
        self,
        workload: Workload,
        mode: Mode,
        steps: int,
        warmup: int = 2,
        script: Path | None = None,
        env: dict[str, str] | None = None,
        unset_env: list[str] | None = None,
        tap: str | None = None,
        label: str = "",
    ) -> RawRun:
        """Run ``workload`` (or ``script``, a patched copy of its entry) for a step budget.

        Returns
        -------
        RawRun
            ``result`` is the child's :class:`HarnessResult`.  ``ok=False``
            with ``failure`` set when the child timed out, was killed (memory
            cap, signal), exited non-zero, wrote no valid ``result.json`` (the
            file and the field are named), or ended before ``warmup + 1``
            optimizer steps.
        """
        run_dir = goblin_home() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{workload.name}-{mode}{('-' + label) if label else ''}-{uuid.uuid4().hex[:6]}"
        scratch = run_dir / "cwd"
        scratch.mkdir(parents=True)
        program = workload.program(script).resolve()
        kind = entry_kind(program)
        if kind is None:
            return RawRun(ok=False, run_dir=run_dir, mode=mode, failure=(
                f"{program.name}: not a Python script ({', '.join(PYTHON_SUFFIXES)}) or a launch script "
                f"({', '.join(LAUNCH_SUFFIXES)}); nothing was run"))
        spec = {
            "script": str(program),
            "launch_dir": str(program.parent),
            "args": list(workload.args),
            "mode": mode,
            "steps": steps,
            "warmup": warmup,
            "out_dir": str(run_dir),
            "goblin_path": str(GOBLIN_PATH),
            "unit": workload.unit,
            "batch_field": workload.batch_field,
            "mask_field": workload.mask_field,
            "tap": tap,
        }
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
        child_env = scrubbed_env(env, unset_env)
        # A segfault or abort in the child then leaves a Python traceback in the stderr tail.
        child_env.setdefault("PYTHONFAULTHANDLER", "1")
        if self.device == "cpu":
            child_env["CUDA_VISIBLE_DEVICES"] = ""
            child_env["HIP_VISIBLE_DEVICES"] = ""
        launch = None
        if kind == "launch":
            child_env["PATH"] = f"{self._shims(run_dir, run_dir / 'spec.json')}{os.pathsep}{child_env.get('PATH', '')}"
            launch = [shutil.which("bash") or "/bin/bash", str(program), *workload.args]
        stdout_p, stderr_p = run_dir / "stdout.txt", run_dir / "stderr.txt"
        t0 = time.perf_counter()
        with open(stdout_p, "wb") as out, open(stderr_p, "wb") as err:
            proc = subprocess.Popen(
                self._command(run_dir / "spec.json", launch),
                cwd=scratch, env=child_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                preexec_fn=_limit_memory(self.mem_cap_gb),
            )
            watch, stopped = StallWatch(run_dir, self.timeout_s, self.stall_factor, self.stall_min_s), None
            while True:
                try:
                    rc = proc.wait(timeout=watch.poll_s)
                    break
                except subprocess.TimeoutExpired:
                    stopped = watch.check()
                if stopped is not None:  # hung or out of time: every thread's stack first, then stop it
                    dump_stacks(proc.pid, run_dir)
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    rc = proc.wait()
                    break
            timed_out = stopped is not None
        # Data-loader workers left behind by the user's script share the session.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        wall = time.perf_counter() - t0
        stderr_tail = _tail(stderr_p)
        raw = RawRun(ok=False, run_dir=run_dir, mode=mode, stderr_tail=stderr_tail, returncode=rc, wall_s=wall)
        script_name = program.name
        if timed_out:
            hang = read_hang(run_dir, *stopped)
            raw.failure, raw.extra["hang"] = hang_failure(script_name, hang), hang.model_dump()
            return raw
        if rc != 0:
            if rc < 0:
                sig = signal.Signals(-rc).name
                raw.failure = f"{script_name}: killed by {sig}" + (
                    " (as the kernel's out-of-memory killer does when the machine's memory runs out; what held "
                    "memory: not observable)" if sig == "SIGKILL" else "")
            elif OOM_TEXT.search(stderr_tail) or (run_dir / OOM_NAME).is_file():
                raw.failure, state = oom_failure(script_name, stderr_tail, run_dir, self.mem_cap_gb)
                if state is not None:
                    raw.extra["oom"] = state
            else:
                last = [ln for ln in stderr_tail.strip().splitlines() if ln.strip()]
                raw.failure = f"{script_name}: exited with code {rc}" + (f": {last[-1].strip()}" if last else "")
            return raw
        result_p = run_dir / RESULT_NAME
        if not result_p.is_file():
            raw.failure = f"{script_name}: ended without writing results (exit 0)" if kind == "python" else (
                f"{script_name}: the launch script ran no Python script through python/python3, so no step was "
                "measured (a launcher that starts its own interpreters, such as torchrun, accelerate launch or "
                "deepspeed, is not hooked): name the training script as entry: and keep the launch script "
                "under config:")
            return raw
        try:
            raw.result = result = HarnessResult.read(result_p)
        except HarnessResultError as exc:
            raw.failure = f"{script_name}: the harness's results are unreadable: {exc}"
            return raw
        if not result.per_step:
            raw.failure = (
                f"{script_name}: finished after {result.steps_seen} optimizer steps; "
                f"need more than {warmup} warm-up steps (is optimizer.step() called?)"
            )
            return raw
        if not result.reached_budget:
            result.warnings.append(
                f"script ended after {len(result.per_step)} measured steps, before the budget of {steps}")
        raw.ok = True
        return raw

    def fold_metrics(self, raw: RawRun, metrics: RunMetrics) -> None:
        """Nothing to fold: everything a local run measures is in the harness's result and the trace."""
