"""Build a runner by kind: the one place that knows every Runner implementation.

``runners/base.py`` holds the protocol only and never imports an
implementation; callers that pick a runner by name (the CLI, the settings,
the Dagster runner resources, the audit session) come here.
"""
from __future__ import annotations

import inspect
from typing import Any

from goblin_assets.runners.base import Runner, RunnerError
from goblin_assets.runners.workload import Workload

#: The runner kinds :func:`make_runner` knows, in the order the CLI lists them.
RUNNER_KINDS: tuple[str, ...] = ("local", "rocprof", "replay")


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
