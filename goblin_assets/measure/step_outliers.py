"""Steps that go wrong: outliers past 1.5x the median step, and what each spent its time on.

One rule for the audit's own runs (every optimizer step the harness ran,
warm-up included, timed by the harness's clock: :func:`outlier_steps`) and
for recorded traces (:mod:`goblin_assets.trace.steps`): a step is an outlier
when it takes more than :data:`OUTLIER_RATIO` times the median step, the
criterion of TraceLens's trace-collection recipe ("keep a trace only when a
step exceeds 1.5x the median").  The median is over the steady-state steps
(after the warm-up) when there are any.  Where the profiler recorded the step,
its time is split into buckets (:func:`step_buckets`, µs) and the outlier's
``cause`` is the bucket that exceeds the median normal step's by the most
(:func:`outlier_cause`).  Events the harness timed inside a step name the
cause first when they explain at least half of its excess over the median
(:data:`EVENT_SHARE`): a checkpoint save (every ``torch.save``) or a
``torch.compile`` compilation (:func:`step_events`).
"""
from __future__ import annotations

import statistics

from goblin_assets.runners.trace import StepIntervals, TraceSummary

#: A step is an outlier past this multiple of the median step (TraceLens's trace-collection criterion).
OUTLIER_RATIO = 1.5
BUCKETS = ("compute", "loader", "sync", "collective", "host")
#: Timed events name an outlier's cause when they take at least this share of its excess over the median (ours:
#: most of the extra time, so a small save inside a step slowed by something else does not take the blame).
EVENT_SHARE = 0.5


def step_events(result) -> list[dict]:
    """The timed events of one harness run (a ``HarnessResult``): ``{"step", "seconds", "kind", "where"}`` with
    ``kind`` ``checkpoint_save`` (each ``torch.save``) or ``compile`` (each torch.compile compilation, from
    runners/compile_probe.py; ``where`` None)."""
    out = [{"step": int(e["step"]), "seconds": float(e["seconds"]), "kind": "checkpoint_save",
            "where": e.get("where")} for e in getattr(result, "saves", None) or []]
    for c in ((getattr(result, "dynamo", None) or {}).get("compiles") or []):
        if c.get("step") is not None and c.get("seconds") is not None:
            out.append({"step": int(c["step"]), "seconds": float(c["seconds"]), "kind": "compile", "where": None})
    return out


def _event_cause(events: list[dict], excess_s: float) -> tuple[str, str] | None:
    """(kind, detail) of the events of one step when together they explain :data:`EVENT_SHARE` of ``excess_s``."""
    total = sum(e["seconds"] for e in events)
    if not events or excess_s <= 0 or total < EVENT_SHARE * excess_s:
        return None
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[e["kind"]] = by_kind.get(e["kind"], 0.0) + e["seconds"]
    kind = max(by_kind, key=by_kind.get)
    mine = [e for e in events if e["kind"] == kind]
    where = sorted({e["where"] for e in mine if e.get("where")})
    name = {"checkpoint_save": "torch.save", "compile": "torch.compile compilation"}.get(kind, kind)
    detail = (f"{len(mine)} {name} call{'s' if len(mine) != 1 else ''} took {by_kind[kind]:.3f} s of the "
              f"{excess_s:.3f} s over the median" + (f" ({', '.join(where[:3])})" if where else ""))
    return kind, detail


def step_buckets(s: StepIntervals, gpu: bool, sync_us: float = 0.0) -> dict[str, float]:
    """One step's time (µs) by bucket: ``compute`` (GPU: device time of non-collective work,
    ``device_busy - comm_exposed``; CPU: the ops' own time outside loader and collectives), ``loader``
    (DataLoader ranges), ``sync`` (blocking host-device syncs, given), ``collective`` and ``host`` (the rest
    of the step: GPU, device idle time outside loader and syncs; CPU, time outside ops, loader, collectives
    and syncs, e.g. Python or a ``time.sleep``)."""
    if gpu:
        compute = s.device_busy_us - s.comm_exposed_us
        host = max(s.dur_us - s.device_busy_us - s.data_wait_us - sync_us, 0.0)
    else:
        compute = s.op_us
        host = max(s.dur_us - compute - s.data_wait_us - s.collective_us - sync_us, 0.0)
    return {"compute": compute, "loader": s.data_wait_us, "sync": sync_us, "collective": s.collective_us,
            "host": host}


def outlier_cause(step: dict[str, float], normal: dict[str, float]) -> str:
    """The bucket (:data:`BUCKETS`) whose excess of ``step`` over ``normal`` (the median normal step) is largest."""
    return max(BUCKETS, key=lambda b: step.get(b, 0.0) - normal.get(b, 0.0))


def median_buckets(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per bucket, the median over ``rows`` (0 for an empty list)."""
    return {b: statistics.median(r[b] for r in rows) if rows else 0.0 for b in BUCKETS}


def outlier_steps(times_s: list[float], warmup: int = 0, summary: TraceSummary | None = None,
                  first_profiled: int | None = None, events: list[dict] | None = None) -> list[dict]:
    """The outlier steps of a run whose optimizer steps took ``times_s`` seconds (step 1 first).

    Returns one dict per outlier: ``step`` (1-based, warm-up counted),
    ``time_s``, ``ratio`` (to the median of the steps after ``warmup``, or of
    all steps when there are none after it), ``phase`` (``warm-up`` |
    ``measured``) and, when the step was profiled (``summary``'s i-th step is
    step ``first_profiled + i``), ``cause`` (:func:`outlier_cause`) and
    ``buckets_us``; ``cause`` is ``not_observable`` for steps the profiler did
    not record.  ``events`` (:func:`step_events`) that explain
    :data:`EVENT_SHARE` of a step's excess over the median set its ``cause``
    to their kind (``checkpoint_save``, ``compile``) with ``cause_detail``
    (how many, how long, called where).  Empty when fewer than three steps
    were timed.
    """
    if len(times_s) < 3:
        return []
    steady = times_s[warmup:] if len(times_s) > warmup else times_s
    med = statistics.median(steady)
    if med <= 0:
        return []
    profiled: dict[int, dict[str, float]] = {}
    if summary is not None and first_profiled is not None:
        steps = sorted(summary.steps, key=lambda s: s.start_us)
        profiled = {first_profiled + i: step_buckets(s, summary.has_device) for i, s in enumerate(steps)}
    normal = median_buckets([b for n, b in profiled.items() if times_s[n - 1] <= OUTLIER_RATIO * med]
                            if profiled else [])
    out = []
    for n, t in enumerate(times_s, start=1):
        if t <= OUTLIER_RATIO * med:
            continue
        row = {"step": n, "time_s": t, "ratio": t / med, "phase": "warm-up" if n <= warmup else "measured"}
        if n in profiled:
            row["cause"] = outlier_cause(profiled[n], normal)
            row["buckets_us"] = {k: round(v, 1) for k, v in profiled[n].items()}
        else:
            row["cause"] = "not_observable"
        named = _event_cause([e for e in events or [] if e["step"] == n], t - med)
        if named is not None:
            row["cause"], row["cause_detail"] = named
        out.append(row)
    return out
