"""The run's own signals: warnings, stderr lines and per-step records, matched to a table of known messages.

The harness records the Python warnings the user's script raised
(deduplicated), each optimizer step's loss and how many trainable parameters
had no gradient at each step; the runner keeps the tail of stderr.  Here they
become :class:`~goblin_assets.contracts.Signal` records: one per known message
of ``kb/signals.yaml`` (a pattern table, as data) that came,
plus the derived signals ``loss_nonfinite`` (steps whose loss was NaN/inf),
``grads_missing`` (trainable parameters without a gradient after the first
step) and ``params_nonfinite`` (parameters holding NaN/inf at the end).  Rules
read them as ``signals.<id>`` (a count; 0 when it did not come).
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from goblin_assets.contracts import Signal
from goblin_assets.errors import KBError
from goblin_assets.measure.compile_counters import COMPILE_SIGNALS, compile_signals, compile_stats
from goblin_assets.measure.hang import HANG_SIGNALS

#: The table of known messages (package data).
SIGNALS_FILE = files("goblin_assets.kb.data") / "signals.yaml"

#: Signals computed from the harness's per-step records rather than matched in text.
DERIVED: dict[str, str] = {
    "loss_nonfinite": "optimizer steps whose loss was NaN or inf",
    "grads_missing": "trainable parameters that had no gradient at an optimizer step after the first",
    "params_nonfinite": "parameters of the stepped optimizers holding NaN or inf at the end of the run",
    # from a recorded GPU trace's graded findings (goblin_assets/trace/analysis.py trace_signals)
    "trace_activation_recompute": "profiled steps whose trace shows forward work re-run inside backward",
    "trace_sync_wait": "a recorded trace whose host waits in blocking syncs at least a moderate share of the step",
    "trace_cpu_launch_bound": "profiled steps whose trace is bound by the host launching work (device idle)",
    # torch.compile's own record of the run (goblin_assets/measure/compile_counters.py)
    **COMPILE_SIGNALS,
    # where the threads of a hung run waited (goblin_assets/measure/hang.py; the failure report reads them)
    **HANG_SIGNALS,
}


@dataclass(frozen=True)
class Pattern:
    """One known message: ``id``, the compiled ``pattern``, what it means, and its source (title, url)."""

    id: str
    pattern: re.Pattern[str]
    meaning: str
    source: dict[str, str]


@functools.lru_cache(maxsize=4)
def load_signals(path: str | None = None) -> tuple[Pattern, ...]:
    """The pattern table (default :data:`SIGNALS_FILE`).

    Raises
    ------
    KBError
        Unreadable YAML, a missing key, a duplicate id, a pattern that does
        not compile, or an id that clashes with a derived signal (names the file and the entry).
    """
    p = Path(path) if path else SIGNALS_FILE
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KBError(f"{p}: cannot read the signal table: {exc}") from None
    out: list[Pattern] = []
    for i, item in enumerate((doc or {}).get("signals") or []):
        try:
            sid = item["id"]
            pat = re.compile(item["pattern"])
            row = Pattern(sid, pat, " ".join(str(item["meaning"]).split()), dict(item["source"]))
        except (KeyError, TypeError, re.error) as exc:
            raise KBError(f"{p}: signals[{i}]: {exc!r}") from None
        if sid in DERIVED or any(o.id == sid for o in out):
            raise KBError(f"{p}: signals[{i}]: id {sid!r} is used twice")
        out.append(row)
    return tuple(out)


def signal_ids() -> tuple[str, ...]:
    """Every ``signals.<id>`` a condition may read: the table's ids and the derived ones."""
    return (*(s.id for s in load_signals()), *DERIVED)


def _nonfinite(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, float) and not math.isfinite(v))


def run_signals(result: Any, stderr_tail: str = "") -> list[Signal]:
    """The signals of one child run (``result``: a HarnessResult), in table order, then the derived ones.

    A known message counts once per deduplicated warning (times its count) and
    once per stderr line that holds it.
    """
    warns = list(getattr(result, "python_warnings", []) or [])
    lines = [ln for ln in (stderr_tail or "").splitlines() if ln.strip()]
    out: list[Signal] = []
    for s in load_signals():
        hits = [(w.count, w.message, w.where, w.step) for w in warns if s.pattern.search(w.message)]
        hits += [(1, ln.strip()[:300], "stderr", None) for ln in lines if s.pattern.search(ln)]
        if hits:
            out.append(Signal(id=s.id, count=sum(h[0] for h in hits), message=hits[0][1], where=hits[0][2],
                              step=hits[0][3], meaning=s.meaning, source=s.source.get("url", "")))
    losses = list(getattr(result, "losses", []) or [])
    bad = [i + 1 for i, v in enumerate(losses) if _nonfinite(v)]
    if bad:
        out.append(Signal(id="loss_nonfinite", count=len(bad), message=f"loss {losses[bad[0] - 1]}",
                          where="loss", step=bad[0], meaning=DERIVED["loss_nonfinite"]))
    missing = list(getattr(result, "grads_missing", []) or [])[1:]  # the first step may legitimately build grads
    if missing and max(missing) > 0:
        step = next(i + 2 for i, n in enumerate(missing) if n > 0)
        out.append(Signal(id="grads_missing", count=max(missing),
                          message=f"{max(missing)} of {getattr(result, 'params_trainable', 0)} trainable parameters "
                                  "had no gradient", where="optimizer", step=step, meaning=DERIVED["grads_missing"]))
    params = list(getattr(result, "nonfinite_params", []) or [])
    if params:
        out.append(Signal(id="params_nonfinite", count=len(params), message=params[0], where="parameters",
                          step=getattr(result, "first_nonfinite_step", None), meaning=DERIVED["params_nonfinite"]))
    out += compile_signals(compile_stats(getattr(result, "dynamo", None)))
    return out


def signal_counts(signals: list[Signal]) -> dict[str, int]:
    """``signals.<id>`` of detect conditions: every known id with its count (0 when it did not come)."""
    counts = dict.fromkeys(signal_ids(), 0)
    for s in signals:
        counts[s.id] = counts.get(s.id, 0) + s.count
    return counts
