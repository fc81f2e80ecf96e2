"""The Runner protocol (implementations are built by kind in :mod:`goblin_assets.runners.factory`).

Three runners stand behind one interface (DESIGN.md "Layers"; STYLE.md: an
abstract interface with a real and a replay implementation makes the
pipeline testable without a GPU):

* ``local`` (:class:`~goblin_assets.runners.local.LocalRunner`): the installed
  torch on cpu, cuda or ROCm, in a child process with a step budget;
* ``rocprof`` (:class:`~goblin_assets.runners.rocprof.RocprofRunner`): the same
  child wrapped in ``rocprofv3`` (kernel + HIP API trace) while ``amd-smi``
  is polled for utilisation and VRAM;
* ``replay`` (:class:`~goblin_assets.runners.replay.ReplayRunner`): a recorded
  RunMetrics from ``cached_metrics.json``, labelled as replayed.

Every runner's ``run`` returns a :class:`~goblin_assets.runners.result.RawRun`;
a failed or killed child is ``ok=False`` with a reason, never an exception.
Each runner then folds its own findings (rocprofv3 kernels, amd-smi samples)
into the RunMetrics that ``profile_run`` built from the trace, through
:meth:`Runner.fold_metrics`.  This module imports no implementation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from goblin_assets.contracts import RunMetrics
from goblin_assets.errors import GoblinError
from goblin_assets.runners.result import Mode, RawRun
from goblin_assets.runners.workload import Workload


class RunnerError(GoblinError):
    """A runner cannot be built: unknown kind or a setting it does not take."""


class ToolMissingError(RunnerError):
    """A profiler or monitoring tool the runner needs is not installed (names the tool)."""

    def __init__(self, tool: str, hint: str = ""):
        self.tool = tool
        super().__init__(f"{tool}: not found on PATH" + (f"; {hint}" if hint else ""))


@runtime_checkable
class Runner(Protocol):
    """Runs a workload for a step budget and returns what the child left behind.

    ``kind`` names the implementation (``local``, ``rocprof``, ``replay``).
    """

    kind: str

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
        """Run ``workload`` (or ``script``, a patched copy of its entry) for ``warmup + steps`` optimizer steps.

        Parameters
        ----------
        workload:
            The workload folder (entry script, unit, batch fields).
        mode:
            ``profile`` (torch.profiler on the measured steps), ``benchmark``
            (timed, no profiler) or ``sketch`` (an on-device tap).
        steps, warmup:
            Measured optimizer steps, and unmeasured ones before them.
        script, env, unset_env:
            A patched entry script and environment changes for this run.
        tap:
            ``module:Class`` of the tap for ``sketch`` mode.
        label:
            Appended to the run folder's name.

        Returns
        -------
        RawRun
            ``ok=False`` with ``failure`` naming the script and the reason
            when the child timed out, was killed, exited non-zero or ended
            before its warm-up.
        """
        ...

    def fold_metrics(self, raw: RawRun, metrics: RunMetrics) -> None:
        """Fold this runner's own findings in ``raw`` into ``metrics``, in place.

        ``metrics`` is what ``profile_run`` built from the harness's result
        and the Chrome trace of ``raw`` (an ``ok`` profile run).  The local
        runner adds nothing; the rocprof runner replaces utilisation, top
        kernels and VRAM figures with its rocprofv3/amd-smi ones.  A runner
        whose ``run`` returns finished RunMetrics (``RawRun.metrics``: the
        replay runner) is never asked: ``profile_run`` returns those as they
        are.
        """
        ...
