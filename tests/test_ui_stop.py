"""``make ui`` stops as a whole on one SIGTERM or one SIGINT (goblin_assets/ui.py).

Runs the Makefile's own ``ui`` target (``make -o .venv/.installed ui``: the install step is taken as
done) on a free loopback port with a temporary ``DAGSTER_HOME``, started as a background job of a
non-interactive shell starts it: with SIGINT ignored, which ``dagster dev`` and its children used to
inherit and keep (they then ignored SIGTERM too and only SIGKILL ended them).  Once the webserver
answers HTTP, one signal goes to the process make runs (the launcher); every process of make's
session and of dagster's process group must be gone within the bound, ``dagster dev`` must have
shut down by itself (exit 0: not SIGKILLed after the launcher's grace) and make must exit 0.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from goblin_assets import ui
from tests.test_ui_browser import _free_port

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists() or shutil.which("make") is None,
                                 reason="needs make and Linux's /proc")]

#: Seconds every process may take to be gone after the signal: the launcher's grace for dagster dev plus
#: its bound for stragglers (it SIGKILLs after them), and scheduling slack on a loaded 2-core machine.
BOUND_S = ui.GRACE_S + ui.STRAGGLER_S + 10.0


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, process group, session) of a live, non-zombie process; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2:].split()
    return None if f[0] in ("Z", "X") else (f[0], int(f[1]), int(f[2]), int(f[3]))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _processes(*, sessions: set[int] = frozenset(), parent: int | None = None) -> dict[int, str]:
    """Live processes in one of ``sessions`` or (with ``parent``) children of it: pid -> command line."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None and (st[3] in sessions or st[1] == parent):
            out[int(d)] = _cmdline(int(d))
    return out


def _wait_for(what: str, fn, timeout: float, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:.0f} s; make ui's output:\n{log.read_text(errors='replace')[-3000:]}")


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_make_ui_stops_on_one_signal(tmp_path, sig):
    import dagster as dg

    home = tmp_path / "home"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dg.DagsterInstance.from_config(str(dagster_home)).dispose()  # its storage, created before dagster dev opens it
    port = _free_port()
    env = {**os.environ, "GOBLIN_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
    log = tmp_path / "make_ui.log"
    with open(log, "wb") as out:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "ui", f"UI_PORT={port}",
             f"BIN={Path(sys.executable).parent}"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    sessions = {make.pid}
    try:
        launcher = _wait_for("make started the launcher", lambda: next(
            (p for p, cmd in _processes(parent=make.pid).items() if "goblin_assets.ui" in cmd), None), 30, log)
        dev = _wait_for("the launcher started dagster dev", lambda: next(iter(_processes(parent=launcher)), None),
                        30, log)
        sessions.add(dev)   # the launcher's child leads a session of its own
        _wait_for("the webserver answered HTTP", lambda: _answers(f"http://127.0.0.1:{port}/server_info"), 120, log)
        before = _processes(sessions=sessions)
        cmds = " | ".join(before.values())
        assert "dagster_webserver" in cmds and "dagster._daemon" in cmds and "code-server" in cmds, cmds
        os.kill(launcher, sig)
        t0 = time.monotonic()
        while (left := _processes(sessions=sessions) | {p: c for p, c in before.items() if _stat(p)}) \
                and time.monotonic() - t0 < BOUND_S:
            time.sleep(0.2)
        assert not left, f"still running {BOUND_S:.0f} s after {sig.name}: {left}"
        rc = make.wait(timeout=10)
        text = log.read_text(errors="replace")
        assert rc == 0, f"make ui exited {rc} (dagster dev did not stop by itself):\n{text[-3000:]}"
        assert "Dagster services shut down" in text, text[-3000:]
    finally:
        for s in sessions:
            try:
                os.killpg(s, signal.SIGKILL)
            except ProcessLookupError:
                pass
        make.wait()
