"""The first ten minutes, checked: ``make demo`` is quiet and fast (issue 25's targets).

``python benchmarks/demo_check.py [--install-log FILE] [--max-seconds 300] [--max-lines 60]``

Runs ``make demo`` in this checkout with a fresh ``GOBLIN_HOME`` (a temporary
folder, so it neither reads nor leaves the checkout's ``.goblin``), counts the
lines it prints (stdout and stderr together, as a person sees them) and times
it.  ``--install-log`` adds the lines of the install that preceded it (``.ci/run``
writes the fresh clone's ``make install`` there), so "under 60 lines, install
included" is checked as a new user meets it.  Exits 1, naming the target
missed, when the demo took longer than ``--max-seconds`` after the install,
printed ``--max-lines`` lines or more, failed, or printed a line wider than
100 columns (the summary's width, ``goblin_assets.demo.WIDTH``).

This is a check of whole-command behaviour, not a unit test: it belongs in CI
after the suite (``.ci/run``), where one run costs about 1.5 minutes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTH = 100


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 when every target holds, 1 (with the reasons on stderr) when one is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--install-log", type=Path, help="the preceding install's output, counted with the demo's")
    ap.add_argument("--max-seconds", type=float, default=300.0)
    ap.add_argument("--max-lines", type=int, default=60)
    args = ap.parse_args(argv)
    install_lines = 0
    if args.install_log is not None:
        try:
            install_lines = len(args.install_log.read_text(errors="replace").splitlines())
        except OSError as e:
            print(f"demo_check: {args.install_log}: cannot read the install log ({e.strerror})", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory(prefix="goblin_demo_check_") as home:
        env = {**os.environ, "GOBLIN_HOME": home, "DAGSTER_HOME": str(Path(home) / "dagster")}
        start = time.perf_counter()
        proc = subprocess.run(["make", "--no-print-directory", "demo"], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
    lines = proc.stdout.splitlines()
    sys.stdout.write(proc.stdout)
    wide = [ln for ln in lines if len(ln) > WIDTH]
    total = install_lines + len(lines)
    print(f"demo_check: make demo exit {proc.returncode}, {seconds:.0f} s after the install, {len(lines)} lines "
          f"(+ {install_lines} install lines = {total}; targets < {args.max_lines} lines, "
          f"<= {args.max_seconds:g} s), {len(wide)} lines wider than {WIDTH} columns")
    missed = []
    if proc.returncode != 0:
        missed.append(f"make demo failed (exit {proc.returncode})")
    if seconds > args.max_seconds:
        missed.append(f"took {seconds:.0f} s > {args.max_seconds:g} s")
    if total >= args.max_lines:
        missed.append(f"printed {total} lines >= {args.max_lines}")
    if wide:
        missed.append(f"{len(wide)} lines wider than {WIDTH} columns, the first: {wide[0][:120]!r}")
    for m in missed:
        print(f"demo_check: target missed: {m}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
