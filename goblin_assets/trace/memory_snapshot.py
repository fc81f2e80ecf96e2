"""A memory snapshot recorded elsewhere (``torch.cuda.memory._dump_snapshot``): where the memory went, and why it ran out.

The snapshot format is PyTorch's (the docstring of ``torch.cuda.memory._snapshot``
and https://docs.pytorch.org/docs/stable/torch_cuda_memory.html): a dict with
``segments`` (each a ``cudaMalloc``/``hipMalloc`` of ``total_size`` bytes split
into ``blocks`` of ``size`` bytes, ``requested_size`` of them asked for, in state
``active_allocated``, ``active_awaiting_free`` or ``inactive``, with the Python
``frames`` of their allocation) and ``device_traces`` (per device, the
allocator's actions in order: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free``, ``oom`` with the failed ``size`` and the
``device_free`` the driver still reported, ``snapshot``).

A pickle can run code when it is loaded.  :func:`load_snapshot` reads it with a
restricted unpickler (the "Restricting Globals" recipe of the ``pickle``
documentation, https://docs.python.org/3/library/pickle.html#restricting-globals):
a snapshot is plain dicts, lists, tuples, strings and numbers, which the pickle
opcodes build without naming any global, so every global is refused except
``set``/``frozenset``/``OrderedDict``; nothing in the file is called.

Totals follow ``torch.cuda._memory_viz.segsum`` (the tests cross-check them on
the same snapshot): *reserved* is the sum of the segments' ``total_size``;
*allocated* the ``requested_size`` of the ``active_allocated`` blocks; the rest
of the reserved bytes is free, *internal* (the allocator's rounding inside an
allocated block) or *external* (inactive blocks).  Every figure is read from the
snapshot (``recorded``) except the category of a block whose snapshot gives
none, which is classified from the phase that allocated it
(``estimated``, :func:`classify_frames`).
"""
from __future__ import annotations

import io
import json
import pickle
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from goblin_assets.errors import GoblinError

#: Globals a snapshot may name (protocol-2 pickles build sets through ``builtins.set``); everything else is refused.
SAFE_GLOBALS: dict[tuple[str, str], Any] = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
                                            ("collections", "OrderedDict"): OrderedDict}

#: Block states of the caching allocator (``torch.cuda.memory._snapshot``'s ``Block.state``).
ACTIVE = ("active_allocated", "active_awaiting_free")

#: Trace entries kept on each side of the first ``oom`` entry for the timeline around it.
OOM_WINDOW = 200

#: Frames of these files are library internals: a block is attributed to the innermost frame outside them.
_LIBRARY = re.compile(r"(^|/)(torch|transformers|accelerate|peft|trl|deepspeed|bitsandbytes|triton|functorch)/"
                      r"|^\?\?$|^<|^$|site-packages/|dist-packages/"
                      # native frames of a snapshot recorded with stacks="all" (the unwinder, the allocator, ATen)
                      r"|\.(c|cc|cpp|cxx|cu|cuh|h|hpp)$")


class SnapshotError(GoblinError):
    """A memory snapshot file cannot be read, or is not a snapshot (names the file and the problem)."""


class UnsafeSnapshotError(SnapshotError):
    """The pickle names a global other than :data:`SAFE_GLOBALS`: refused before anything in it is run."""


