"""Read a torch.profiler Chrome trace into per-step time intervals.

The trace keeps the profiler's own schema (``traceEvents`` with ``ph: "X"``
complete events, microsecond ``ts``/``dur``), so Perfetto and Holistic Trace
Analysis open the same file.  Names used here (``ProfilerStep#N``,
``enumerate(DataLoader)#...__next__``, ``cat`` ``cpu_op``/``kernel``) are those
torch 2.x writes (see ``docs/sources.md`` "Profiler trace format").  Which
kernel or op is a GEMM, a collective, an attention kernel ... comes from the
one category table (:mod:`goblin_assets.runners.categories`).

Collective communication is measured where the trace can show it: on GPU
traces the collective kernels (NCCL/RCCL), on CPU traces the collective ops
(``c10d::*`` on the calling thread, ``gloo:*`` ranges on gloo's worker
threads).  Its *exposed* part is the time a collective runs while no other
work does: ``|C ∪ N| - |N|`` per step, with C the collective intervals and N
the other device kernels (GPU) or the other ops' own (self) time (CPU), the
same overlap HTA's ``get_comm_comp_overlap`` measures.
"""
from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from goblin_assets.runners.categories import classify, gemm_operands
from goblin_assets.runners.kineto_json import Args, Event, KinetoDecodeError, KinetoDoc, decode, read_bytes

#: Event categories that are device work on GPU traces (HTA's kernel kinds).
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#|^enumerate\(DataPipe\)#")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: Process-group backends whose collectives run as device kernels (``distributedInfo.backend``).
_DEVICE_BACKENDS = ("nccl", "rccl", "xccl")

Interval = tuple[float, float]


@dataclass
class StepIntervals:
    """One profiled step: its window and the time covered by each kind of event (µs).

    ``op_us``: union of the CPU ops' own time outside data loading and
    outside collectives; ``device_busy_us``: union of device kernel, memcpy
    and memset time (GPU traces); ``collective_us``: union of collective time
    (collective kernels on GPU traces, collective ops on CPU traces);
    ``comm_exposed_us``: the part of it no other work overlaps (see the
    module docstring); ``category_us``: summed time per category of the table
    (device events on GPU traces; the ops' self time outside data loading on
    CPU traces, collectives as ``collective``), which may exceed the step when
    streams or threads overlap.
    """

    index: int
    start_us: float
    end_us: float
    data_wait_us: float = 0.0
    op_us: float = 0.0
    device_busy_us: float = 0.0
    collective_us: float = 0.0
    comm_exposed_us: float = 0.0
    category_us: dict[str, float] = field(default_factory=dict)

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
    ``collectives`` counts the collective events that start inside a step
    (kernels on GPU traces, ops and gloo ranges on CPU traces) and ``others``
    the other events of the same kind (device events, CPU ops);
    ``backend``/``world_size`` are the process group's, from the trace's
    ``distributedInfo`` (None for a single process).
    """

    steps: list[StepIntervals] = field(default_factory=list)
    has_device: bool = False
    device_name: str | None = None
    gemms: list[GemmCall] = field(default_factory=list)
    alloc_step_bytes: dict[int, tuple[float, float]] = field(default_factory=dict)
    collectives: int = 0
    others: int = 0
    backend: str | None = None
    world_size: int | None = None

    @property
    def comm_not_observable(self) -> str | None:
        """Why this trace cannot show collective time (None when it can).

        A GPU trace shows collective kernels when they run.  A CPU trace shows
        gloo/c10d collectives, but not those of an NCCL/RCCL process group,
        which run on a device whose activity was not recorded; and a trace with
        no op at all in its steps shows nothing.
        """
        if self.has_device:
            return None
        if self.backend and self.backend.lower() in _DEVICE_BACKENDS:
            return (f"the process group's backend is {self.backend}, whose collectives run as device kernels, "
                    "but the trace recorded no device activity (ProfilerActivity.CUDA off)")
        if self.collectives + self.others == 0:
            return "the trace records no CPU ops in the profiled steps"
        return None


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


class UnionIndex:
    """The union of ``(start, end)`` intervals, merged once, answering clipped-length queries in O(log n).

    ``length(lo, hi)`` equals ``union_length(intervals, lo, hi)``; building it
    sorts once, so per-step queries over a long trace stay linear overall
    (``union_length`` per step would re-sort every interval for every step).
    """

    def __init__(self, intervals):
        merged = _merged([(float(a), float(b)) for a, b in intervals if b > a])
        self.starts = np.array([a for a, _ in merged], dtype=float)
        self.ends = np.array([b for _, b in merged], dtype=float)
        self.cum = np.concatenate([[0.0], np.cumsum(self.ends - self.starts)])

    def _covered_before(self, t: float) -> float:
        """Union length inside ``(-inf, t]``."""
        i = int(np.searchsorted(self.starts, t, side="right"))  # intervals starting at or before t
        if i == 0:
            return 0.0
        return float(self.cum[i - 1] + min(self.ends[i - 1], t) - self.starts[i - 1])

    def length(self, lo: float, hi: float) -> float:
        """Length (input unit) of the union clipped to ``[lo, hi]``."""
        return max(self._covered_before(hi) - self._covered_before(lo), 0.0) if hi > lo else 0.0


def _step_finder(steps: list[StepIntervals]):
    """A function ``t -> index of the step whose window holds t`` (None outside every step), O(log steps)."""
    order = sorted(steps, key=lambda s: s.start_us)
    starts = [s.start_us for s in order]

    def find(t: float) -> int | None:
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and order[i].start_us <= t < order[i].end_us:
            return order[i].index
        # overlapping windows (rare): fall back to the first step that holds t, as a linear scan would
        for s in steps:
            if s.start_us <= t < s.end_us:
                return s.index
        return None

    return find


def _clipped_sums(items: list[tuple[float, float, str]], steps: list[StepIntervals]) -> list[dict[str, float]]:
    """Per step (in ``steps`` order): summed length per label of the items clipped to the step's window."""
    order = sorted(range(len(steps)), key=lambda i: steps[i].start_us)
    starts = [steps[i].start_us for i in order]
    sums: list[dict[str, float]] = [defaultdict(float) for _ in steps]
    for a, b, label in items:
        j = max(bisect.bisect_right(starts, a) - 1, 0)
        while j < len(order) and steps[order[j]].start_us < b:
            s = steps[order[j]]
            if b > s.start_us and a < s.end_us:
                sums[order[j]][label] += min(b, s.end_us) - max(a, s.start_us)
            j += 1
    return [dict(d) for d in sums]


