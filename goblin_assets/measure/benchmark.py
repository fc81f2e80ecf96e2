"""benchmark: original vs patched, same step count, alternating repeats, cached, with a speedup interval.

No profiler on the timed steps.  Repeats alternate baseline and patched so
that machine drift (other load, thermal, page cache) falls on both alike:
repeat ``i`` of each arm forms pair ``i``.  The result per configuration is
the median and the spread (max - min) of the repeats' throughputs; the
comparison is :func:`speedup_interval` over the pairs.

**The interval.**  The measured speedup is the geometric mean of the paired
ratios ``patched_i / baseline_i`` (ratios are summarised by their geometric
mean: Fleming & Wallace, "How not to lie with statistics: the correct way to
summarize benchmark results", CACM 29(3), 1986), and its interval is
Student's t interval on the mean of the paired log-ratios (the paired
t-test's interval; NIST/SEMATECH e-Handbook of Statistical Methods,
"Confidence limits for the mean",
https://www.itl.nist.gov/div898/handbook/eda/section3/eda352.htm), at
:data:`CONFIDENCE_LEVEL`.  Why not a bootstrap: with the few pairs an audit
can afford (2-10), the percentile bootstrap of a mean undercovers (Efron &
Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13): with 3 pairs
it has only 10 distinct resamples, and when all three ratios fall on the same
side of 1.0 (probability 1/4 for a patch that changes nothing) its interval
excludes 1.0.  The t interval widens with few pairs (t = 12.7 at 2 pairs,
4.3 at 3) instead.  Arms not measured together (no shared ``pair_id``) are
compared unpaired: Welch's interval on the difference of mean log
throughputs (same handbook, "Two-sample t-test for equal means", eda353).

**Adaptive repeats.**  After the minimum ``repeats`` pairs (and at least
two), the interval is checked after every pair (a *look*); a pair is added
while the interval is undecided (it contains 1.0 and its relative width
``high / low - 1`` is at least :data:`DECISIVE_WIDTH`) and the next pair,
at the mean pair time so far, fits in ``budget_s`` wall-clock seconds; at
most :data:`MAX_PAIRS`.  Each result says why it stopped (``stop_reason``)
and after how many looks (``looks``).  Stopping as soon as an interval
excludes 1.0 would, over many looks, make a patch that changes nothing
look "significant" far more often than 5 %; so the interval at look ``k``
is taken at level ``1 - alpha_k`` with ``alpha_k = alpha 6 / (pi^2 k^2)``
(``alpha = 1 - CONFIDENCE_LEVEL``; the ``alpha_k`` sum to ``alpha``).  By
the union bound, every look's interval holds together with probability at
least :data:`CONFIDENCE_LEVEL`, however many pairs were added: a
confidence sequence (Darling & Robbins, "Confidence sequences for mean,
variance, and median", PNAS 58(1), 1967; Howard, Ramdas, McAuliffe &
Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
Ann. Statist. 49(2), 2021).  The first look is at level 97.0 %, the second
at 99.2 %.

**Cache.**  Results are cached per arm by sha256 of (canonical config JSON
with the step count and environment changes, workload script hash, image
tag, runner code hash) (DESIGN.md "Decisions"), one entry per key and arm
label (a no-op patch's arms share a key but are two measurements); the
repeat count is not in the key.  An entry holds every repeat measured (the minimum and the adaptive
ones) and the ``pair_id`` of the call that measured it.  A request is
replayed from the cache when every arm has an entry with at least
``repeats`` repeats and, for two arms, both entries share one ``pair_id``
(measured together, so still paired).  Otherwise every arm is measured
again, in alternation, and the entries are replaced: a cached arm is never
compared with one measured at another time.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from goblin_assets import goblin_home
from goblin_assets.contracts import BenchmarkResult, RunMetrics
from goblin_assets.errors import RunFailed
from goblin_assets.measure.profile import failed_metrics, timed_metrics
from goblin_assets.runners.base import Runner
from goblin_assets.runners.image import read_rocm_image
from goblin_assets.runners.workload import Workload

_RUNNERS_DIR = Path(__file__).resolve().parent.parent / "runners"


def runner_code_hash() -> str:
    """sha256 over the code that runs and measures a benchmark (a change invalidates the cache).

    The runner package plus the modules that turn a run into throughput
    (``measure/benchmark.py``, ``measure/profile.py``).
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
              env: dict[str, str] | None = None, python: str | None = None) -> str:
    """sha256 of (canonical config JSON, script hash, image tag, runner code hash).

    The step count, environment changes and the interpreter the script runs
    in (``python``: the user's environment; None: Goblin's own) are part of
    the canonical config (a different request must not hit another request's
    result).
    """
    canon = json.dumps({"config": config, "steps": steps, "env": env or {},
                        **({"python": python} if python else {})}, sort_keys=True, default=str)
    parts = [canon, hashlib.sha256(Path(script).read_bytes()).hexdigest(), tag or image_tag(), runner_code_hash()]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _cache_file(key: str, label: str) -> Path:
    """The cache entry of one arm: per key *and* label (a no-op patch's arms share a key, not a measurement)."""
    d = goblin_home() / "bench_cache"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{key}.{label}.json"


