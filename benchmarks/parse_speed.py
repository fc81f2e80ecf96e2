"""Warm `goblin parse` time per config case, against the 2 s target (moved here from tests/test_config_cases.py).

Every case under ``tests/data/configs`` (and its held-aside folders) is parsed
once cold (imports, caches) and then ``--repeats`` times warm, in this process.
Prints the slowest warm parse with its case, the median warm parse, the
ratio cold / warm median (how much the first parse pays for imports and
caches, measured in the same run), and whether the slowest meets the target.

    .venv/bin/python benchmarks/parse_speed.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
#: The warm-parse target (seconds per file) the config cases were held to.
TARGET_S = 2.0


def cases() -> list[Path]:
    """Every case folder (it holds ``expected.yaml``) under the repository's config cases."""
    return sorted(p.parent for p in (REPO / "tests" / "data" / "configs").rglob("expected.yaml"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    from goblin_assets.config.parse import parse_config

    found = cases()
    entries = [c / yaml.safe_load((c / "expected.yaml").read_text())["entry"] for c in found]
    parse_config(entries[0])
    cold = time.perf_counter() - t0
    warm: dict[str, float] = {}
    for case, entry in zip(found, entries):
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            parse_config(entry)
            times.append(time.perf_counter() - start)
        warm[case.name] = min(times)
    worst = max(warm, key=warm.get)
    med = statistics.median(warm.values())
    print(f"{len(warm)} cases, best of {args.repeats} warm parses each")
    print(f"cold first parse (imports, caches): {cold:.3f} s; warm median {med * 1e3:.1f} ms; "
          f"ratio cold/warm {cold / med:.0f}x")
    print(f"slowest warm parse: {warm[worst] * 1e3:.1f} ms ({worst}); target {TARGET_S:g} s: "
          f"{'met' if warm[worst] < TARGET_S else 'MISSED'}")
    return 0 if warm[worst] < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
