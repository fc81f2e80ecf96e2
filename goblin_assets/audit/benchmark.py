"""benchmark: original vs patched, same step count, alternating repeats, cached.

No profiler on the timed steps.  Repeats alternate baseline and patched so
that machine drift (other load, thermal, page cache) falls on both alike; the
result per configuration is the median and the spread (max - min) of the
repeats' throughputs.

Results are cached by sha256 of (canonical config JSON, workload script hash,
image tag, runner code hash) (DESIGN.md "Decisions"): an identical request is
a cache hit; a change to any of the four is a miss.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

from goblin_assets import goblin_home
from goblin_assets.audit.profile import failed_metrics, timed_metrics
from goblin_assets.contracts import BenchmarkResult, RunMetrics
from goblin_assets.errors import RunFailed
from goblin_assets.runners.image import read_rocm_image
from goblin_assets.runners.base import Runner
from goblin_assets.runners.workload import Workload

_RUNNERS_DIR = Path(__file__).resolve().parent.parent / "runners"


def runner_code_hash() -> str:
    """sha256 over the code that runs and measures a benchmark (a change invalidates the cache).

    The runner package plus the modules that turn a run into throughput
    (``audit/benchmark.py``, ``audit/profile.py``).
    """
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for p in [*sorted(_RUNNERS_DIR.glob("*.py")), here / "benchmark.py", here / "profile.py"]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def image_tag() -> str:
    """The ROCm container image the run belongs to (tag and digest; see runners/image.py)."""
    return read_rocm_image().version


def cache_key(config: dict[str, Any], script: Path, tag: str | None = None, steps: int = 0,
              env: dict[str, str] | None = None) -> str:
    """sha256 of (canonical config JSON, script hash, image tag, runner code hash).

    The step count and environment changes are part of the canonical config
    (a different request must not hit another request's result).
    """
    canon = json.dumps({"config": config, "steps": steps, "env": env or {}}, sort_keys=True, default=str)
    parts = [canon, hashlib.sha256(Path(script).read_bytes()).hexdigest(), tag or image_tag(), runner_code_hash()]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _cache_file(key: str) -> Path:
    d = goblin_home() / "bench_cache"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{key}.json"


def _summarise(label: str, runs: list[RunMetrics], key: str, hit: bool) -> BenchmarkResult:
    tps = [r.throughput for r in runs if r.throughput]
    return BenchmarkResult(label=label, metrics=runs[len(runs) // 2], throughputs=tps, median=statistics.median(tps),
                           spread=max(tps) - min(tps), cache_key=key, cache_hit=hit)


def benchmark(workload: Workload, runner: Runner, arms: dict[str, dict[str, Any]], steps: int = 20,
              repeats: int = 3, warmup: int = 2, use_cache: bool = True, log=print) -> dict[str, BenchmarkResult]:
    """Benchmark each arm (``label -> {"config", "script", "env", "unset_env"}``) ``repeats`` times, alternating.

    Returns
    -------
    dict
        ``label -> BenchmarkResult`` (throughput in the workload's unit per second).

    Raises
    ------
    RunFailed
        Any repeat failed (message names the script and the reason).
    """
    keys = {lab: cache_key(a["config"], a["script"], steps=steps,
                           env={**a.get("env", {}), **{k: None for k in a.get("unset_env", [])}})
            for lab, a in arms.items()}
    out: dict[str, BenchmarkResult] = {}
    todo = []
    for lab in arms:
        f = _cache_file(keys[lab])
        if use_cache and f.is_file():
            out[lab] = BenchmarkResult.model_validate_json(f.read_text()).model_copy(update={"cache_hit": True})
            log(f"benchmark {lab}: cache hit ({keys[lab][:12]})")
        else:
            todo.append(lab)
    runs: dict[str, list[RunMetrics]] = {lab: [] for lab in todo}
    for rep in range(repeats):
        for lab in todo:
            a = arms[lab]
            raw = runner.run(workload, "benchmark", steps=steps, warmup=warmup, script=Path(a["script"]),
                             env=a.get("env"), unset_env=a.get("unset_env"), label=f"bench-{lab}-{rep}")
            if not raw.ok:
                raise RunFailed(f"benchmark {lab}: {raw.failure}", failed_metrics(raw, workload))
            m = timed_metrics(raw, workload)
            runs[lab].append(m)
            log(f"benchmark {lab} repeat {rep + 1}/{repeats}: {m.throughput:.1f} {workload.unit}/s")
    for lab in todo:
        res = _summarise(lab, runs[lab], keys[lab], hit=False)
        tmp = _cache_file(keys[lab]).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(res.model_dump_json())
        tmp.replace(_cache_file(keys[lab]))
        out[lab] = res
    return {lab: out[lab] for lab in arms}