#: Two-sided confidence level of the measured speedup's interval.
CONFIDENCE_LEVEL = 0.95

#: An interval whose relative width ``high / low - 1`` is below this decides the comparison even when it
#: contains 1.0: the speedup is then known to within about +-2.5 %, the order of the measurement bias a
#: machine's setup alone causes (Mytkowicz et al., "Producing wrong data without doing anything obviously
#: wrong!", ASPLOS 2009), so more repeats would not make the answer more useful.
DECISIVE_WIDTH = 0.05

#: The most alternating pairs adaptive repeats run (a bound on the loop whatever the budget).
MAX_PAIRS = 30

Verdict = Literal["faster", "slower", "no significant change", "no interval"]


class SpeedupInterval(BaseModel):
    """The measured speedup (patched / original throughput) with its confidence interval.

    ``point``: the geometric mean of the paired ratios (unpaired: the ratio
    of the arms' geometric-mean throughputs); ``low``/``high``: the interval
    (None with fewer than two pairs), which holds at ``level`` over all
    ``looks`` taken (each look's interval is at ``per_look_level``; module
    docstring, "Adaptive repeats"); ``pairs``: paired ratios (unpaired: the
    smaller arm's repeat count); ``method``: how it was computed, in words;
    ``verdict``: ``faster`` (``low > 1``), ``slower`` (``high < 1``), ``no
    significant change`` (the interval contains 1.0) or ``no interval`` (one
    pair).  See the module docstring for the sources.
    """

    point: float
    low: float | None
    high: float | None
    level: float = CONFIDENCE_LEVEL
    looks: int = 1
    per_look_level: float = CONFIDENCE_LEVEL
    pairs: int
    paired: bool
    method: str
    verdict: Verdict

    @property
    def significant(self) -> bool:
        """True when the interval excludes 1.0 (the patch changed throughput)."""
        return self.verdict in ("faster", "slower")

    @property
    def width(self) -> float | None:
        """Relative width ``high / low - 1`` (None without an interval)."""
        return None if self.low is None or self.high is None else self.high / self.low - 1.0

    @property
    def decided(self) -> bool:
        """True when more repeats are not needed: significant, or narrower than :data:`DECISIVE_WIDTH`."""
        return self.significant or (self.width is not None and self.width < DECISIVE_WIDTH)

    def headline(self) -> str:
        """The speedup as the report states it, e.g. ``1.55x (95% interval 1.42x-1.69x, 5 alternating pairs)``.

        A speedup whose interval contains 1.0 reads ``no significant change``
        first (never ``1.04x faster``); one whose interval lies below 1.0
        reads ``0.80x, slower (...)``.
        """
        how = f"{self.pairs} alternating pairs" if self.paired else f"{self.pairs} unpaired repeats per arm"
        if self.low is None or self.high is None:
            return f"{self.point:.2f}x (no interval: {how}; an interval needs two)"
        iv = f"{self.level:.0%} interval {self.low:.2f}x–{self.high:.2f}x, {how}"
        if self.verdict == "no significant change":
            return f"no significant change ({self.point:.2f}x, {iv})"
        return f"{self.point:.2f}x{', slower' if self.verdict == 'slower' else ''} ({iv})"


