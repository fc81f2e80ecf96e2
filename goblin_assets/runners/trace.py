"""Read a torch.profiler Chrome trace into per-step time intervals.

The trace keeps the profiler's own schema (``traceEvents`` with ``ph: "X"``
complete events, microsecond ``ts``/``dur``), so Perfetto and Holistic Trace
Analysis open the same file.  Names used here (``ProfilerStep#N``,
``enumerate(DataLoader)#...__next__``, ``cat`` ``cpu_op``/``kernel``) are those
torch 2.x writes (see ``shared/profiling_facts.md`` section 2).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: Event categories that are device work on GPU traces (HTA's kernel kinds).
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#|^enumerate\(DataPipe\)#")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class StepIntervals:
    """One profiled step: its window and the time covered by each kind of event (µs)."""

    index: int
    start_us: float
    end_us: float
    data_wait_us: float = 0.0
    op_us: float = 0.0        # union of CPU op time outside data loading
    device_busy_us: float = 0.0  # union of device kernel time (GPU traces)

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class TraceSummary:
    """Per-step intervals of one trace; ``has_device`` when GPU kernels were recorded."""

    steps: list[StepIntervals] = field(default_factory=list)
    has_device: bool = False
    device_name: str | None = None


def union_length(intervals, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Total length of the union of ``(start, end)`` intervals clipped to ``[lo, hi]`` (same unit as the input)."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def _subtract(intervals: list[tuple[float, float]], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` minus the union of ``holes`` (both lists of (start, end))."""
    if not holes:
        return intervals
    holes = sorted(holes)
    out: list[tuple[float, float]] = []
    for a, b in intervals:
        pieces = [(a, b)]
        for ha, hb in holes:
            if hb <= a or ha >= b:
                continue
            nxt = []
            for pa, pb in pieces:
                if hb <= pa or ha >= pb:
                    nxt.append((pa, pb))
                    continue
                if pa < ha:
                    nxt.append((pa, ha))
                if hb < pb:
                    nxt.append((hb, pb))
            pieces = nxt
        out.extend(pieces)
    return out


def read_trace(path: str | Path) -> TraceSummary:
    """Split a Chrome trace into its ``ProfilerStep#N`` windows.

    Per step: ``data_wait_us`` is the union of DataLoader ``__next__`` ranges;
    ``op_us`` the union of ``cpu_op`` events outside those ranges (host time
    spent executing ops: forward, backward, optimizer); ``device_busy_us`` the
    union of GPU kernel/memcpy/memset events.

    Raises
    ------
    ValueError
        The file is not a Chrome trace or holds no ``ProfilerStep#`` events.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable Chrome trace ({exc})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list")
    steps: list[StepIntervals] = []
    loaders: list[tuple[float, float]] = []
    ops: list[tuple[float, float]] = []
    device: list[tuple[float, float]] = []
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        name, cat = ev.get("name", ""), ev.get("cat", "")
        a = float(ev["ts"])
        b = a + float(ev["dur"])
        m = _STEP.match(name)
        if m and cat in ("user_annotation", "cpu_op", ""):
            steps.append(StepIntervals(index=int(m.group(1)), start_us=a, end_us=b))
        elif _DATALOADER.match(name):
            loaders.append((a, b))
        elif cat == "cpu_op":
            ops.append((a, b))
        elif cat in _DEVICE_CATS:
            device.append((a, b))
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep# events (was the profiler stepped?)")
    steps.sort(key=lambda s: s.index)
    ops_outside = _subtract(ops, loaders)
    for s in steps:
        s.data_wait_us = union_length(loaders, s.start_us, s.end_us)
        s.op_us = union_length(ops_outside, s.start_us, s.end_us)
        s.device_busy_us = union_length(device, s.start_us, s.end_us)
    props = doc.get("deviceProperties") or []
    return TraceSummary(
        steps=steps,
        has_device=bool(device),
        device_name=props[0].get("name") if props and isinstance(props[0], dict) else None,
    )


def median_step_us(summary: TraceSummary) -> float:
    """Median step duration in µs."""
    return float(np.median([s.dur_us for s in summary.steps]))
