"""The install lock: write ``requirements.lock`` from an environment, and check an environment against it.

``requirements.lock`` (repository root) is a pip constraints file: one ``name==version``
line for every distribution that ``make install-test`` puts into ``.venv``, the project
itself (``goblin-assets``, installed editable) excepted.  The Makefile passes it to every
install step (``pip install -c requirements.lock ...``), ``make lock`` rewrites it from a
throwaway venv built by the same steps without constraints, and ``make test`` runs::

    python -m goblin_assets.lockcheck            # check this interpreter against the lock
    python -m goblin_assets.lockcheck --write F  # write the lock F from this interpreter

before pytest, so that a venv that drifted from the lock fails loudly, naming each package,
instead of failing (or passing) tests for reasons nobody pinned.

Local version labels: a PEP 440 local label (``2.13.0+cpu``, ``+cu128``, ``+rocm6.4``) names
a build of a release, not a release, and PyPI serves none.  The lock records the release
(``torch==2.13.0``) and a comment naming the build it was made with; a locked version without
a label matches any build of that release, as pip's own ``==`` does, so the pinned CPU wheel
(and a CUDA or ROCm build of the same release installed into ``.venv`` first) satisfies both
pip and this check.  A locked version that carries a label must match it exactly.

Standard library only: the check must run (and explain itself) in an environment where the
heavy dependencies are missing or broken, so it imports neither dagster nor duckdb.
"""
from __future__ import annotations

import argparse
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

#: The lock file at the repository root.
DEFAULT_LOCK = Path(__file__).resolve().parent.parent / "requirements.lock"
#: Never locked: the project itself, installed editable from the checkout.
PROJECT = "goblin-assets"

HEADER = """\
# requirements.lock: the exact version of every distribution that `make install-test`
# installs into .venv (the project itself, goblin-assets, excepted): the versions the test
# suite runs with. pip constraints format: the Makefile installs with `pip install -c requirements.lock`
# (`make demo` and `make test`), and `make test` first checks .venv against it
# (`python -m goblin_assets.lockcheck`), naming every package that differs or is missing.
# Refresh it deliberately with `make lock` (a throwaway venv, the same install steps without
# constraints), then run `make test` before committing it; do not edit it by hand.
# Local version labels (+cpu, +cu128, +rocm...) are dropped: `torch==2.13.0` is the release,
# which any build of it satisfies; the build this lock was made with is named in a comment.
"""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it: ``PyYAML`` and ``typing_extensions`` -> ``pyyaml``, ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> str:
    """``version`` without its PEP 440 local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


def matches(locked: str, installed: str) -> bool:
    """Whether ``installed`` satisfies ``==locked``: a lock without a local label accepts any build of its release."""
    if "+" in locked:
        return installed == locked
    return release(installed) == locked


@dataclass(frozen=True)
class Disagreement:
    """One locked package that the environment does not satisfy; ``installed`` is None when it is missing."""

    name: str
    locked: str
    installed: str | None

    def line(self) -> str:
        if self.installed is None:
            return f"  {self.name}: missing (locked {self.locked})"
        return f"  {self.name}: installed {self.installed}, locked {self.locked}"


def parse_lock(text: str) -> dict[str, tuple[str, str]]:
    """``{canonical name: (name as written, version)}`` from a lock's text; comments and blank lines are skipped.

    Raises ValueError, naming the line, on anything but ``name==version``.
    """
    out: dict[str, tuple[str, str]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)", line)
        if not m:
            raise ValueError(f"line {n}: expected 'name==version', got {raw.strip()!r}")
        key = canonical(m.group(1))
        if key in out:
            raise ValueError(f"line {n}: {m.group(1)} is locked twice")
        out[key] = (m.group(1), m.group(2))
    return out


def installed_versions() -> dict[str, tuple[str, str]]:
    """``{canonical name: (name, version)}`` of every distribution this interpreter sees, first on sys.path winning (as pip)."""
    out: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), (name, dist.version))
    return out


def compare(locked: dict[str, tuple[str, str]], installed: dict[str, tuple[str, str]]) -> list[Disagreement]:
    """Every locked package that is missing or at another version, sorted by name; installed extras are ignored."""
    bad = []
    for key, (name, version) in sorted(locked.items()):
        have = installed.get(key)
        if have is None:
            bad.append(Disagreement(name, version, None))
        elif not matches(version, have[1]):
            bad.append(Disagreement(name, version, have[1]))
    return bad


def report(bad: list[Disagreement], lock: Path, n_locked: int) -> str:
    """What the check prints: one line per package, then how to fix either side."""
    if not bad:
        return f"lockcheck: all {n_locked} locked packages match {sys.prefix} ({lock.name})"
    lines = [f"lockcheck: FAILED: {len(bad)} of {n_locked} packages in {sys.prefix} disagree with {lock}:"]
    lines += [d.line() for d in bad]
    lines += [f"Install the locked versions: touch {lock.name} && make install-test (or: rm -rf .venv && make install-test)",
              "or, to accept the environment's versions deliberately, refresh the lock: make lock"]
    return "\n".join(lines)


def render_lock(installed: dict[str, tuple[str, str]]) -> str:
    """The lock's text for ``installed``: the header, then ``name==release`` sorted by name, the project left out."""
    body, builds = [], []
    for key, (name, version) in sorted(installed.items()):
        if key == PROJECT:
            continue
        body.append(f"{name}=={release(version)}")
        if release(version) != version:
            builds.append(f"{name} {version}")
    made = f"# Made with Python {platform.python_version()} on {platform.system()} {platform.machine()}"
    made += f"; builds: {', '.join(builds)}.\n" if builds else ".\n"
    return HEADER + made + "\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m goblin_assets.lockcheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", type=Path, default=DEFAULT_LOCK, help="the lock file (default: %(default)s)")
    ap.add_argument("--write", type=Path, metavar="FILE", help="write the lock FILE from this environment instead of checking")
    args = ap.parse_args(argv)
    if args.write is not None:
        installed = installed_versions()
        args.write.write_text(render_lock(installed))
        print(f"lockcheck: wrote {len(installed) - (PROJECT in installed)} packages to {args.write}")
        return 0
    try:
        locked = parse_lock(args.lock.read_text())
    except (OSError, ValueError) as exc:
        print(f"lockcheck: FAILED: cannot read {args.lock}: {exc}", file=sys.stderr)
        return 2
    bad = compare(locked, installed_versions())
    print(report(bad, args.lock, len(locked)), file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