def _t(level: float, df: float) -> float:
    from scipy.stats import t  # scipy: a dependency; imported where it is used

    return float(t.ppf(0.5 + level / 2.0, df))


def per_look_level(level: float, look: int) -> float:
    """The level of the interval at look ``look`` (from 1) so that all looks hold together at ``level``.

    ``1 - (1 - level) 6 / (pi^2 look^2)``: the union bound over looks (module
    docstring, "Adaptive repeats").  Raises ValueError for ``look < 1``.
    """
    if look < 1:
        raise ValueError(f"per_look_level: looks count from 1, got {look}")
    return 1.0 - (1.0 - level) * 6.0 / (math.pi ** 2 * look ** 2)


def _verdict(low: float | None, high: float | None) -> Verdict:
    if low is None or high is None:
        return "no interval"
    return "faster" if low > 1.0 else "slower" if high < 1.0 else "no significant change"


def speedup_interval(baseline: Sequence[float], patched: Sequence[float], paired: bool = True,
                     level: float = CONFIDENCE_LEVEL, looks: int = 1) -> SpeedupInterval:
    """The speedup ``patched / baseline`` and its interval from repeated throughputs (pure).

    Parameters
    ----------
    baseline, patched : sequence of float
        Throughputs per repeat (any unit per second, the same for both;
        each > 0), in the order measured.
    paired : bool
        Repeat ``i`` of both arms ran back to back (alternating repeats):
        Student's t interval on the mean paired log-ratio, ``n - 1`` degrees
        of freedom.  Requires equal lengths; otherwise (or when False) Welch's
        interval on the difference of mean log throughputs, with
        Welch-Satterthwaite degrees of freedom.
    level : float
        Two-sided confidence level of all looks together (default
        :data:`CONFIDENCE_LEVEL`).
    looks : int
        How many times the interval has been checked so far, this time
        included (adaptive repeats); the interval is at
        :func:`per_look_level` of ``level`` and ``looks``.

    Returns
    -------
    SpeedupInterval
        ``low``/``high`` are None with fewer than two repeats (paired: pairs;
        unpaired: in either arm).  Identical ratios give a zero-width interval.

    Raises
    ------
    ValueError
        An empty arm, a throughput that is not > 0, or ``looks < 1``.
    """
    b, p = [float(x) for x in baseline], [float(x) for x in patched]
    each = per_look_level(level, looks)
    if not b or not p or min(b + p) <= 0 or not all(math.isfinite(x) for x in b + p):
        raise ValueError(f"speedup_interval: throughputs must be finite and > 0 (baseline {b}, patched {p})")
    lb, lp = [math.log(x) for x in b], [math.log(x) for x in p]
    if paired and len(b) == len(p):
        d = [y - x for x, y in zip(lb, lp)]
        n, mean = len(d), statistics.fmean(d)
        method = (f"geometric mean of {n} paired ratios (patched/original, alternating repeats); Student's t "
                  f"interval on the mean log-ratio")
        half = _t(each, n - 1) * statistics.stdev(d) / math.sqrt(n) if n >= 2 else None
    else:
        n, mean = min(len(b), len(p)), statistics.fmean(lp) - statistics.fmean(lb)
        method = (f"ratio of geometric-mean throughputs ({len(b)} original, {len(p)} patched repeats, not "
                  f"measured together); Welch's t interval on the difference of mean log throughputs")
        half = None
        if n >= 2:
            vb, vp = statistics.variance(lb) / len(lb), statistics.variance(lp) / len(lp)
            se = math.sqrt(vb + vp)
            df = (vb + vp) ** 2 / (vb ** 2 / (len(lb) - 1) + vp ** 2 / (len(lp) - 1)) if se > 0 else 1.0
            half = _t(each, df) * se
        paired = False
    low = math.exp(mean - half) if half is not None else None
    high = math.exp(mean + half) if half is not None else None
    method += (f" at {each:.1%} (look {looks}: every look together holds at {level:.0%})" if looks > 1 else
               f" at {each:.1%} (the first look: every look adaptive repeats may add holds together at {level:.0%})")
    return SpeedupInterval(point=math.exp(mean), low=low, high=high, level=level, looks=looks, per_look_level=each,
                           pairs=n, paired=paired, method=method, verdict=_verdict(low, high))


