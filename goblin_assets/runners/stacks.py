"""A hung run, told by where each thread waits: the stack dumps of :mod:`goblin_assets.runners.stall` read back.

Each process of the run that answered the dump signal wrote faulthandler's
text (``RUN_DIR/stacks/<pid>.txt``: per thread a ``Thread 0x... (most recent
call first):`` header and ``File "...", line N in NAME`` frames; the format of
https://docs.python.org/3/library/faulthandler.html).  :func:`read_hang` parses
them into a :class:`HangState`: per process its role (the training process,
a DataLoader worker), per thread the user's innermost frame (``file:line``
and its source line, from the file on disk) and the *kind of wait*,
classified from the innermost frames and that source line (:func:`wait_kind`):

- ``collective``: a frame in ``torch/distributed`` (a barrier, all-reduce, ...
  that some rank never joined);
- ``DataLoader worker queue``: the main process inside the DataLoader waiting
  for a worker's batch, or a worker waiting for indices;
- ``queue``, ``lock`` (a lock, condition, event or ``threading.Barrier``),
  ``join`` (a thread or process join), ``I/O`` (sockets, pipes, files,
  ``select``), ``sleep``;
- ``running``: no wait seen (a busy loop, or a C call the dump cannot see
  into: the source line is shown).

:func:`hang_failure` is the run's one-line failure: what stopped it (the
stall watch or the timeout), then where the main thread of the training
process waits.  faulthandler shows Python frames only: a wait inside C code
is classified by the Python line that called it.
"""
from __future__ import annotations

import json
import linecache
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from goblin_assets.runners.stall import STACKS_DIR

#: The parent's record of a hang, written next to the dumps.
HANG_NAME = "hang.json"

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)(?: \[([^\]]*)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')

WaitKind = Literal["collective", "DataLoader worker queue", "queue", "lock", "join", "I/O", "sleep", "running"]

#: Source-line patterns of a call into C that blocks (the innermost Python frame is the caller's line).
_LINE_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("sleep", re.compile(r"\bsleep\(")),
    ("queue", re.compile(r"\.get(_nowait)?\(|\.put\(")),
    ("join", re.compile(r"\.join\(")),
    ("lock", re.compile(r"\.acquire\(|\.wait\(|with\s+\w*(lock|cond|sem)\w*\s*:", re.IGNORECASE)),
    ("I/O", re.compile(r"\.(recv|recv_into|read|readline|readlines|accept|connect|write|send)\(|\bselect\(|"
                       r"\binput\(|urlopen\(|\bopen\(")),
)
#: Standard-library modules whose frames are a wait of the given kind (innermost first wins).
#: ``threading`` frames of a thread's start (below its target: never the wait).
_THREAD_START = ("_bootstrap", "_bootstrap_inner", "run")
_MODULE_KINDS: tuple[tuple[str, str], ...] = (
    ("queue.py", "queue"), ("multiprocessing/queues.py", "queue"),
    ("multiprocessing/connection.py", "I/O"), ("selectors.py", "I/O"), ("socket.py", "I/O"), ("ssl.py", "I/O"),
    ("subprocess.py", "join"), ("multiprocessing/popen_fork.py", "join"),
    ("threading.py", "lock"), ("multiprocessing/synchronize.py", "lock"),
)


class ThreadStack(BaseModel):
    """One thread of a dumped process: frames innermost first (``path:line in function``), and its wait.

    ``main``: the process's main thread (its stack does not start in
    ``threading``'s bootstrap); ``user_line``: the innermost frame in the
    user's files (``train.py:17``, None when no frame is); ``user_code``: that
    line's source; ``wait``: :data:`WaitKind`; ``wait_detail``: the frame the
    kind was read from (``queue.py:171 in get``).
    """

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    main: bool
    frames: list[str]
    user_line: str | None = None
    user_code: str = ""
    wait: WaitKind
    wait_detail: str = ""


class ProcessStack(BaseModel):
    """The threads of one process that answered the dump signal; ``role``: training process or DataLoader worker."""

    model_config = ConfigDict(extra="forbid")

    pid: int
    role: Literal["training process", "DataLoader worker", "other"]
    threads: list[ThreadStack]


