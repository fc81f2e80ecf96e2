"""``make ui``: ``dagster dev`` in a process group of its own, stopped as a whole by one Ctrl-C or SIGTERM.

    python -m goblin_assets.ui [--host 127.0.0.1] [--port 3000] [--workspace workspace.yaml]

``dagster dev`` starts a code server (and its gRPC child), the webserver and the daemon, and maps
SIGTERM onto whatever SIGINT does.  A process started with SIGINT ignored (a background job of a
non-interactive shell, some process supervisors) keeps it ignored across ``exec``, so all five then
ignore SIGINT *and* SIGTERM and only SIGKILL ends them.  This launcher:

* catches SIGINT and SIGTERM itself, so the child starts with both at their default (a caught
  signal's handler is reset at ``exec``, an ignored one is not);
* starts ``dagster dev`` with ``start_new_session`` (its own process group, as
  :mod:`goblin_assets.stack` starts its servers), so one signal reaches every process it started,
  run workers and step processes of a run in progress included;
* on the first SIGINT or SIGTERM stops that group the way the stack stops its servers
  (:func:`goblin_assets.stack._stop`: SIGTERM to the group, SIGKILL after :data:`GRACE_S`), then
  stops any member that outlived the leader; a second signal SIGKILLs the group at once.

It exits with ``dagster dev``'s exit status: 0 after a clean stop, 128 + N when signal N ended it.
The Makefile runs it with ``exec``, so it is the process ``make ui`` runs.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from goblin_assets.stack import _stop

#: Seconds ``dagster dev`` gets to shut its services down after SIGTERM before the group is SIGKILLed
#: (measured here: the five processes are gone 1.5 s after SIGTERM; dagster dev itself waits up to 60 s
#: for a child that does not answer its shutdown pipe).
GRACE_S = 15.0
#: Seconds a group member that outlived the leader gets after its own SIGTERM, before SIGKILL.
STRAGGLER_S = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def dagster_dev_command(host: str, port: int, workspace: str = "workspace.yaml") -> list[str]:
    """The ``dagster dev`` command line ``make ui`` runs, in this interpreter."""
    return [sys.executable, "-m", "dagster", "dev", "-w", workspace, "-h", host, "-p", str(port)]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed user: still there
        return True


def stop_group(proc: subprocess.Popen, grace: float = GRACE_S, straggler: float = STRAGGLER_S) -> int:
    """Stop the process group led by ``proc`` (started with ``start_new_session``); its exit status.

    SIGTERM to the group and SIGKILL after ``grace`` seconds when the leader has not exited
    (:func:`goblin_assets.stack._stop`); then members that outlived the leader get SIGTERM and,
    after ``straggler`` seconds, SIGKILL.  Returns ``proc``'s return code (negative: the signal that
    ended it, as :attr:`subprocess.Popen.returncode`).
    """
    _stop([proc], grace=grace)
    pgid = proc.pid
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + straggler
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return proc.returncode


def serve(cmd: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
          grace: float = GRACE_S) -> int:
    """Run ``cmd`` in a new session until it exits or this process gets SIGINT/SIGTERM; an exit status.

    Returns ``cmd``'s own status when it exits by itself or stops cleanly after the signal (0 for a
    ``dagster dev`` that shut down), 128 + N when signal N ended it (SIGKILL after ``grace``: 137).
    The signal handlers in place before the call are restored.
    """
    got: list[int] = []
    proc: subprocess.Popen | None = None

    def on_signal(signum, _frame):
        # the handler only records: raising here could interrupt Popen between fork and return
        got.append(signum)
        if len(got) > 1 and proc is not None:  # a second Ctrl-C: no more waiting
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, start_new_session=True)
        while not got:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
        rc = stop_group(proc, grace=grace if got else 0.0)  # exited by itself: nothing of its group outlives it
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str] | None = None) -> int:
    """``python -m goblin_assets.ui``: ``dagster dev`` on the project's workspace until Ctrl-C or SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m goblin_assets.ui", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=3000)
    ap.add_argument("--workspace", default="workspace.yaml", help="the workspace file (default workspace.yaml)")
    a = ap.parse_args(argv)
    return serve(dagster_dev_command(a.host, a.port, a.workspace))


if __name__ == "__main__":
    raise SystemExit(main())