def bench_interval(bench: dict[str, BenchmarkResult], level: float = CONFIDENCE_LEVEL) -> SpeedupInterval:
    """:func:`speedup_interval` of a benchmark's ``"baseline"`` and ``"patched"`` results.

    Paired when both share a ``pair_id`` (measured in alternation by one
    :func:`benchmark` call) and hold as many repeats, at the number of looks
    that call took (``BenchmarkResult.looks``); else unpaired, one look.

    Raises
    ------
    KeyError
        An arm is missing.
    ValueError
        See :func:`speedup_interval`.
    """
    b, p = bench["baseline"], bench["patched"]
    paired = b.pair_id is not None and b.pair_id == p.pair_id and len(b.throughputs) == len(p.throughputs)
    return speedup_interval(b.throughputs, p.throughputs, paired=paired, level=level,
                            looks=max(1, b.looks) if paired else 1)


def _summarise(label: str, runs: list[RunMetrics], key: str, hit: bool, pair_id: str | None = None,
               stop_reason: str = "", elapsed_s: float | None = None, looks: int = 1) -> BenchmarkResult:
    tps = [r.throughput for r in runs if r.throughput]
    return BenchmarkResult(label=label, metrics=runs[len(runs) // 2], throughputs=tps, median=statistics.median(tps),
                           spread=max(tps) - min(tps), cache_key=key, cache_hit=hit, pair_id=pair_id,
                           stop_reason=stop_reason, elapsed_s=elapsed_s, looks=looks)


def _replayed(arms: dict[str, dict[str, Any]], keys: dict[str, str], repeats: int,
              use_cache: bool) -> dict[str, BenchmarkResult] | None:
    """The cached results of every arm when the request can be replayed (module docstring, "Cache"), else None."""
    if not use_cache:
        return None
    out = {}
    for lab in arms:
        f = _cache_file(keys[lab], lab)
        if not f.is_file():
            return None
        res = BenchmarkResult.model_validate_json(f.read_text())
        if len(res.throughputs) < repeats:
            return None
        out[lab] = res.model_copy(update={"cache_hit": True})
    if len(out) > 1 and (None in {r.pair_id for r in out.values()} or len({r.pair_id for r in out.values()}) > 1):
        return None
    return out


def _stop_reason(interval: SpeedupInterval | None, comparable: bool, pairs: int, repeats: int, elapsed: float,
                 budget_s: float | None) -> str | None:
    """Why no pair is added now (None: add one).

    ``comparable``: both arms run and counted throughput; ``interval``: this
    look's (None before the first look).
    """
    if not comparable:
        return None if pairs < repeats else f"{repeats} repeat(s): no two throughputs to compare"
    if pairs < max(repeats, 2) or interval is None:
        return None
    if interval.significant:
        return f"decided after {pairs} pairs: the {interval.level:.0%} interval excludes 1.0"
    if interval.decided:
        return (f"decided after {pairs} pairs: the {interval.level:.0%} interval is narrower than "
                f"{DECISIVE_WIDTH:.0%}")
    if pairs >= MAX_PAIRS:
        return f"undecided after {pairs} pairs: at most {MAX_PAIRS} pairs run"
    if budget_s is not None and elapsed + elapsed / pairs > budget_s:
        return (f"undecided after {pairs} pairs: the time budget of {budget_s:g} s is spent "
                f"({elapsed:.0f} s measuring; another pair takes about {elapsed / pairs:.0f} s)")
    return None


def benchmark(workload: Workload, runner: Runner, arms: dict[str, dict[str, Any]], steps: int = 20,
              repeats: int = 3, warmup: int = 2, use_cache: bool = True, budget_s: float | None = None,
              log=print) -> dict[str, BenchmarkResult]:
    """Benchmark each arm (``label -> {"config", "script", "env", "unset_env"}``), alternating repeats.

    Parameters
    ----------
    workload, runner:
        What to run and how.
    arms:
        ``"baseline"`` and/or ``"patched"``: the config (for the cache key),
        the entry script, environment changes.
    steps, warmup:
        Timed optimizer steps per repeat, and unmeasured ones before them.
    repeats:
        The minimum repeats per arm.  With both arms, pairs are added while
        :func:`bench_interval` is undecided and ``budget_s`` allows (module
        docstring, "Adaptive repeats"); a single arm runs ``repeats`` times.
    use_cache:
        Replay a request the cache can answer (module docstring, "Cache").
    budget_s:
        Wall-clock seconds for the whole measurement (None: no limit but
        :data:`MAX_PAIRS`).  The minimum repeats and a second pair always run.

    Returns
    -------
    dict
        ``label -> BenchmarkResult`` (throughput in the workload's unit per
        second), in the order of ``arms``; every arm carries the call's
        ``pair_id``, ``stop_reason`` and ``elapsed_s``.

    Raises
    ------
    RunFailed
        Any repeat failed (message names the script and the reason).
    """
    python = getattr(runner, "python", None)
    keys = {lab: cache_key(a["config"], a["script"], steps=steps,
                           env={**a.get("env", {}), **{k: None for k in a.get("unset_env", [])}},
                           python=None if python == sys.executable else python)
            for lab, a in arms.items()}
    replay = _replayed(arms, keys, repeats, use_cache)
    if replay is not None:
        for lab in arms:
            log(f"benchmark {lab}: cache hit ({keys[lab][:12]}, {len(replay[lab].throughputs)} repeats)")
        return replay
    if use_cache and any(_cache_file(keys[lab], lab).is_file() for lab in arms):
        log("benchmark: cached results not replayed (fewer repeats, or the arms were not measured together): "
            "measuring every arm again, alternating")
    pair_id, t0 = uuid.uuid4().hex[:12], time.monotonic()
    runs: dict[str, list[RunMetrics]] = {lab: [] for lab in arms}
    compare = {"baseline", "patched"} <= set(arms)
    rep, looks, reason = 0, 0, None
    while reason is None:
        for lab, a in arms.items():
            raw = runner.run(workload, "benchmark", steps=steps, warmup=warmup, script=Path(a["script"]),
                             env=a.get("env"), unset_env=a.get("unset_env"), label=f"bench-{lab}-{rep}")
            if not raw.ok:
                raise RunFailed(f"benchmark {lab}: {raw.failure}", failed_metrics(raw, workload))
            m = timed_metrics(raw, workload)
            runs[lab].append(m)
            log(f"benchmark {lab} repeat {rep + 1}: {m.throughput:.1f} {workload.unit}/s")
        rep += 1
        interval = None
        tb, tp = ([m.throughput for m in runs[lab]] for lab in ("baseline", "patched")) if compare else ([], [])
        comparable = compare and all(tb) and all(tp)  # a run that counted no batches has no throughput
        if comparable and rep >= max(repeats, 2):  # a look
            looks += 1
            interval = speedup_interval(tb, tp, looks=looks)
            log(f"benchmark: speedup {interval.headline()}")
        reason = _stop_reason(interval, comparable, rep, repeats, time.monotonic() - t0, budget_s)
    elapsed = time.monotonic() - t0
    log(f"benchmark: {reason} ({elapsed:.0f} s)")
    out = {}
    for lab in arms:
        res = _summarise(lab, runs[lab], keys[lab], hit=False, pair_id=pair_id, stop_reason=reason,
                         elapsed_s=elapsed, looks=max(looks, 1))
        tmp = _cache_file(keys[lab], lab).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(res.model_dump_json())
        tmp.replace(_cache_file(keys[lab], lab))
        out[lab] = res
    return out