class HangState(BaseModel):
    """What the runner knew when it stopped a run that made no progress (``RUN_DIR/hang.json``).

    ``stopped_by``: ``stall`` (no step in ``stall_factor`` x the median step
    interval, at least ``stall_min_s``) or ``timeout`` (the wall-clock
    limit); seconds ``elapsed_s``, ``since_last_step_s`` and
    ``median_step_s`` (None before two steps); ``steps_done``: optimizer
    steps finished (warm-up counted); ``processes``: each dumped process.
    """

    model_config = ConfigDict(extra="forbid")

    stopped_by: Literal["stall", "timeout"]
    elapsed_s: float
    steps_done: int
    since_last_step_s: float | None = None
    median_step_s: float | None = None
    stall_factor: float
    stall_min_s: float
    timeout_s: float
    processes: list[ProcessStack] = Field(default_factory=list)

    def main_thread(self) -> ThreadStack | None:
        """The training process's main thread (where the optimizer steps stopped coming from)."""
        for p in self.processes:
            if p.role == "training process":
                for t in p.threads:
                    if t.main:
                        return t
        return None

    def waits(self) -> list[tuple[ProcessStack, ThreadStack]]:
        """Every main thread and every thread in the user's code, the training process's main thread first."""
        out = [(p, t) for p in self.processes for t in p.threads if t.main or t.user_line]
        return sorted(out, key=lambda pt: (pt[0].role != "training process", not pt[1].main))

    def kinds(self) -> set[str]:
        """The kinds of wait seen in any thread of any process."""
        return {t.wait for p in self.processes for t in p.threads}


def _frame_text(path: str, line: int, name: str) -> str:
    return f"{path}:{line} in {name}"


def wait_kind(frames: list[tuple[str, int, str]], user_dirs: list[str]) -> tuple[str, str, str | None, str]:
    """(kind, detail, user ``file:line``, its source) of one thread's frames (innermost first: path, line, name).

    The library frames inside the user's innermost frame decide, outermost
    first (the API the user called: ``queue.get`` before the
    ``threading.Condition.wait`` it calls): ``torch/distributed``, the
    DataLoader, then :data:`_MODULE_KINDS`.  With none of those, the
    innermost frame called into C, and its source line decides
    (:data:`_LINE_KINDS`: ``time.sleep(``, ``.acquire(``, ``.recv(``, ...).
    """
    u = next((i for i, (p, _, _) in enumerate(frames) if any(p.startswith(d) for d in user_dirs)), None)
    user = frames[u] if u is not None else None
    user_line = f"{Path(user[0]).name}:{user[1]}" if user else None
    code = linecache.getline(user[0], user[1]).strip() if user else ""
    lib = frames[:u] if u is not None else frames  # the library frames inside the user's call, innermost first
    lib = [(p, n, f) for p, n, f in lib if not (p.endswith("threading.py") and f in _THREAD_START)]
    for p, n, f in reversed(lib):  # the API the user called first: queue.get before threading's Condition.wait
        norm = p.replace("\\", "/")
        if "/torch/distributed/" in norm:
            return "collective", _frame_text(Path(p).name, n, f), user_line, code
        if norm.endswith(("torch/utils/data/dataloader.py", "torch/utils/data/_utils/worker.py")):
            return "DataLoader worker queue", _frame_text(Path(p).name, n, f), user_line, code
    for p, n, f in reversed(lib):
        norm = p.replace("\\", "/")
        for mod, kind in _MODULE_KINDS:
            if norm.endswith("/" + mod):
                return kind, _frame_text(Path(p).name, n, f), user_line, code
    if frames:  # the innermost frame called into C: its source line tells what it waits for
        p, n, _ = frames[0]
        src = linecache.getline(p, n)
        for kind, pat in _LINE_KINDS:
            if pat.search(src):
                return kind, f"{Path(p).name}:{n}: {src.strip()}", user_line, code
    return "running", "", user_line, code