class _SnapshotUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):  # the only way a pickle reaches code: refuse all but containers
        if (module, name) in SAFE_GLOBALS:
            return SAFE_GLOBALS[(module, name)]
        raise UnsafeSnapshotError(f"{self.path}: refused: the pickle names {module}.{name}, which a memory snapshot "
                                  f"never holds (only dicts, lists, tuples, strings and numbers); nothing was run")

    def persistent_load(self, pid):
        raise UnsafeSnapshotError(f"{self.path}: refused: the pickle holds a persistent id, which a memory snapshot "
                                  f"never holds; nothing was run")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot dict of ``path``, read without running anything in it.

    Returns
    -------
    dict
        ``segments`` (list of dicts) and ``device_traces`` (list of lists of
        dicts; ``[]`` when the snapshot recorded no history), plus whatever else
        the file holds (``allocator_settings`` ...).

    Raises
    ------
    UnsafeSnapshotError
        The pickle names a global (a class, a function: ``os.system`` ...)
        other than :data:`SAFE_GLOBALS`, or a persistent id.
    SnapshotError
        The file is missing or not a pickle, or its object lacks a
        ``segments`` list of segments with ``blocks``.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot read the memory snapshot ({exc.strerror or exc})") from None
    try:
        snap = _SnapshotUnpickler(io.BytesIO(raw), p).load()
    except UnsafeSnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure of untrusted bytes is the file's problem
        raise SnapshotError(f"{p}: not a memory snapshot pickle ({type(exc).__name__}: {exc})") from None
    if isinstance(snap, list):  # the oldest format: the segments alone
        snap = {"segments": snap, "device_traces": []}
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise SnapshotError(f"{p}: not a memory snapshot: expected a dict with a 'segments' list "
                            f"(torch.cuda.memory._dump_snapshot), got {type(snap).__name__}")
    for i, seg in enumerate(snap["segments"]):
        if not isinstance(seg, dict) or not isinstance(seg.get("blocks"), list) or "total_size" not in seg:
            raise SnapshotError(f"{p}: segments[{i}] is not a segment (a dict with total_size and a blocks list)")
    traces = snap.get("device_traces") or []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError(f"{p}: device_traces is not a list of per-device lists")
    snap["device_traces"] = traces
    return snap


def frame_text(f: dict) -> str:
    """``file:line name`` of one frame (the profiler's ``file(line): name`` form is read too)."""
    return f"{f.get('filename', '??')}:{f.get('line', 0)} {f.get('name', '?')}"


def user_frame(frames: list[dict]) -> str:
    """The innermost frame outside the libraries (:data:`_LIBRARY`), else the innermost frame; '(no stack recorded)'."""
    if not frames:
        return "(no stack recorded)"
    for f in frames:  # innermost first, as the allocator records them
        if not _LIBRARY.search(str(f.get("filename", ""))):
            return frame_text(f)
    return frame_text(frames[0])


#: (category, pattern on a frame's ``file name``): the first that matches any frame, innermost first, wins.
_CATEGORY_FRAMES: tuple[tuple[str, re.Pattern], ...] = (
    ("optimizer_step", re.compile(r"torch/optim/|bitsandbytes/optim|\bstep$")),
    ("backward", re.compile(r"torch/autograd/|_engine_run_backward| backward$")),
    ("model_load", re.compile(r"\b(_apply|load_state_dict|from_pretrained|_load_from_state_dict|reset_parameters)$"
                             r"|torch/nn/modules/module\.py \b(to|cuda)$|torch/nn/init\.py"
                             r"|torch/nn/modules/\S+ __init__$")),
    ("forward", re.compile(r"torch/nn/modules/|torch/nn/functional\.py| forward$")),
    ("data_loading", re.compile(r"torch/utils/data/")),
)


def classify_frames(frames: list[dict]) -> str:
    """A block's category estimated from the phase that allocated it, read from its frames: ``optimizer_step``
    (optimizer state and its temporaries), ``backward`` (gradients and autograd buffers), ``model_load``
    (parameters and buffers being built, loaded or moved), ``forward`` (activations), ``data_loading``, or
    ``unknown``.

    Rules are tried in that order, each on every frame: an optimizer step that calls into a module is an
    optimizer allocation.  Used only where the snapshot carries no ``category`` (a CUDA snapshot never does;
    torch's memory profiler's conversion, ``_memory_viz._profile_to_snapshot``, does).
    """
    texts = [f"{f.get('filename', '')} {f.get('name', '')}" for f in reversed(frames)]
    for cat, pat in _CATEGORY_FRAMES:
        if any(pat.search(t) for t in texts):
            return cat
    return "unknown"


