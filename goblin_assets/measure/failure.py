"""A failed run's class, read from its own words: the failure line, the end of its stderr, its recorded signals.

A run that failed as written (live, or recorded elsewhere and replayed) is
still evidence.  :func:`diagnose_failure` names its class from the first of
these that its text shows, most specific first:

==========================  ====================================================================
class                       what shows it
==========================  ====================================================================
out_of_memory               an allocator's out-of-memory message (CUDA/HIP ``OutOfMemoryError``,
                            torch's CPU allocator, ``MemoryError``; signal ``oom_error``)
invalid_device_function     the build has no kernel for this GPU (signal ``invalid_device_function``)
hang                        a collective's watchdog timed out (``collective_timeout``) or the run
                            made no progress until the runner's wall-clock limit (``run_timeout``)
                            or its stall watch stopped it (``run_stalled``)
collective_error            NCCL/RCCL reported an error (``collective_error``)
library_error               a library's own setup or error line (``library_setup_failed``, else
                            the last ``SomethingError: ...`` line of the traceback)
killed                      the process was killed by a signal
exit_status                 a non-zero exit status and nothing else known
==========================  ====================================================================

The signals are the ``kb/signals.yaml`` patterns (:func:`run_signals`), so
KB rules match on the failure as on any run (``signals.oom_error > 0``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from goblin_assets.contracts import RunMetrics, Signal
from goblin_assets.measure.signals import run_signals
from goblin_assets.runners.oom import DeviceOom, parse_device_oom

#: (class, signal id, what a person reads), most specific first.
FAILURE_SIGNALS: tuple[tuple[str, str, str], ...] = (
    ("out_of_memory", "oom_error", "out of memory"),
    ("invalid_device_function", "invalid_device_function",
     "invalid device function: the installed build has no kernel for this GPU's architecture"),
    ("hang", "collective_timeout", "hang: a collective operation timed out (a rank stopped reaching it)"),
    ("hang", "run_timeout", "hang: no progress until the wall-clock limit"),
    ("hang", "run_stalled", "hang: no optimizer step in many times the median step time"),
    ("collective_error", "collective_error", "collective communication error (NCCL/RCCL)"),
    ("library_error", "library_setup_failed", "a library failed to set up its native code"),
)

#: The last line of a Python traceback: ``torch.OutOfMemoryError: ...``, ``RuntimeError: ...``.
_ERROR_LINE = re.compile(r"(?:^|\s)((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)):\s*(.*)$")
_KILLED = re.compile(r"killed by (SIG\w+)|exit(?:ed with)? (?:code|status) -9\b|\bSIGKILL\b")
_EXIT = re.compile(r"exit(?:ed with)? (?:code|status) (-?\d+)")


@dataclass
class FailureDiagnosis:
    """What a failed run says about itself.

    ``failure_class``: one of the module table's classes, ``unknown`` when
    nothing names it; ``label``: the sentence for people; ``evidence``: the
    line that named it; ``signals``: every known message in its text (the
    recording's own signals too); ``exit_status`` and ``last_step`` (optimizer
    steps the run completed, from its recording) when known, else None;
    ``device_oom``: a device allocator's out-of-memory message read into its
    numbers (:func:`goblin_assets.runners.oom.parse_device_oom`), None when the
    class is not ``out_of_memory`` or the text prints none.
    """

    failure_class: str
    label: str
    evidence: str
    signals: list[Signal] = field(default_factory=list)
    exit_status: int | None = None
    last_step: int | None = None
    device_oom: DeviceOom | None = None

    def to_json(self) -> dict:
        """The ``failure_diagnosis`` object of ``goblin audit --json`` (keys are a contract; ``device_oom``, added
        later: :meth:`DeviceOom.values` in bytes with its ``kind``, or None)."""
        return {"failure_class": self.failure_class, "label": self.label, "evidence": self.evidence,
                "signals": [s.id for s in self.signals], "exit_status": self.exit_status,
                "last_step": self.last_step,
                "device_oom": self.device_oom.values() if self.device_oom is not None else None}


def diagnose_failure(failure: str, stderr_tail: str = "", metrics: RunMetrics | None = None) -> FailureDiagnosis:
    """The class of one failed run (see the module table), from its failure line, stderr tail and recording.

    Parameters
    ----------
    failure
        The run's one-line failure (``RunMetrics.failure``, or a RunFailed message).
    stderr_tail
        The end of its stderr (``RunMetrics.stderr_tail``).
    metrics
        The failed run's RunMetrics, when there is one: its recorded
        ``signals`` are kept, ``steps`` gives ``last_step``.

    Returns
    -------
    FailureDiagnosis
        Never raises: a text that names nothing is ``unknown`` (or ``exit_status``).
    """
    text = f"{failure or ''}\n{stderr_tail or ''}"
    found = run_signals(None, text)
    recorded = list(getattr(metrics, "signals", None) or [])
    have = {s.id for s in found}
    signals = found + [s for s in recorded if s.id not in have]
    ids = {s.id for s in signals}
    m_exit = _EXIT.search(text)
    exit_status = int(m_exit.group(1)) if m_exit else None
    last = (metrics.steps or None) if metrics is not None else None
    for cls, sid, label in FAILURE_SIGNALS:
        if sid in ids:
            sig = next(s for s in signals if s.id == sid)
            return FailureDiagnosis(cls, label, sig.message, signals, exit_status, last,
                                    parse_device_oom(text) if cls == "out_of_memory" else None)
    errors = [m for ln in text.splitlines() if (m := _ERROR_LINE.search(ln))]
    if errors:
        name, msg = errors[-1].group(1), errors[-1].group(2)
        return FailureDiagnosis("library_error", f"{name} raised by the program or a library it calls",
                                f"{name}: {msg}"[:300], signals, exit_status, last)
    if (k := _KILLED.search(text)) is not None:
        return FailureDiagnosis("killed", f"killed by {k.group(1) or 'SIGKILL'}", k.group(0), signals,
                                exit_status, last)
    if exit_status is not None:
        return FailureDiagnosis("exit_status", f"exited with status {exit_status}", m_exit.group(0), signals,
                                exit_status, last)
    first = (failure or "").strip().splitlines()[0] if (failure or "").strip() else ""
    return FailureDiagnosis("unknown", "the failure's class is not named in its text", first[:300], signals,
                            exit_status, last)
