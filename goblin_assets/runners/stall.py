"""A run that stops making progress: the child's heartbeat and stack dumps, the parent's watch.

Standard library only: the child half runs inside the user's interpreter (the
harness loads this file by its path, as it is run itself), the parent half in
Goblin's.

**Child** (:func:`install`, called by :mod:`goblin_assets.runners.harness`):
registers :func:`faulthandler.register` on :data:`DUMP_SIGNAL` so that the
signal writes the Python stack of every thread to ``RUN_DIR/stacks/<pid>.txt``
(faulthandler's handler is C code run in the signal handler, so it dumps a
process whose threads all block in a lock, a queue or a system call:
https://docs.python.org/3/library/faulthandler.html#dumping-the-traceback-on-a-user-signal);
wraps the DataLoader's worker loop so that each worker process registers its
own file (workers started by ``fork``, Linux's default, run the wrapped loop;
a ``spawn`` or ``forkserver`` worker unpickles its target by name in a fresh
interpreter, so the wrapper pickles as ``goblin_stall_worker.worker_loop``,
the one file of ``spawn_hook/``, which registers the worker's file and runs
torch's loop; a wrapper that pickle could not find would stop every such
DataLoader before its first batch); and appends one heartbeat line per optimizer step
to ``RUN_DIR/progress.txt`` (``<step> <CLOCK_MONOTONIC seconds>``; ``done``
once the step budget is spent, so the loader teardown and the trace export
after it are not mistaken for a stall).

**Parent** (:class:`StallWatch`, polled by
:class:`goblin_assets.runners.local.LocalRunner`): the run has *stalled* when,
after at least :data:`MIN_STEPS_FOR_MEDIAN` steps, no step finished in
``factor`` times the median step interval, and never sooner than ``min_s``
seconds (compilation, a checkpoint save or evaluation legitimately take a few
steps' time); before that only the wall-clock timeout applies.  Then
:func:`dump_stacks` signals the child's process group (the child is a session
leader: ``os.setsid``), waits until the dump files stop growing, and the
runner kills the group.
"""
from __future__ import annotations

import faulthandler
import functools
import os
import signal
import statistics
import time
from pathlib import Path

#: The signal that makes every hooked process of the run write its threads' stacks (SIGUSR2: SIGUSR1 is
#: taken by some launchers, e.g. torchelastic's worker restarts).
DUMP_SIGNAL = signal.SIGUSR2
#: Heartbeat file of the child (one line per optimizer step, then ``done``).
PROGRESS_NAME = "progress.txt"
#: Folder of the stack dumps, one ``<pid>.txt`` per process that answered the signal.
STACKS_DIR = "stacks"
#: A stall is declared when no step finished in this many median step intervals ...
STALL_FACTOR = 20.0
#: ... and never sooner than this many seconds after the last step (compile, checkpoint, evaluation).
STALL_MIN_S = 30.0
#: Steps needed before the median interval is trusted (before that only the timeout applies).
MIN_STEPS_FOR_MEDIAN = 2
#: How long the parent waits for the dumps to be written, seconds.
DUMP_WAIT_S = 3.0

_files: list = []  # the open dump files of this process (kept open for faulthandler's file descriptor)


def _register(out_dir: Path) -> None:
    folder = out_dir / STACKS_DIR
    folder.mkdir(exist_ok=True)
    f = open(folder / f"{os.getpid()}.txt", "w")  # noqa: SIM115 - faulthandler keeps writing to its descriptor
    _files.append(f)
    faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)


