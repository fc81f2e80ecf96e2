"""The Runner protocol and the factory that picks an implementation by kind.

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

Every runner's ``run`` returns a :class:`~goblin_assets.runners.local.RawRun`;
a failed or killed child is ``ok=False`` with a reason, never an exception.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from goblin_assets.errors import GoblinError
from goblin_assets.runners.local import Mode, RawRun
from goblin_assets.runners.workload import Workload

#: The runner kinds :func:`make_runner` knows, in the order the CLI lists them.
RUNNER_KINDS: tuple[str, ...] = ("local", "rocprof", "replay")


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


def _runner_class(kind: str) -> type:
    if kind == "local":
        from goblin_assets.runners.local import LocalRunner

        return LocalRunner
    if kind == "rocprof":
        from goblin_assets.runners.rocprof import RocprofRunner

        return RocprofRunner
    if kind == "replay":
        from goblin_assets.runners.replay import ReplayRunner

        return ReplayRunner
    raise RunnerError(f"runner kind {kind!r}: unknown (choose one of {', '.join(RUNNER_KINDS)})")


def make_runner(kind: str = "local", **settings: Any) -> Runner:
    """Build the runner of ``kind`` with its constructor settings.

    Parameters
    ----------
    kind:
        ``local``, ``rocprof`` or ``replay``.
    **settings:
        Constructor arguments of that runner, e.g. ``device`` (``auto``,
        ``cpu``, ``cuda``), ``timeout_s`` (seconds), ``mem_cap_gb`` (GB; the
        child's address-space cap), ``recording`` (replay: the
        ``cached_metrics.json`` to read). All three runners take ``device``,
        ``timeout_s`` and ``mem_cap_gb``, so a resource can pass the same
        settings whatever the kind.

    Returns
    -------
    Runner

    Raises
    ------
    RunnerError
        Unknown ``kind``, or a setting that runner does not take (both named).
    ToolMissingError
        ``rocprof`` on a machine without ``rocprofv3`` on PATH.
    """
    cls = _runner_class(kind)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise RunnerError(f"runner kind {kind!r}: unknown setting(s) {', '.join(unknown)} "
                          f"(accepted: {', '.join(sorted(accepted))})")
    return cls(**settings)


def runner_for(workload: Workload, runner: Runner) -> Runner:
    """``runner``, or for a replay workload (nothing to run: ``Workload.replay``) the replay runner on its recording.

    The runner is chosen per workload: a folder with ``cached_metrics.json``
    and no ``workload.yaml`` is always replayed, whatever ``runner`` is, so
    its config file is never run as a script.  ``device``, ``timeout_s`` and
    ``mem_cap_gb`` carry over.
    """
    if not workload.replay or runner.kind == "replay":
        return runner
    return make_runner("replay", recording=workload.root / (workload.recording or ""),
                       **{k: getattr(runner, k) for k in ("device", "timeout_s", "mem_cap_gb") if hasattr(runner, k)})
