"""The local runner: the user's script in a child process with the installed torch.

Works on ``cpu``, ``cuda`` and ROCm (ROCm builds use the ``torch.cuda`` API;
``torch.version.hip`` tells them apart).  The child is
:mod:`goblin_assets.runners.harness`; it gets a step budget (no edit of the
script), a wall-clock timeout, an address-space cap, a scrubbed environment
and a scratch working directory.  A child that hangs, runs out of memory,
crashes, exits non-zero or leaves a malformed ``result.json`` yields a
:class:`~goblin_assets.runners.result.RawRun` with ``ok=False``, the reason and
the tail of its stderr: never an exception from deep inside.
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from goblin_assets import goblin_home
from goblin_assets.contracts import RunMetrics
from goblin_assets.runners.result import RESULT_NAME, HarnessResult, HarnessResultError, Mode, RawRun
from goblin_assets.runners.workload import Workload

#: The child harness, run by file path so that the user's interpreter needs nothing of Goblin installed.
HARNESS = Path(__file__).resolve().with_name("harness.py")
#: The folder holding the ``goblin_assets`` package (a sketch run's tap is imported from it).
GOBLIN_PATH = Path(__file__).resolve().parents[2]

#: Environment variables never passed to user code (credentials and tokens).
_SECRET_ENV = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY|^AWS_|^AZURE_|^GOOGLE_|^GCP_|^HF_TOKEN|^WANDB_API)",
    re.IGNORECASE,
)

#: stderr text of an allocation that failed: Python, torch's CPU allocator (ENOMEM), CUDA/HIP.
_OOM = re.compile(r"MemoryError|out of memory|can't allocate memory|Cannot allocate memory", re.IGNORECASE)


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
    """

    kind = "local"

    def __init__(self, device: str = "auto", timeout_s: float = 600.0, mem_cap_gb: float | None = 16.0,
                 python: str | None = None):
        self.device = device
        self.timeout_s = timeout_s
        self.mem_cap_gb = mem_cap_gb
        self.python = python or sys.executable

    def _command(self, spec_path: Path) -> list[str]:
        """The child's argv (a profiler wrapper such as rocprofv3 prefixes it)."""
        return [self.python, str(HARNESS), str(spec_path)]

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
        spec = {
            "script": str((script or workload.script).resolve()),
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
        stdout_p, stderr_p = run_dir / "stdout.txt", run_dir / "stderr.txt"
        t0 = time.perf_counter()
        with open(stdout_p, "wb") as out, open(stderr_p, "wb") as err:
            proc = subprocess.Popen(
                self._command(run_dir / "spec.json"),
                cwd=scratch, env=child_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                preexec_fn=_limit_memory(self.mem_cap_gb),
            )
            try:
                rc = proc.wait(timeout=self.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
        # Data-loader workers left behind by the user's script share the session.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        wall = time.perf_counter() - t0
        stderr_tail = _tail(stderr_p)
        raw = RawRun(ok=False, run_dir=run_dir, mode=mode, stderr_tail=stderr_tail, returncode=rc, wall_s=wall)
        script_name = Path(spec["script"]).name
        if timed_out:
            raw.failure = f"{script_name}: timed out after {self.timeout_s:.0f} s (wall-clock limit)"
            return raw
        if rc != 0:
            if rc < 0:
                sig = signal.Signals(-rc).name
                raw.failure = f"{script_name}: killed by {sig}" + (
                    " (memory cap or out of memory)" if sig == "SIGKILL" else "")
            elif _OOM.search(stderr_tail):
                raw.failure = f"{script_name}: ran out of memory (cap {self.mem_cap_gb} GB)"
            else:
                last = [ln for ln in stderr_tail.strip().splitlines() if ln.strip()]
                raw.failure = f"{script_name}: exited with code {rc}" + (f": {last[-1].strip()}" if last else "")
            return raw
        result_p = run_dir / RESULT_NAME
        if not result_p.is_file():
            raw.failure = f"{script_name}: ended without writing results (exit 0)"
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