@dataclass
class SnapshotReport:
    """One snapshot analysed: totals (bytes), tables, the out-of-memory events and what they say.

    ``totals``: ``segments``, ``reserved_bytes``, ``allocated_bytes``, ``active_bytes``,
    ``reserved_minus_allocated_bytes``, ``free_internal_bytes``, ``free_external_bytes``,
    ``largest_free_block_bytes``.  ``tables``: ``segments`` (one row per segment), ``frames`` (live bytes by
    user frame and category), ``categories`` (live bytes by category), ``timeline`` (the trace entries around the
    first OOM with the allocated bytes after each), ``ooms`` (one row per ``oom`` entry).
    """

    path: Path
    snapshot_id: str
    totals: dict[str, int]
    tables: dict[str, pd.DataFrame]
    diagnosis: list[str] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``goblin memory --json`` object (keys are a contract: extend, never rename)."""
        return {"path": str(self.path), "snapshot_id": self.snapshot_id, "totals": self.totals,
                "diagnosis": self.diagnosis, "notes": self.notes,
                **{k: json.loads(v.to_json(orient="records")) for k, v in self.tables.items()}}


def _blocks(seg: dict):
    addr = seg.get("address")
    for b in seg["blocks"]:
        yield (b.get("address", addr)), b
        if addr is not None:
            addr += b["size"]


def _segment_rows(snap: dict, request: int | None) -> pd.DataFrame:
    rows = []
    for i, seg in enumerate(snap["segments"]):
        active = [b for b in seg["blocks"] if b.get("state") == "active_allocated"]
        allocated = sum(b.get("requested_size", b["size"]) for b in active)
        free = [b["size"] for b in seg["blocks"] if b.get("state") not in ACTIVE]
        largest = max(free, default=0)
        rows.append({"segment": i, "device": seg.get("device"), "address": seg.get("address"),
                     "stream": seg.get("stream"), "segment_type": seg.get("segment_type"),
                     "total_size_bytes": seg["total_size"], "allocated_bytes": allocated,
                     "active_bytes": sum(b["size"] for b in seg["blocks"] if b.get("state") in ACTIVE),
                     "free_bytes": sum(free), "largest_free_block_bytes": largest, "blocks": len(seg["blocks"]),
                     "fits_failed_request": None if request is None else largest >= request})
    return pd.DataFrame(rows, columns=["segment", "device", "address", "stream", "segment_type", "total_size_bytes",
                                       "allocated_bytes", "active_bytes", "free_bytes", "largest_free_block_bytes",
                                       "blocks", "fits_failed_request"])


def _live_rows(snap: dict) -> pd.DataFrame:
    """One row per active block: device, user frame, category and its source, bytes."""
    recorded: dict[tuple[int | None, int], str] = {}  # (device, addr) -> category of its last alloc entry
    for dev, trace in enumerate(snap["device_traces"]):
        for e in trace:
            if e.get("action") == "alloc" and e.get("category"):
                recorded[(dev, e.get("addr"))] = e["category"]
    rows = []
    for seg in snap["segments"]:
        dev = seg.get("device")
        for addr, b in _blocks(seg):
            if b.get("state") != "active_allocated":
                continue
            frames = b.get("frames") or (b.get("history") or [{}])[0].get("frames", [])
            cat = b.get("category") or recorded.get((dev, addr))
            rows.append({"device": dev, "frame": user_frame(frames),
                         "category": cat or classify_frames(frames),
                         "category_source": "recorded" if cat else "estimated",
                         "bytes": b.get("requested_size", b["size"])})
    return pd.DataFrame(rows, columns=["device", "frame", "category", "category_source", "bytes"])


def _timeline(snap: dict, totals_active: dict[int, int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trace entries (all of them, or :data:`OOM_WINDOW` each side of the first OOM) and the OOM rows.

    ``allocated_bytes`` after each entry is anchored at the snapshot's end state: the active bytes of the
    device's segments minus the allocations made after the entry (the trace ends when the snapshot was taken);
    ``reserved_bytes`` likewise from ``segment_alloc``/``segment_free``.
    """
    rows, ooms = [], []
    for dev, trace in enumerate(snap["device_traces"]):
        if not trace:
            continue
        delta = [(e["size"] if e.get("action") == "alloc" else -e["size"] if e.get("action") == "free_completed"
                  else 0) for e in trace]
        rdelta = [(e["size"] if e.get("action") == "segment_alloc" else -e["size"]
                   if e.get("action") == "segment_free" else 0) for e in trace]
        alloc_now, res_now = totals_active.get(dev, 0), sum(
            s["total_size"] for s in snap["segments"] if s.get("device", dev) == dev)
        after_a, after_r = [0] * len(trace), [0] * len(trace)
        for i in range(len(trace) - 1, -1, -1):
            after_a[i], after_r[i] = alloc_now, res_now
            alloc_now -= delta[i]
            res_now -= rdelta[i]
        first = next((i for i, e in enumerate(trace) if e.get("action") == "oom"), None)
        lo, hi = (0, len(trace)) if first is None else (max(0, first - OOM_WINDOW), first + OOM_WINDOW + 1)
        for i, e in enumerate(trace):
            if e.get("action") == "oom":
                ooms.append({"device": dev, "event_index": i, "request_bytes": e.get("size"),
                             "device_free_bytes": e.get("device_free"), "allocated_bytes": after_a[i],
                             "reserved_bytes": after_r[i], "time_us": e.get("time_us"),
                             "frame": user_frame(e.get("frames") or []),
                             "stack": " <- ".join(frame_text(f) for f in (e.get("frames") or [])[:12])})
            if lo <= i < hi:
                rows.append({"device": dev, "event_index": i, "action": e.get("action"), "size_bytes": e.get("size"),
                             "allocated_bytes": after_a[i], "reserved_bytes": after_r[i],
                             "time_us": e.get("time_us"), "frame": user_frame(e.get("frames") or [])})
    cols = ["device", "event_index", "action", "size_bytes", "allocated_bytes", "reserved_bytes", "time_us", "frame"]
    ocols = ["device", "event_index", "request_bytes", "device_free_bytes", "allocated_bytes", "reserved_bytes",
             "time_us", "frame", "stack"]
    return pd.DataFrame(rows, columns=cols), pd.DataFrame(ooms, columns=ocols)