class Heartbeat:
    """Appends ``<step> <monotonic s>`` per optimizer step to ``progress.txt`` (an ``O_APPEND`` write, a few us)."""

    def __init__(self, out_dir: Path):
        self.fd = os.open(out_dir / PROGRESS_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def beat(self, step: int) -> None:
        os.write(self.fd, f"{step} {time.monotonic():.6f}\n".encode())

    def done(self) -> None:
        """The step budget is spent: what follows (teardown, trace export) is not watched for a stall."""
        os.write(self.fd, f"done {time.monotonic():.6f}\n".encode())


def install(out_dir: str | Path, worker_module=None) -> Heartbeat:
    """Child side: dump stacks on :data:`DUMP_SIGNAL` here and in DataLoader workers; return the heartbeat.

    ``worker_module`` is ``torch.utils.data._utils.worker`` (passed in: this
    module imports no torch); its ``_worker_loop`` is wrapped so that each
    worker registers its own dump file first.
    """
    out = Path(out_dir)
    _register(out)
    if worker_module is not None and hasattr(worker_module, "_worker_loop"):
        loop = worker_module._worker_loop

        @functools.wraps(loop)  # unless _spawn_target renames it: pickled as torch's own loop
        def _worker_loop(*args, **kwargs):
            try:
                _files.clear()  # the parent's file objects, inherited by fork: not this worker's
                _register(out)
            except OSError:
                pass  # a worker that cannot open its file still loads data
            return loop(*args, **kwargs)

        _spawn_target(_worker_loop, out)
        worker_module._worker_loop = _worker_loop
    return Heartbeat(out)


#: The folder of the worker loop that ``spawn`` and ``forkserver`` workers import (one file, stdlib only).
SPAWN_HOOK_DIR = Path(__file__).with_name("spawn_hook")
SPAWN_HOOK_MODULE = "goblin_stall_worker"


def _spawn_target(wrapper, out: Path) -> None:
    """Make ``wrapper`` pickle as ``goblin_stall_worker.worker_loop`` (spawn_hook/), which a fresh-interpreter
    worker imports and runs: it registers its own dump file, then torch's loop.  The folder goes at the end of
    ``sys.path`` (spawn and forkserver children get the parent's), the run folder and this file's path into
    the environment.  When that cannot be set up, ``wrapper`` keeps torch's name and such a worker runs
    torch's loop unhooked."""
    import importlib
    import sys

    try:
        if str(SPAWN_HOOK_DIR) not in sys.path:
            sys.path.append(str(SPAWN_HOOK_DIR))
        shim = importlib.import_module(SPAWN_HOOK_MODULE)
    except ImportError:
        return
    os.environ[shim.RUN_DIR_ENV] = str(out)
    os.environ[shim.STALL_ENV] = str(Path(__file__).resolve())
    wrapper.__module__, wrapper.__name__, wrapper.__qualname__ = SPAWN_HOOK_MODULE, "worker_loop", "worker_loop"
    shim.worker_loop = wrapper  # pickle checks that the name finds this very object


def read_progress(run_dir: Path) -> tuple[list[float], bool]:
    """(monotonic seconds of each finished optimizer step, whether the budget was spent) from ``progress.txt``."""
    try:
        text = (run_dir / PROGRESS_NAME).read_text()
    except OSError:
        return [], False
    times, done = [], False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue  # a line being written
        if parts[0] == "done":
            done = True
            continue
        try:
            times.append(float(parts[1]))
        except ValueError:
            continue
    return times, done


class StallWatch:
    """Parent side: decides when a child has stalled or timed out (see the module docstring).

    ``timeout_s``: the runner's wall-clock limit; ``factor`` and ``min_s``:
    :data:`STALL_FACTOR` and :data:`STALL_MIN_S` unless the runner says
    otherwise; ``clock``: seconds on ``CLOCK_MONOTONIC`` (the child's
    heartbeat clock; :func:`time.monotonic`).
    """

    def __init__(self, run_dir: Path, timeout_s: float, factor: float = STALL_FACTOR, min_s: float = STALL_MIN_S,
                 clock=time.monotonic):
        self.run_dir, self.timeout_s, self.factor, self.min_s, self.clock = run_dir, timeout_s, factor, min_s, clock
        self.t0 = clock()
        self.steps = 0
        self.last_step_s: float | None = None
        self.median_s: float | None = None

    @property
    def poll_s(self) -> float:
        """How often to look, seconds (a tenth of the smallest limit, between 0.05 and 1)."""
        return max(0.05, min(1.0, self.min_s / 10, self.timeout_s / 10))

    def check(self) -> tuple[str, dict] | None:
        """None while the run progresses; else (``"timeout"`` or ``"stall"``, the facts: seconds, steps, median)."""
        now = self.clock()
        times, done = read_progress(self.run_dir)
        self.steps = len(times)
        if now - self.t0 > self.timeout_s:
            return "timeout", self.facts(now)
        if done or len(times) < MIN_STEPS_FOR_MEDIAN:
            return None
        self.last_step_s = times[-1]
        self.median_s = statistics.median(b - a for a, b in zip(times, times[1:]))
        if now - times[-1] > max(self.factor * self.median_s, self.min_s):
            return "stall", self.facts(now)
        return None

    def facts(self, now: float) -> dict:
        """What the watch knew when it stopped the run: seconds since start and since the last step, steps, median."""
        return {"elapsed_s": now - self.t0, "steps_done": self.steps,
                "since_last_step_s": None if self.last_step_s is None else now - self.last_step_s,
                "median_step_s": self.median_s, "stall_factor": self.factor, "stall_min_s": self.min_s,
                "timeout_s": self.timeout_s}


def dump_stacks(pgid: int, run_dir: Path, wait_s: float = DUMP_WAIT_S) -> list[Path]:
    """Signal the process group ``pgid`` with :data:`DUMP_SIGNAL`; wait until its dump files stop growing.

    Returns the dump files written (``RUN_DIR/stacks/<pid>.txt``, non-empty).
    A process that registered nothing (a shell of a launch script) is ended by
    the signal; the runner kills the group afterwards anyway.
    """
    try:
        os.killpg(pgid, DUMP_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return []
    folder = run_dir / STACKS_DIR
    deadline, sizes = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = {p: p.stat().st_size for p in folder.glob("*.txt")} if folder.is_dir() else {}
        if now and now == sizes and all(now.values()):
            break
        sizes = now
    return sorted(p for p in folder.glob("*.txt") if p.stat().st_size) if folder.is_dir() else []
