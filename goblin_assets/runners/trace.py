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

#: aten GEMM ops and the argument positions of their two matrix operands (lhs [.., M, K],
#: rhs [.., K, N]) in ``Input Dims`` (torch's native_functions.yaml signatures).
#: ``aten::linear`` / ``aten::matmul`` are left out: they dispatch to these.
GEMM_OPS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::_addmm_activation": (1, 2),
    "aten::bmm": (0, 1), "aten::baddbmm": (1, 2),
}


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
class GemmCall:
    """One GEMM op of a profiled step, with its shape from ``record_shapes``.

    ``m, n, k`` are the matrix dimensions (lhs ``[.., M, K]`` x rhs ``[.., K, N]``),
    ``batch`` the product of leading (bmm) dimensions, ``dtype`` the profiler's
    ``Input type`` of the lhs (``float`` = fp32, ``c10::BFloat16``, ``c10::Half``).
    ``time_us`` is the op's own CPU duration on CPU traces, the summed duration
    of the device kernels it launched (linked by ``External id``) on GPU traces.
    """

    name: str
    dtype: str
    m: int
    n: int
    k: int
    batch: int
    time_us: float
    step: int


@dataclass
class TraceSummary:
    """Per-step intervals of one trace; ``has_device`` when GPU kernels were recorded.

    ``gemms`` lists the GEMM ops inside profiled steps (empty when the trace has
    no ``Input Dims``, i.e. was recorded without ``record_shapes``).
    ``alloc_step_bytes`` maps a step index to ``(allocated at step start, peak
    allocated in the step)`` in bytes, from the profiler's ``[memory]`` events of
    the step's device (present only with ``profile_memory=True``).
    """

    steps: list[StepIntervals] = field(default_factory=list)
    has_device: bool = False
    device_name: str | None = None
    gemms: list[GemmCall] = field(default_factory=list)
    alloc_step_bytes: dict[int, tuple[float, float]] = field(default_factory=dict)


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


def _gemm_shape(name: str, args: dict) -> tuple[str, int, int, int, int] | None:
    """(dtype, M, N, K, batch) of a GEMM op from its ``Input Dims``/``Input type``; None if absent."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    li, ri = GEMM_OPS[name]
    try:
        lhs, rhs = dims[li], dims[ri]
        if len(lhs) < 2 or len(rhs) < 2:
            return None
        batch = 1
        for d in lhs[:-2]:
            batch *= int(d)
        return str(types[li]), int(lhs[-2]), int(rhs[-1]), int(lhs[-1]), batch
    except (TypeError, IndexError, ValueError):
        return None


def _step_of(steps: list[StepIntervals], t: float) -> int | None:
    for s in steps:
        if s.start_us <= t < s.end_us:
            return s.index
    return None


def _collect_gemms(steps: list[StepIntervals], gemm_ops: list[dict], kernel_us: dict[int, float],
                   has_device: bool) -> list[GemmCall]:
    """GEMM calls inside steps; nested GEMM events (one inside another) count once."""
    out: list[GemmCall] = []
    last_end = float("-inf")
    for ev in sorted(gemm_ops, key=lambda e: float(e["ts"])):
        a, b = float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])
        if a < last_end and not has_device:
            continue  # inside the previous GEMM op (same work)
        last_end = max(last_end, b)
        step = _step_of(steps, a)
        shape = _gemm_shape(ev["name"], ev.get("args") or {})
        if step is None or shape is None:
            continue
        if has_device:
            t = kernel_us.get((ev.get("args") or {}).get("External id"), 0.0)
            if t <= 0:
                continue
        else:
            t = b - a
        out.append(GemmCall(ev["name"], shape[0], shape[1], shape[2], shape[3], shape[4], t, step))
    return out


def _alloc_per_step(steps: list[StepIntervals], mem: list[dict], device_type: int) -> dict[int, tuple[float, float]]:
    """Per step: (allocated bytes at the step's first allocation event, peak allocated bytes)."""
    out: dict[int, tuple[float, float]] = {}
    for ev in sorted(mem, key=lambda e: float(e["ts"])):
        args = ev.get("args") or {}
        if int(args.get("Device Type", 0)) != device_type or "Total Allocated" not in args:
            continue
        step = _step_of(steps, float(ev["ts"]))
        if step is None:
            continue
        total = float(args["Total Allocated"])
        if step not in out:
            out[step] = (total - float(args.get("Bytes", 0)), total)
        else:
            out[step] = (out[step][0], max(out[step][1], total))
    return out


def read_trace(path: str | Path) -> TraceSummary:
    """Split a Chrome trace into its ``ProfilerStep#N`` windows.

    Per step: ``data_wait_us`` is the union of DataLoader ``__next__`` ranges;
    ``op_us`` the union of ``cpu_op`` events outside those ranges (host time
    spent executing ops: forward, backward, optimizer); ``device_busy_us`` the
    union of GPU kernel/memcpy/memset events.  GEMM calls (``aten::mm``,
    ``addmm``, ``bmm``, ``baddbmm``) with their shapes and times, and the
    allocator's per-step memory from ``[memory]`` events, see
    :class:`TraceSummary`.

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
    gemm_ops: list[dict] = []
    kernel_us: dict[int, float] = {}
    mem: list[dict] = []
    for ev in events:
        if ev.get("ph") == "i" and ev.get("name") == "[memory]":
            mem.append(ev)
            continue
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
            if name in GEMM_OPS:
                gemm_ops.append(ev)
        elif cat in _DEVICE_CATS:
            device.append((a, b))
            ext = (ev.get("args") or {}).get("External id")
            if cat == "kernel" and ext is not None:
                kernel_us[ext] = kernel_us.get(ext, 0.0) + float(ev["dur"])
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep# events (was the profiler stepped?)")
    steps.sort(key=lambda s: s.index)
    ops_outside = _subtract(ops, loaders)
    for s in steps:
        s.data_wait_us = union_length(loaders, s.start_us, s.end_us)
        s.op_us = union_length(ops_outside, s.start_us, s.end_us)
        s.device_busy_us = union_length(device, s.start_us, s.end_us)
    props = doc.get("deviceProperties") or []
    has_device = bool(device)
    return TraceSummary(
        steps=steps,
        has_device=has_device,
        device_name=props[0].get("name") if props and isinstance(props[0], dict) else None,
        gemms=_collect_gemms(steps, gemm_ops, kernel_us, has_device),
        # Kineto's [memory] events: Device Type 0 = CPU, 1 = CUDA (HIP reports as CUDA).
        alloc_step_bytes=_alloc_per_step(steps, mem, 1 if has_device else 0),
    )


def median_step_us(summary: TraceSummary) -> float:
    """Median step duration in µs."""
    return float(np.median([s.dur_us for s in summary.steps]))
