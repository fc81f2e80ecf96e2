"""Cold wall time of `goblin kb search` in fresh processes, against the sentence-transformers path.

Each timed run is a new ``goblin kb search "<symptom>" --json`` process (the
console script next to this interpreter), so every import is paid, as a user
pays it.  The rule and phrase embeddings are already cached in the warehouse
(a first, untimed-for-the-ratio run fills the cache of a private
``GOBLIN_HOME``), so what is measured is start-up, the KB and cache read, and
encoding the query:

* **numpy** (the default): the query is encoded by
  ``goblin_assets.kb.encoder.MiniLMEncoder`` (the packaged MiniLM weights
  in numpy, ``tokenizers`` for the tokenizer);
* **baseline**: ``GOBLIN_KB_ENCODER=sentence-transformers``, the same search
  with the query encoded by sentence-transformers (imports transformers,
  scikit-learn, scipy), as every search did before.

Prints the median and spread of each, the ratio baseline / numpy, whether the
two rankings agree, and whether the median meets the 2 s target of issue 16.

    .venv/bin/python benchmarks/kb_search_cold.py [--repeats 5] [--symptom "eval loss is nan"]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0


def goblin_command() -> list[str]:
    """The ``goblin`` console script beside this interpreter, else ``python -m goblin_assets.cli``."""
    script = Path(sys.executable).with_name("goblin")
    return [str(script)] if script.exists() else [sys.executable, "-m", "goblin_assets.cli"]


def run_once(symptom: str, env: dict[str, str]) -> tuple[float, list[dict]]:
    """Wall seconds of one fresh ``goblin kb search --json`` process and its parsed output."""
    t0 = time.perf_counter()
    p = subprocess.run([*goblin_command(), "kb", "search", symptom, "--json"], env=env, capture_output=True,
                       text=True, check=False)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"goblin kb search failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return dt, json.loads(p.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per path (alternating; default 5)")
    ap.add_argument("--symptom", default="eval loss is nan", help="the query")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="goblin_kb_cold_") as home:
        base = {**os.environ, "GOBLIN_HOME": home, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        base.pop("GOBLIN_KB_ENCODER", None)
        env_np = dict(base)
        env_st = {**base, "GOBLIN_KB_ENCODER": "sentence-transformers"}
        first, _out = run_once(args.symptom, env_np)  # encodes the rules and phrases, fills the cache
        print(f"first run (empty cache: encodes the rules and phrases, writes kb_embeddings): {first:.2f} s")
        times: dict[str, list[float]] = {"numpy": [], "sentence-transformers": []}
        outputs: dict[str, list[dict]] = {}
        for _i in range(args.repeats):  # alternate, so drift on a shared machine hits both paths alike
            for name, env in (("numpy", env_np), ("sentence-transformers", env_st)):
                dt, out = run_once(args.symptom, env)
                times[name].append(dt)
                outputs[name] = out
    for name, ts in times.items():
        print(f"{name:22s} median {statistics.median(ts):.2f} s  min {min(ts):.2f}  max {max(ts):.2f}  "
              f"(n={len(ts)}, cold process, warm embedding cache)")
    med_np, med_st = statistics.median(times["numpy"]), statistics.median(times["sentence-transformers"])
    same = [h["id"] for h in outputs["numpy"]] == [h["id"] for h in outputs["sentence-transformers"]]
    print(f"ratio sentence-transformers / numpy: {med_st / med_np:.1f}x  (same ranking: {same})")
    print(f"target: median under {TARGET_S:.0f} s cold -> {'met' if med_np < TARGET_S else 'NOT met'} "
          f"({med_np:.2f} s)")
    return 0 if med_np < TARGET_S and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