def parse_dump(text: str, pid: int, user_dirs: list[str]) -> ProcessStack:
    """One process's faulthandler dump as a :class:`ProcessStack` (threads in the dump's order)."""
    threads: list[tuple[str, list[tuple[str, int, str]]]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append((m.group(2), []))
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1][1].append((f.group(1), int(f.group(2)), f.group(3)))
    out, role = [], "other"
    for tid, frames in threads:
        names = [(Path(p).name, fn) for p, _, fn in frames]
        if ("worker.py", "_worker_loop") in names:
            role = "DataLoader worker"  # a forked worker's main thread still holds the parent's frames below
        elif role == "other" and ("harness.py" in {n for n, _ in names} or ("<module>" in {fn for _, fn in names})):
            role = "training process"
        kind, detail, user_line, code = wait_kind(frames, user_dirs)
        out.append(ThreadStack(thread_id=tid, main=("threading.py", "_bootstrap") not in names,
                               frames=[_frame_text(p, n, fn) for p, n, fn in frames], user_line=user_line,
                               user_code=code, wait=kind, wait_detail=detail))
    return ProcessStack(pid=pid, role=role, threads=out)


def user_dirs_of(run_dir: Path) -> list[str]:
    """The folders whose files are the user's: the script's and the launch script's (from ``spec.json``)."""
    try:
        spec = json.loads((run_dir / "spec.json").read_text())
    except (OSError, ValueError):
        return []
    dirs = {str(Path(spec["script"]).parent) + "/", str(Path(spec.get("launch_dir", "")).resolve()) + "/"}
    return sorted(d for d in dirs if d != "/")


def read_hang(run_dir: Path, stopped_by: str, facts: dict) -> HangState:
    """The :class:`HangState` of a stopped run from its dumps (``RUN_DIR/stacks/*.txt``), written to ``hang.json``."""
    dirs = user_dirs_of(run_dir)
    procs = []
    for p in sorted((run_dir / STACKS_DIR).glob("*.txt")) if (run_dir / STACKS_DIR).is_dir() else []:
        text = p.read_text(errors="replace")
        if text.strip() and p.stem.isdigit():
            procs.append(parse_dump(text, int(p.stem), dirs))
    procs.sort(key=lambda ps: (ps.role != "training process", ps.pid))
    state = HangState(stopped_by=stopped_by, processes=procs, **facts)
    (run_dir / HANG_NAME).write_text(state.model_dump_json(indent=1), encoding="utf-8")
    return state


def _secs(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def wait_text(t: ThreadStack) -> str:
    """``waits in a queue at train.py:17 (`batch = q.get()`)``; ``runs train.py:9`` for a thread that does not wait."""
    where = t.user_line or (t.frames[0].rsplit("/", 1)[-1] if t.frames else "no Python frame")
    code = f" (`{t.user_code}`)" if t.user_code else ""
    what = {"collective": "in a collective", "DataLoader worker queue": "on the DataLoader's worker queue",
            "queue": "on a queue", "lock": "on a lock", "join": "in a join", "I/O": "in I/O",
            "sleep": "in a sleep"}.get(t.wait)
    return f"waits {what} at {where}{code}" if what else f"was running at {where}{code} (no wait seen)"


def hang_failure(script: str, state: HangState) -> str:
    """The one-line failure of a hung run: what stopped it, after which step, and where the main thread waits."""
    if state.stopped_by == "stall":
        why = (f"hung: no optimizer step finished in {_secs(state.since_last_step_s)} s after step "
               f"{state.steps_done} ({state.stall_factor:g} x the median step time of "
               f"{_secs(state.median_step_s)} s, at least {state.stall_min_s:g} s)")
    else:
        why = f"timed out after {state.timeout_s:.0f} s (wall-clock limit) after {state.steps_done} optimizer steps"
    main = state.main_thread()
    if main is None:
        return f"{script}: {why}; no stack dump came back (a process that registered no handler, or none left)"
    n = len(state.processes)
    others = [f"{p.role} {p.pid} {wait_text(t)}" for p, t in state.waits()
              if t is not main and t.user_line and p.role != "other"][:2]
    return (f"{script}: {why}; the main thread {wait_text(main)}" + "".join(f"; {o}" for o in others)
            + f" ({n} process{'es' if n != 1 else ''} dumped)")