def mib(n: float | None) -> str:
    """Bytes as ``12.3 MiB`` (binary units, as torch's memory tools print them)."""
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def _diagnosis(totals: dict[str, int], ooms: pd.DataFrame, segs: pd.DataFrame, cats: pd.DataFrame,
               frames: pd.DataFrame) -> list[str]:
    out = []
    if not ooms.empty:
        o = ooms.iloc[0]
        req, free_cached = int(o["request_bytes"] or 0), totals["reserved_bytes"] - totals["active_bytes"]
        dev_free = o["device_free_bytes"]
        out.append(f"out of memory: a request of {mib(req)} failed at trace entry {o['event_index']} "
                   f"({o['frame']}); the driver still reported {mib(dev_free)} free; "
                   f"{mib(o['allocated_bytes'])} allocated, {mib(o['reserved_bytes'])} reserved")
        if totals["largest_free_block_bytes"] < req <= free_cached:
            out.append(f"fragmentation: the cache held {mib(free_cached)} free, more than the request, but its "
                       f"largest free block is {mib(totals['largest_free_block_bytes'])}: no segment could serve "
                       f"{mib(req)}; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PYTORCH_HIP_ALLOC_CONF on "
                       f"ROCm) lets segments grow instead of splitting")
        elif req <= free_cached + (dev_free or 0):
            out.append(f"split free memory: the cache held {mib(free_cached)} free (largest block "
                       f"{mib(totals['largest_free_block_bytes'])}) and the device {mib(dev_free)}; together "
                       f"they exceed the request but neither holds {mib(req)}: fragmentation contributes "
                       f"(expandable_segments:True in PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF), and "
                       f"shrinking the live memory (smaller micro-batch, checkpointing) fixes it")
        else:
            out.append(f"shortage: the cache held {mib(free_cached)} free (largest block "
                       f"{mib(totals['largest_free_block_bytes'])}) and the device {mib(dev_free)}: the request "
                       f"does not fit; the live memory has to shrink (smaller micro-batch, checkpointing, a "
                       f"lower-memory optimizer)")
    if not cats.empty:
        top = cats.iloc[0]
        out.append(f"largest category: {top['category']} {mib(top['bytes'])} "
                   f"({top['share_pct']:.0f}% of live, {top['category_source']})")
    if not frames.empty:
        f = frames.iloc[0]
        out.append(f"largest frame: {f['frame']} {mib(f['bytes'])} ({f['category']})")
    return out