def _merged(intervals: list[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _cut(items: list[tuple[float, float, str]], holes: list[Interval]) -> list[tuple[float, float, str]]:
    """Labelled ``(start, end, label)`` intervals minus the union of ``holes``; each piece keeps its label."""
    if not holes:
        return list(items)
    merged = _merged(holes)
    starts = [a for a, _ in merged]
    out: list[tuple[float, float, str]] = []
    for a, b, label in items:
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        cur = a
        while i < len(merged) and merged[i][0] < b:
            ha, hb = merged[i]
            if hb > cur:
                if ha > cur:
                    out.append((cur, ha, label))
                cur = hb
            i += 1
        if cur < b:
            out.append((cur, b, label))
    return out


def _subtract(intervals: list[Interval], holes: list[Interval]) -> list[Interval]:
    """``intervals`` minus the union of ``holes`` (both lists of (start, end)); order kept."""
    return [(a, b) for a, b, _ in _cut([(a, b, "") for a, b in intervals], holes)]


def _gemm_shape(name: str, args: Args) -> tuple[str, int, int, int, int] | None:
    """(dtype, M, N, K, batch) of a GEMM op from its ``Input Dims``/``Input type``; None if absent."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    ops = gemm_operands(name)
    try:
        lhs, rhs = dims[ops.lhs], dims[ops.rhs]
        if len(lhs) < 2 or len(rhs) < 2:
            return None
        batch = 1
        for d in lhs[:-2]:
            batch *= int(d)
        return str(types[ops.lhs]), int(lhs[-2]), int(rhs[-1]), int(lhs[-1]), batch
    except (TypeError, IndexError, ValueError):
        return None


def _collect_gemms(steps: list[StepIntervals], gemm_ops: list[Event], kernel_us: dict[int, float],
                   has_device: bool) -> list[GemmCall]:
    """GEMM calls inside steps; nested GEMM events (one inside another) count once."""
    out: list[GemmCall] = []
    last_end = float("-inf")
    step_of = _step_finder(steps)
    for ev in sorted(gemm_ops, key=lambda e: float(e.ts)):
        a, b = float(ev.ts), float(ev.ts) + float(ev.dur)
        if a < last_end and not has_device:
            continue  # inside the previous GEMM op (same work)
        last_end = max(last_end, b)
        step = step_of(a)
        shape = _gemm_shape(ev.name, ev.args or Args())
        if step is None or shape is None:
            continue
        if has_device:
            t = kernel_us.get((ev.args or Args()).external_id, 0.0)
            if t <= 0:
                continue
        else:
            t = b - a
        out.append(GemmCall(ev.name, shape[0], shape[1], shape[2], shape[3], shape[4], t, step))
    return out


def _alloc_per_step(steps: list[StepIntervals], mem: list[Event], device_type: int) -> dict[int, tuple[float, float]]:
    """Per step: (allocated bytes at the step's first allocation event, peak allocated bytes)."""
    out: dict[int, tuple[float, float]] = {}
    step_of = _step_finder(steps)
    for ev in sorted(mem, key=lambda e: float(e.ts)):
        args = ev.args or Args()
        if int(args.get("Device Type", 0)) != device_type or args.total_allocated is None:
            continue
        step = step_of(float(ev.ts))
        if step is None:
            continue
        total = float(args.total_allocated)
        if step not in out:
            out[step] = (total - float(args.get("Bytes", 0)), total)
        else:
            out[step] = (out[step][0], max(out[step][1], total))
    return out


@dataclass
class _HostTime:
    """CPU ops of a trace split into collective intervals and the other ops' self-time segments."""

    collective: list[Interval] = field(default_factory=list)  # outermost collective ops / gloo ranges
    own: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, category) self-time segments
    op_starts: list[float] = field(default_factory=list)  # start of every op outside a collective


def _host_time(threads: dict[tuple, list[tuple[float, float, str]]]) -> _HostTime:
    """Walk each thread's nested ops: collective ops (with everything inside them) and the others' self time.

    ``threads`` maps ``(pid, tid)`` to ``(start, end, category)`` of its ops.
    An op's self time is its interval minus its children's; an op inside a
    collective op belongs to the collective.  Improperly nested events (a
    child ending after its parent, from timestamp rounding) are clipped.
    """
    out = _HostTime()
    for events in threads.values():
        stack: list[list] = []  # [start, end, category, inside a collective, children]

        def close(node: list) -> None:
            if not node[3]:
                out.own.extend((a, b, node[2]) for a, b in _subtract([(node[0], node[1])], node[4]))

        for a, b, cat in sorted(events, key=lambda e: (e[0], -e[1])):
            while stack and stack[-1][1] <= a:
                close(stack.pop())
            parent = stack[-1] if stack else None
            if parent is not None:
                b = min(b, parent[1])
                parent[4].append((a, b))
            inside = bool(parent and parent[3])
            if cat == "collective" and not inside:
                out.collective.append((a, b))
            elif not inside:
                out.op_starts.append(a)
            stack.append([a, b, cat, inside or cat == "collective", []])
        while stack:
            close(stack.pop())
    return out


def read_trace(path: str | Path) -> TraceSummary:
    """Split a Chrome trace (``.json`` or ``.json.gz``) into its ``ProfilerStep#N`` windows.

    Per step (:class:`StepIntervals`, µs): ``data_wait_us`` is the union of
    DataLoader ``__next__`` ranges; ``op_us`` the union of the CPU ops' self
    time outside those ranges and outside collectives (host time spent
    executing ops: forward, backward, optimizer); ``device_busy_us`` the union
    of GPU kernel/memcpy/memset events; ``collective_us`` and
    ``comm_exposed_us`` the collective time and its exposed part (module
    docstring); ``category_us`` the time per category of the category table.
    GEMM calls (the table's leaf GEMM ops) with their shapes and times, the
    allocator's per-step memory from ``[memory]`` events and the collective
    counts: see :class:`TraceSummary`.

    Raises
    ------
    ValueError
        The file is not a Chrome trace or holds no ``ProfilerStep#`` events.
    """
    path = Path(path)
    try:
        doc = decode(read_bytes(path))
    except (OSError, EOFError, KinetoDecodeError) as exc:
        raise ValueError(f"{path}: not a readable Chrome trace ({exc})") from None
    return summarize(path, doc)


def summarize(path: Path, doc: KinetoDoc) -> TraceSummary:
    """:func:`read_trace` of an already decoded trace (:func:`goblin_assets.runners.kineto_json.decode`).

    Raises
    ------
    ValueError
        ``doc`` has no ``traceEvents`` list or no ``ProfilerStep#`` events (the message names ``path``).
    """
    events = doc.traceEvents
    if events is None:
        raise ValueError(f"{path}: no traceEvents list")
    steps: list[StepIntervals] = []
    loaders: list[Interval] = []
    threads: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    device: list[tuple[float, float, str]] = []
    gemm_ops: list[dict] = []
    kernel_us: dict[int, float] = {}
    mem: list[Event] = []
    for ev in events:
        if ev.ph == "i" and ev.name == "[memory]":
            mem.append(ev)
            continue
        if ev.ph != "X" or ev.dur is None or ev.ts is None:
            continue
        name, cat = ev.name or "", ev.cat or ""
        if not isinstance(name, str):
            name = str(name)
        try:
            a = float(ev.ts)
            b = a + float(ev.dur)
        except (TypeError, ValueError):
            continue
        m = _STEP.match(name)
        if m and cat in ("user_annotation", "cpu_op", ""):
            steps.append(StepIntervals(index=int(m.group(1)), start_us=a, end_us=b))
        elif _DATALOADER.match(name):
            loaders.append((a, b))
        elif cat == "cpu_op":
            threads[(ev.pid, ev.tid)].append((a, b, classify(name).category))
            if gemm_operands(name) is not None:
                gemm_ops.append(ev)
        elif cat == "user_annotation" and classify(name).category == "collective":
            # gloo runs each collective in a 'gloo:<op>' range on its worker thread
            threads[(ev.pid, ev.tid)].append((a, b, "collective"))
        elif cat in _DEVICE_CATS:
            device.append((a, b, "memory" if cat != "kernel" else classify(name).category))
            ext = ev.args.external_id if ev.args is not None else None
            if cat == "kernel" and ext is not None:
                kernel_us[ext] = kernel_us.get(ext, 0.0) + float(ev.dur)
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep# events (was the profiler stepped?)")
    steps.sort(key=lambda s: s.index)
    has_device = bool(device)
    host = _host_time(threads)
    own = _cut(host.own, loaders)
    own_iv = [(a, b) for a, b, _ in own]
    host_coll = _subtract(host.collective, loaders)
    if has_device:
        coll = [(a, b) for a, b, c in device if c == "collective"]
        other = [(a, b) for a, b, c in device if c != "collective"]
        coll_starts, other_starts = [a for a, _ in coll], [a for a, _ in other]
    else:
        coll, other = host_coll, own_iv
        coll_starts, other_starts = [a for a, _ in host.collective], host.op_starts
    u_load, u_own, u_dev = UnionIndex(loaders), UnionIndex(own_iv), UnionIndex([(a, b) for a, b, _ in device])
    u_coll, u_all, u_other = UnionIndex(coll), UnionIndex(coll + other), UnionIndex(other)
    cats = _clipped_sums(device if has_device else own + [(a, b, "collective") for a, b in host_coll], steps)
    for s, cat_us in zip(steps, cats):
        lo, hi = s.start_us, s.end_us
        s.data_wait_us = u_load.length(lo, hi)
        s.op_us = u_own.length(lo, hi)
        s.device_busy_us = u_dev.length(lo, hi)
        s.collective_us = u_coll.length(lo, hi)
        s.comm_exposed_us = max(u_all.length(lo, hi) - u_other.length(lo, hi), 0.0)
        s.category_us = cat_us
    step_of = _step_finder(steps)

    def in_steps(starts: list[float]) -> int:
        return sum(1 for t in starts if step_of(t) is not None)

    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    dist = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    return TraceSummary(
        steps=steps,
        has_device=has_device,
        device_name=props[0].get("name") if props and isinstance(props[0], dict) else None,
        gemms=_collect_gemms(steps, gemm_ops, kernel_us, has_device),
        # Kineto's [memory] events: Device Type 0 = CPU, 1 = CUDA (HIP reports as CUDA).
        alloc_step_bytes=_alloc_per_step(steps, mem, 1 if has_device else 0),
        collectives=in_steps(coll_starts),
        others=in_steps(other_starts),
        backend=dist.get("backend"),
        world_size=dist.get("world_size"),
    )


def median_step_us(summary: TraceSummary) -> float:
    """Median step duration in µs."""
    return float(np.median([s.dur_us for s in summary.steps]))
