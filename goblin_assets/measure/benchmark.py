"""benchmark: original vs patched, same step count, alternating repeats, cached, with a speedup interval.

No profiler on the timed steps.  Repeats alternate baseline and patched so
that machine drift (other load, thermal, page cache) falls on both alike:
repeat ``i`` of each arm forms pair ``i``.  The result per configuration is
the median and the spread (max - min) of the repeats' throughputs; the
comparison is :func:`speedup_interval` over the pairs, worded in one line
by :func:`verdict_line`.

**The interval.**  The measured speedup is the geometric mean of the paired
ratios ``patched_i / baseline_i`` (ratios are summarised by their geometric
mean: Fleming & Wallace, "How not to lie with statistics: the correct way to
summarize benchmark results", CACM 29(3), 1986), and its interval is
Student's t interval on the mean of the paired log-ratios (the paired
t-test's interval; NIST/SEMATECH e-Handbook of Statistical Methods,
"Confidence limits for the mean",
https://www.itl.nist.gov/div898/handbook/eda/section3/eda352.htm), at
:data:`CONFIDENCE_LEVEL`.  Why not a bootstrap: with the few pairs an audit
can afford (2-12), the percentile bootstrap of a mean undercovers (Efron &
Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13): with 3 pairs
it has only 10 distinct resamples, and when all three ratios fall on the same
side of 1.0 (probability 1/4 for a patch that changes nothing) its interval
excludes 1.0.  The t interval widens with few pairs instead.  Arms not
measured together (no shared ``pair_id``) are compared unpaired: Welch's
interval on the difference of mean log throughputs (same handbook,
"Two-sample t-test for equal means", eda353).

**The sign test beside it.**  Each pair also votes: the patched repeat was
faster or slower than its original (an exactly equal pair is a tie and
votes neither way).  :func:`sign_test` is the exact two-sided binomial test
of those votes against a fair coin (Conover, "Practical Nonparametric
Statistics", 3rd ed., Wiley 1999, section 3.4, "The sign test"): it ignores
how much faster, so one wild pair cannot move it, where one wild pair can
widen the t interval a lot.  It cannot reach 5 % below 6 pairs (6 of 6 gives
p = 2/64 = 0.031).  **The verdict is the t interval's** (``faster``: its low
end is above 1.0; ``slower``: its high end is below 1.0; ``no significant
change``: it contains 1.0; ``no interval``: one pair); the sign test never
changes it, and is computed once on the pairs measured, not at every look.
When the two disagree the one-line verdict says so in words
(:func:`verdict_line`): an interval that contains 1.0 beside a sign test
below 5 % reads ``no significant change by the interval, but 6 of 6 pairs
faster (sign test p=0.03)``, never a flat "no significant change".

**Planned looks.**  The interval is checked (a *look*) only at the
:data:`PLANNED_LOOKS` pair counts of :func:`look_schedule`: the minimum
``repeats`` (at least 3), then twice and four times as many (3, 6 and 12
pairs for the default 3 repeats), and once more at the pairs measured when
the time budget stops the measurement between two planned looks (that look
takes the place of the next planned one, so there are never more than
:data:`PLANNED_LOOKS`).  Stopping as soon as an interval excludes 1.0 would,
over many looks, make a patch that changes nothing look "significant" far
more often than 5 %; so every look's interval is at level
``1 - alpha / PLANNED_LOOKS`` (``alpha = 1 - CONFIDENCE_LEVEL``: 98.3 % for
a 95 % overall level), and by the union bound (Bonferroni; Dunn, "Multiple
comparisons among means", JASA 56(293), 1961) all looks together hold at
:data:`CONFIDENCE_LEVEL`.  A fixed, small number of looks is the
group-sequential design of clinical trials (Pocock, "Group sequential
methods in the design and analysis of clinical trials", Biometrika 64(2),
1977; Jennison & Turnbull, "Group Sequential Methods with Applications to
Clinical Trials", 2000, ch. 2): Pocock's boundary for 3 looks spends 2.2 %
per look under normality with known variance; the Bonferroni split spends
1.67 % and needs neither assumption.  Goblin used a confidence sequence
before (a look after every pair, ``alpha_k = 6 alpha / (pi^2 k^2)``): its
fourth look, at 6 pairs, was at 99.8 % (t = 5.96 where the split's is 3.53),
so 6 of 6 clearly faster pairs could read "no significant change".  At a
look, the measurement stops when the interval decides (it excludes 1.0, or
its relative width ``high / low - 1`` is below :data:`DECISIVE_WIDTH`).  The
look times depend on the pair count and the budget, never on the ratios.

**The time budget.**  ``budget_s`` bounds the whole measurement: after the
minimum ``repeats`` pairs, a pair is started only when the seconds spent so
far plus one pair's estimated time (the mean pair time so far) fit in it,
so the budget is overrun by at most the amount one pair takes longer than
its estimate.  The minimum pairs always run; when even they do not fit, the
result says so (``stop_reason``; ``elapsed_s`` above ``budget_s``).  Each
result says why it stopped (``stop_reason``), after how many looks
(``looks``) and in how many seconds of which budget (``elapsed_s``,
``budget_s``).

**Cache.**  Results are cached per arm by sha256 of (canonical config JSON
with the step count and environment changes, workload script hash, image
tag, runner code hash) (DESIGN.md "Decisions"), one entry per key and arm
label (a no-op patch's arms share a key but are two measurements); the
repeat count is not in the key.  An entry holds every repeat measured (the minimum and the adaptive
ones), the ``pair_id`` of the call that measured it and when
(``measured_at``).  A request is replayed from the cache when every arm has
an entry with at least ``repeats`` repeats and, for two arms, both entries
share one ``pair_id`` (measured together, so still paired); every replayed
arm is logged as replayed, with when it was measured, and carries
``cache_hit``.  Otherwise, or with ``use_cache=False`` (``goblin audit
--no-cache``, ``GOBLIN_RUNNER_BENCH_CACHE=0``), every arm is measured again,
in alternation, and the entries are replaced: a cached arm is never compared
with one measured at another time.
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


#: Two-sided confidence level of the measured speedup's interval, over all its looks together.
CONFIDENCE_LEVEL = 0.95

#: An interval whose relative width ``high / low - 1`` is below this decides the comparison even when it
#: contains 1.0: the speedup is then known to within about +-2.5 %, the order of the measurement bias a
#: machine's setup alone causes (Mytkowicz et al., "Producing wrong data without doing anything obviously
#: wrong!", ASPLOS 2009), so more repeats would not make the answer more useful.
DECISIVE_WIDTH = 0.05

#: How many times the interval may be checked; each look is at ``1 - (1 - CONFIDENCE_LEVEL) / PLANNED_LOOKS``
#: (the Bonferroni split; module docstring, "Planned looks").
PLANNED_LOOKS = 3

#: The fewest pairs of the first planned look: at 2 pairs Student's t has one degree of freedom (t = 38 at
#: 98.3 %), so a look there spends a third of the error rate on an interval that almost never decides.
FIRST_LOOK_PAIRS = 3

#: The most alternating pairs one measurement runs, whatever the repeats (a bound on the loop).
MAX_PAIRS = 30

Verdict = Literal["faster", "slower", "no significant change", "no interval"]


class SpeedupInterval(BaseModel):
    """The measured speedup (patched / original throughput) with its confidence interval and its sign test.

    ``point``: the geometric mean of the paired ratios (unpaired: the ratio
    of the arms' geometric-mean throughputs); ``low``/``high``: the interval
    (None with fewer than two pairs), which holds at ``level`` over all
    ``looks`` taken of at most ``planned_looks`` (each look's interval is at
    ``per_look_level``; module docstring, "Planned looks"); ``pairs``:
    paired ratios (unpaired: the smaller arm's repeat count); ``method``:
    how it was computed, in words; ``verdict``: the interval's reading,
    ``faster`` (``low > 1``), ``slower`` (``high < 1``), ``no significant
    change`` (the interval contains 1.0) or ``no interval`` (one pair).

    ``pairs_faster``/``pairs_slower``: pairs whose patched repeat was
    faster/slower than its original (the rest tied); ``sign_test_p``: the
    exact two-sided sign test of those counts (:func:`sign_test`); all three
    None when unpaired.  ``budget_s``/``elapsed_s``: the measurement's
    wall-clock budget and the seconds it took (None: not known, e.g. an
    interval computed from bare throughputs); ``cache_hit``: the pairs were
    replayed from the benchmark cache, not measured by this audit.  See the
    module docstring for the sources.
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
    planned_looks: int = PLANNED_LOOKS
    pairs_faster: int | None = None
    pairs_slower: int | None = None
    sign_test_p: float | None = None
    budget_s: float | None = None
    elapsed_s: float | None = None
    cache_hit: bool = False

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

    @property
    def sign_test_direction(self) -> Literal["faster", "slower"] | None:
        """``faster``/``slower`` when the sign test alone is significant (p below ``1 - level``), else None.

        None when unpaired (no sign test).  The verdict stays the interval's
        (module docstring, "The sign test beside it").
        """
        if self.sign_test_p is None or self.sign_test_p >= 1.0 - self.level:
            return None
        return "faster" if (self.pairs_faster or 0) > (self.pairs_slower or 0) else "slower"

    def headline(self) -> str:
        """The speedup in short, e.g. ``1.55x (95% interval 1.42x–1.69x, 5 alternating pairs)``.

        A speedup whose interval contains 1.0 reads ``no significant change``
        first (never ``1.04x faster``); one whose interval lies below 1.0
        reads ``0.80x, slower (...)``.  The line a person reads in the report
        and the terminal is :func:`verdict_line`.
        """
        how = f"{self.pairs} alternating pairs" if self.paired else f"{self.pairs} unpaired repeats per arm"
        if self.low is None or self.high is None:
            return f"{self.point:.2f}x (no interval: {how}; an interval needs two)"
        iv = f"{interval_text(self)}, {how}"
        if self.verdict == "no significant change":
            return f"no significant change ({self.point:.2f}x, {iv})"
        return f"{self.point:.2f}x{', slower' if self.verdict == 'slower' else ''} ({iv})"


#: Bounds past this factor either way are printed as a bound (``<0.01x``, ``>100x``): with two or three
#: pairs Student's t has one or two degrees of freedom and the interval can span nine orders of
#: magnitude, whose digits say nothing a person can check.
WIDE_BOUND = 100.0


def _bound(x: float) -> str:
    if x > WIDE_BOUND:
        return f">{WIDE_BOUND:g}x"
    if x < 1.0 / WIDE_BOUND:
        return f"<{1.0 / WIDE_BOUND:g}x"
    return f"{x:.2f}x"


def interval_text(iv: SpeedupInterval) -> str:
    """``95% interval 1.42x–1.69x``: the interval's level and bounds, a bound past :data:`WIDE_BOUND` as ``>100x``."""
    return f"{iv.level:.0%} interval {_bound(iv.low)}–{_bound(iv.high)}"


def _secs(x: float) -> str:
    """Seconds as the lines print them: whole seconds from 10 s, one decimal below."""
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _p_text(p: float) -> str:
    """A p-value as the line prints it: two decimals, then one significant digit, below 0.001 a bound."""
    return f"p={p:.2f}" if p >= 0.01 else f"p={p:.1g}" if p >= 0.001 else "p<0.001"


def _votes(iv: SpeedupInterval, way: str) -> str:
    """``6 of 6 pairs faster`` (with the ties, when any)."""
    k = iv.pairs_faster if way == "faster" else iv.pairs_slower
    ties = iv.pairs - (iv.pairs_faster or 0) - (iv.pairs_slower or 0)
    return f"{k} of {iv.pairs} pair{'s' if iv.pairs != 1 else ''} {way}" + (f", {ties} tied" if ties else "")


def verdict_line(iv: SpeedupInterval) -> str:
    """The measured speedup in one line a person can check against the pairs' table.

    ``<verdict>: <point>x (<level> interval <low>x–<high>x; <k> of <n> pairs
    faster, sign test p=<p>; <n> pairs in <elapsed> s of a <budget> s
    budget)``, e.g. ``faster: 1.39x (95% interval 1.01x–1.90x; 6 of 6 pairs
    faster, sign test p=0.03; 6 pairs in 48 s of a 60 s budget)``.  The
    line starts with the verdict string (``faster``, ``slower``, ``no
    significant change``, ``no interval``); the pairs are counted in the
    direction of the point estimate.  When the sign test alone is
    significant and points elsewhere than the interval's verdict, the lead
    says so in words (``no significant change by the interval, but 6 of 6
    pairs faster (sign test p=0.03)``; module docstring, "The sign test
    beside it").  Unpaired arms have no sign test and no pairs' time; a
    measurement over its budget reads ``over the 120 s budget``; replayed
    pairs read ``replayed from the cache``.
    """
    parts = [interval_text(iv) if iv.low is not None and iv.high is not None else
             f"an interval needs two {'pairs' if iv.paired else 'repeats per arm'}"]
    lead = iv.verdict
    if iv.paired and iv.sign_test_p is not None:
        way = "faster" if iv.point >= 1.0 else "slower"
        sign = iv.sign_test_direction
        if sign is not None and sign != iv.verdict:
            by = "" if iv.verdict == "no interval" else " by the interval"
            lead = (f"{iv.verdict}{by}, but {_votes(iv, sign)} (sign test {_p_text(iv.sign_test_p)})")
        else:
            parts.append(f"{_votes(iv, way)}, sign test {_p_text(iv.sign_test_p)}")
        when = []
        if iv.elapsed_s is not None:
            when.append(f"{iv.pairs} pair{'s' if iv.pairs != 1 else ''} in {_secs(iv.elapsed_s)} s")
            if iv.budget_s is not None:
                when[0] += f" of a {iv.budget_s:g} s budget" if iv.elapsed_s <= iv.budget_s else \
                    f", over the {iv.budget_s:g} s budget"
        if iv.cache_hit:
            when.append("replayed from the cache")
        if when:
            parts.append(", ".join(when))
    else:
        parts.append(f"{iv.pairs} unpaired repeats per arm, not measured together: no sign test")
    return f"{lead}: {iv.point:.2f}x ({'; '.join(parts)})"


def _t(level: float, df: float) -> float:
    from scipy.stats import t  # scipy: a dependency; imported where it is used

    return float(t.ppf(0.5 + level / 2.0, df))


def per_look_level(level: float, look: int, planned: int = PLANNED_LOOKS) -> float:
    """The level of the interval at look ``look`` (from 1) so that all ``planned`` looks hold together at ``level``.

    ``1 - (1 - level) / planned`` at every look: the Bonferroni split over
    the planned looks (module docstring, "Planned looks"); 98.3 % for 95 %
    over 3 looks.  Raises ValueError unless ``1 <= look <= planned``.
    """
    if not 1 <= look <= planned:
        raise ValueError(f"per_look_level: look {look} is not one of the {planned} planned looks (from 1)")
    return 1.0 - (1.0 - level) / planned


def look_schedule(repeats: int) -> tuple[int, ...]:
    """The pair counts at which the interval is checked: ``repeats`` (at least :data:`FIRST_LOOK_PAIRS`),
    twice and four times as many, capped at :data:`MAX_PAIRS` (``(3, 6, 12)`` for 3 repeats).

    At most :data:`PLANNED_LOOKS` counts, increasing; the last is the most
    pairs a measurement runs.  Raises ValueError for ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"look_schedule: repeats must be >= 1, got {repeats}")
    first = max(repeats, FIRST_LOOK_PAIRS)
    return tuple(sorted({max(first, min(first * 2 ** k, MAX_PAIRS)) for k in range(PLANNED_LOOKS)}))


def sign_test(baseline: Sequence[float], patched: Sequence[float]) -> tuple[int, int, float]:
    """The exact two-sided sign test of paired throughputs (pure).

    Returns ``(faster, slower, p)``: the pairs whose patched value is
    greater / smaller than its baseline (equal pairs are ties and count in
    neither), and ``p = min(1, 2 P(X <= min(faster, slower)))`` with
    ``X ~ Binomial(faster + slower, 1/2)`` (Conover, "Practical
    Nonparametric Statistics", 3rd ed. 1999, section 3.4); 1.0 with no
    untied pair.  Raises ValueError when the sequences differ in length.
    """
    if len(baseline) != len(patched):
        raise ValueError(f"sign_test: {len(baseline)} baseline and {len(patched)} patched values are not pairs")
    faster = sum(p > b for b, p in zip(baseline, patched))
    slower = sum(p < b for b, p in zip(baseline, patched))
    n, k = faster + slower, min(faster, slower)
    p = min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return faster, slower, p


def _verdict(low: float | None, high: float | None) -> Verdict:
    if low is None or high is None:
        return "no interval"
    return "faster" if low > 1.0 else "slower" if high < 1.0 else "no significant change"


def speedup_interval(baseline: Sequence[float], patched: Sequence[float], paired: bool = True,
                     level: float = CONFIDENCE_LEVEL, looks: int = 1,
                     planned_looks: int = PLANNED_LOOKS) -> SpeedupInterval:
    """The speedup ``patched / baseline``, its interval and (paired) its sign test from repeated throughputs (pure).

    Parameters
    ----------
    baseline, patched : sequence of float
        Throughputs per repeat (any unit per second, the same for both;
        each > 0), in the order measured.
    paired : bool
        Repeat ``i`` of both arms ran back to back (alternating repeats):
        Student's t interval on the mean paired log-ratio, ``n - 1`` degrees
        of freedom, and :func:`sign_test` of the pairs.  Requires equal
        lengths; otherwise (or when False) Welch's interval on the
        difference of mean log throughputs, with Welch-Satterthwaite degrees
        of freedom, and no sign test.
    level : float
        Two-sided confidence level of all looks together (default
        :data:`CONFIDENCE_LEVEL`).
    looks, planned_looks : int
        This look's number (from 1) and how many were planned (default
        :data:`PLANNED_LOOKS`, the benchmark's); the interval is at
        :func:`per_look_level`, the same at every look.

    Returns
    -------
    SpeedupInterval
        ``low``/``high`` are None with fewer than two repeats (paired: pairs;
        unpaired: in either arm).  Identical ratios give a zero-width
        interval.  ``budget_s``/``elapsed_s`` are None (see
        :func:`bench_interval`).

    Raises
    ------
    ValueError
        An empty arm, a throughput that is not finite and > 0, or a look
        outside ``1..planned_looks``.
    """
    b, p = [float(x) for x in baseline], [float(x) for x in patched]
    each = per_look_level(level, looks, planned_looks)
    if not b or not p or min(b + p) <= 0 or not all(math.isfinite(x) for x in b + p):
        raise ValueError(f"speedup_interval: throughputs must be finite and > 0 (baseline {b}, patched {p})")
    lb, lp = [math.log(x) for x in b], [math.log(x) for x in p]
    votes: dict[str, Any] = {}
    if paired and len(b) == len(p):
        d = [y - x for x, y in zip(lb, lp)]
        n, mean = len(d), statistics.fmean(d)
        method = (f"geometric mean of {n} paired ratios (patched/original, alternating repeats); Student's t "
                  f"interval on the mean log-ratio")
        half = _t(each, n - 1) * statistics.stdev(d) / math.sqrt(n) if n >= 2 else None
        faster, slower, sp = sign_test(b, p)
        votes = {"pairs_faster": faster, "pairs_slower": slower, "sign_test_p": sp}
        method += "; beside it the exact two-sided sign test of the pairs faster vs slower"
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
    method += (f"; the interval at {each:.1%}, look {looks} of at most {planned_looks} planned (Bonferroni: "
               f"every look together holds at {level:.0%})")
    return SpeedupInterval(point=math.exp(mean), low=low, high=high, level=level, looks=looks, per_look_level=each,
                           planned_looks=planned_looks, pairs=n, paired=paired, method=method,
                           verdict=_verdict(low, high), **votes)


def bench_interval(bench: dict[str, BenchmarkResult], level: float = CONFIDENCE_LEVEL) -> SpeedupInterval:
    """:func:`speedup_interval` of a benchmark's ``"baseline"`` and ``"patched"`` results.

    Paired when both share a ``pair_id`` (measured in alternation by one
    :func:`benchmark` call) and hold as many repeats, at the number of looks
    that call took (``BenchmarkResult.looks``; a result that took more than
    :data:`PLANNED_LOOKS`, measured before the looks were planned, is split
    over the looks it took), with the call's
    ``budget_s``, ``elapsed_s`` and ``cache_hit``; else unpaired, one look.

    Raises
    ------
    KeyError
        An arm is missing.
    ValueError
        See :func:`speedup_interval`.
    """
    b, p = bench["baseline"], bench["patched"]
    paired = b.pair_id is not None and b.pair_id == p.pair_id and len(b.throughputs) == len(p.throughputs)
    looks = max(1, b.looks) if paired else 1
    iv = speedup_interval(b.throughputs, p.throughputs, paired=paired, level=level, looks=looks,
                          planned_looks=max(PLANNED_LOOKS, looks))  # a result from before the planned looks
    if not paired:
        return iv
    return iv.model_copy(update={"budget_s": b.budget_s, "elapsed_s": b.elapsed_s,
                                 "cache_hit": b.cache_hit or p.cache_hit})


def _summarise(label: str, runs: list[RunMetrics], key: str, **call: Any) -> BenchmarkResult:
    """One arm's result; ``call``: what the measuring call shares (``pair_id``, ``stop_reason``, ``elapsed_s``,
    ``budget_s``, ``looks``, ``measured_at``)."""
    tps = [r.throughput for r in runs if r.throughput]
    return BenchmarkResult(label=label, metrics=runs[len(runs) // 2], throughputs=tps, median=statistics.median(tps),
                           spread=max(tps) - min(tps), cache_key=key, cache_hit=False, **call)


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


def _decision(interval: SpeedupInterval | None, pairs: int) -> str | None:
    """Why the interval of a look at ``pairs`` pairs ends the measurement (None: it does not decide)."""
    if interval is not None and interval.significant:
        return f"decided after {pairs} pairs: the {interval.level:.0%} interval excludes 1.0"
    if interval is not None and interval.decided:
        return (f"decided after {pairs} pairs: the {interval.level:.0%} interval is narrower than "
                f"{DECISIVE_WIDTH:.0%}")
    return None


def _limit(pairs: int, repeats: int, elapsed: float, budget_s: float | None, last_look: int) -> str | None:
    """Why no pair may be added after ``pairs`` pairs whatever the interval (None: one may).

    ``last_look``: the pair count of the last planned look
    (:func:`look_schedule`); ``elapsed``: seconds measured so far.  The
    minimum ``repeats`` pairs always run (module docstring, "The time budget").
    """
    if pairs < repeats:
        return None
    if pairs >= last_look:
        return f"the last of the planned looks ({PLANNED_LOOKS} at most)"
    if budget_s is None:
        return None
    if pairs == repeats and elapsed > budget_s:
        return f"the minimum of {repeats} pairs took {_secs(elapsed)} s, over the time budget of {budget_s:g} s"
    if elapsed + elapsed / pairs > budget_s:
        return (f"the time budget of {budget_s:g} s has no room for another pair ({_secs(elapsed)} s measured; "
                f"a pair takes about {_secs(elapsed / pairs)} s)")
    return None


def benchmark(workload: Workload, runner: Runner, arms: dict[str, dict[str, Any]], steps: int = 20,
              repeats: int = 3, warmup: int = 2, use_cache: bool = True, budget_s: float | None = None,
              log=print, clock=time.monotonic) -> dict[str, BenchmarkResult]:
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
        The minimum repeats per arm (>= 1).  With both arms, pairs are added
        up to the planned looks of :func:`look_schedule` while the interval
        is undecided and ``budget_s`` allows (module docstring, "Planned
        looks"); a single arm runs ``repeats`` times.
    use_cache:
        Replay a request the cache can answer (module docstring, "Cache");
        False measures afresh and replaces the entries.  Every replayed arm
        is logged as such.
    budget_s:
        Wall-clock seconds for the whole measurement (None: no limit but the
        last planned look).  A pair is started only when it fits, at the
        mean pair time so far; the minimum ``repeats`` pairs always run
        (module docstring, "The time budget").
    log:
        Called with each progress line (str).
    clock:
        Seconds, monotonic (default :func:`time.monotonic`; tests pass a
        fake one).

    Returns
    -------
    dict
        ``label -> BenchmarkResult`` (throughput in the workload's unit per
        second), in the order of ``arms``; every arm carries the call's
        ``pair_id``, ``stop_reason``, ``looks``, ``elapsed_s``, ``budget_s``
        and ``measured_at``; ``cache_hit`` when replayed.

    Raises
    ------
    RunFailed
        Any repeat failed (message names the script and the reason).
    ValueError
        ``repeats < 1``.
    """
    python = getattr(runner, "python", None)
    keys = {lab: cache_key(a["config"], a["script"], steps=steps,
                           env={**a.get("env", {}), **{k: None for k in a.get("unset_env", [])}},
                           python=None if python == sys.executable else python)
            for lab, a in arms.items()}
    compare = {"baseline", "patched"} <= set(arms)
    schedule = look_schedule(repeats)
    replay = _replayed(arms, keys, repeats, use_cache)
    if replay is not None:
        for lab, r in replay.items():
            log(f"benchmark {lab}: replayed from the cache, not measured now ({len(r.throughputs)} repeats measured "
                f"{r.measured_at or 'earlier'}, entry {keys[lab][:12]}; --no-cache or GOBLIN_RUNNER_BENCH_CACHE=0 "
                f"measures afresh)")
        if compare:
            log(f"benchmark: {verdict_line(bench_interval(replay))}")
        return replay
    cached = [lab for lab in arms if _cache_file(keys[lab], lab).is_file()]
    if cached and use_cache:
        log("benchmark: cached results not replayed (fewer repeats, or the arms were not measured together): "
            "measuring every arm again, alternating")
    elif cached:
        log(f"benchmark: cache off: measuring afresh; the cached entries of {', '.join(cached)} are replaced")
    pair_id, t0, measured_at = uuid.uuid4().hex[:12], clock(), time.strftime("%Y-%m-%d %H:%M:%S")
    runs: dict[str, list[RunMetrics]] = {lab: [] for lab in arms}
    rep, looks, looked_at, reason, comparable = 0, 0, 0, None, False
    tb: list[float] = []
    tp: list[float] = []
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
        if compare:
            tb, tp = ([m.throughput for m in runs[lab]] for lab in ("baseline", "patched"))
        comparable = compare and all(tb) and all(tp)  # a run that counted no batches has no throughput
        if comparable and rep in schedule:  # a planned look
            looks, looked_at = looks + 1, rep
            interval = speedup_interval(tb, tp, looks=looks)
            log(f"benchmark: look {looks} at {rep} pairs: {verdict_line(interval)}")
        if not comparable:
            reason = None if rep < repeats else f"{repeats} repeat(s): no two throughputs to compare"
        elif (decided := _decision(interval, rep)) is not None:
            reason = decided
        elif (limit := _limit(rep, repeats, clock() - t0, budget_s, schedule[-1])) is not None:
            reason = f"undecided after {rep} pairs: {limit}"
            if rep >= 2 and looked_at != rep:  # stopped between planned looks: the next look is taken here
                looks += 1
                last = speedup_interval(tb, tp, looks=looks)
                log(f"benchmark: look {looks} at {rep} pairs (no room for more): {verdict_line(last)}")
                if (decided := _decision(last, rep)) is not None:
                    reason = f"{decided} (at the look taken early: {limit})"
    elapsed = clock() - t0
    log(f"benchmark: {reason} ({_secs(elapsed)} s" + (f" of a {budget_s:g} s budget)" if budget_s else ")"))
    out = {}
    for lab in arms:
        res = _summarise(lab, runs[lab], keys[lab], pair_id=pair_id, stop_reason=reason, elapsed_s=elapsed,
                         budget_s=budget_s, looks=max(looks, 1), measured_at=measured_at)
        tmp = _cache_file(keys[lab], lab).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(res.model_dump_json())
        tmp.replace(_cache_file(keys[lab], lab))
        out[lab] = res
    return out