def analyze_snapshot(path: str | Path, snapshot_id: str | None = None) -> SnapshotReport:
    """Read and analyse one snapshot file (what ``goblin memory`` and the ``memory_snapshot`` asset run).

    Parameters
    ----------
    path
        A pickle written by ``torch.cuda.memory._dump_snapshot`` (or ``pickle.dump(torch.cuda.memory._snapshot())``).
    snapshot_id
        The id of its warehouse rows (default: the file's stem).

    Returns
    -------
    SnapshotReport
        Totals in bytes (recorded), the tables and the diagnosis lines.

    Raises
    ------
    UnsafeSnapshotError, SnapshotError
        As :func:`load_snapshot`.
    """
    p = Path(path).resolve()
    snap = load_snapshot(p)
    reserved = allocated = active = internal = external = largest = 0
    active_by_dev: dict[int, int] = {}
    for seg in snap["segments"]:
        reserved += seg["total_size"]
        for b in seg["blocks"]:
            st = b.get("state")
            if st == "active_allocated":
                req = b.get("requested_size", b["size"])
                allocated += req
                internal += b["size"] - req
            else:
                external += b["size"]
            if st in ACTIVE:
                active += b["size"]
                active_by_dev[seg.get("device", 0)] = active_by_dev.get(seg.get("device", 0), 0) + b["size"]
            else:
                largest = max(largest, b["size"])
    timeline, ooms = _timeline(snap, active_by_dev)
    request = int(ooms.iloc[0]["request_bytes"]) if not ooms.empty and ooms.iloc[0]["request_bytes"] else None
    segs = _segment_rows(snap, request)
    live = _live_rows(snap)
    frames = (live.groupby(["frame", "category", "category_source"], as_index=False, dropna=False)
              .agg(bytes=("bytes", "sum"), blocks=("bytes", "size")).sort_values("bytes", ascending=False,
                                                                                 ignore_index=True))
    cats = (live.groupby(["category", "category_source"], as_index=False)
            .agg(bytes=("bytes", "sum"), blocks=("bytes", "size")).sort_values("bytes", ascending=False,
                                                                               ignore_index=True))
    cats["share_pct"] = 100.0 * cats["bytes"] / allocated if allocated else 0.0
    totals = {"segments": len(snap["segments"]), "reserved_bytes": reserved, "allocated_bytes": allocated,
              "active_bytes": active, "reserved_minus_allocated_bytes": reserved - allocated,
              "free_internal_bytes": internal, "free_external_bytes": external, "largest_free_block_bytes": largest,
              "oom_events": len(ooms), "trace_entries": sum(len(t) for t in snap["device_traces"])}
    notes = {}
    if not snap["device_traces"] or not any(snap["device_traces"]):
        notes["timeline"] = ("not_observable: the snapshot holds no allocator history (record it with "
                             "torch.cuda.memory._record_memory_history() before the run)")
    if isinstance(snap.get("generated_by"), str):
        notes["origin"] = f"generated, not recorded on a device: {snap['generated_by']}"
    rep = SnapshotReport(path=p, snapshot_id=snapshot_id or p.name.split(".")[0], totals=totals,
                         tables={"segments": segs, "frames": frames, "categories": cats, "timeline": timeline,
                                 "ooms": ooms}, notes=notes)
    rep.diagnosis = _diagnosis(totals, ooms, segs, cats, frames)
    return rep
