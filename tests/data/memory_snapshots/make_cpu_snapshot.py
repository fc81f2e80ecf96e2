"""Write ``digits_mlp_oom.pickle``: a memory snapshot in the format ``torch.cuda.memory._dump_snapshot`` writes.

GENERATED, NOT RECORDED ON A GPU.  This machine has no GPU, so no CUDA caching
allocator ran.  What is real: Adam training steps of an MLP on scikit-learn's
digits, run on the CPU under ``torch.profiler.profile(profile_memory=True,
with_stack=True, record_shapes=True)``, first at batch 128 then at batch 4096;
torch's own ``torch.cuda._memory_viz._profile_to_snapshot`` turns the profile
into the snapshot's trace entries (every tensor allocation and free, in order,
with its size, Python frames and torch's memory-profiler category).  What is
modelled here: those allocations are replayed through a small model of the CUDA
caching allocator on a device of ``CAPACITY`` bytes, with its documented
constants (c10/cuda/CUDACachingAllocator.cpp: sizes rounded up to 512 B;
requests of at most 1 MiB served from 2 MiB "small" segments, larger ones from
20 MiB segments, or, from 10 MiB up, segments rounded up to 2 MiB; best-fit
block reuse with splitting and coalescing of freed neighbours; cached free
segments released before an out-of-memory error).  The first request that no
free block and no new segment can serve is recorded as an ``oom`` entry and the
replay stops there, as the program would: ``segments`` are the allocator's
state at the failure (what an OOM observer dumps).  A GPU recording replaces
this file when a machine with one records it (``torch.cuda.memory._record_memory_history``,
then ``_dump_snapshot`` at the OOM).

    .venv/bin/python tests/data/memory_snapshots/make_cpu_snapshot.py [OUT.pickle]
"""
from __future__ import annotations

import importlib.util
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.cuda._memory_viz import _profile_to_snapshot

MIB = 1 << 20
#: The modelled device's memory (bytes): the batch-128 steps fit, a batch-4096 step does not.
CAPACITY = 48 * MIB
_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.+)$")


def _digits(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    sk = importlib.util.find_spec("sklearn")
    data = np.loadtxt(Path(sk.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    x, y = data[:, :-1].astype(np.float32) / 16.0, data[:, -1].astype(np.int64)
    reps = -(-n // len(x))
    return torch.from_numpy(np.tile(x, (reps, 1))[:n]), torch.from_numpy(np.tile(y, reps)[:n])


def build_model(hidden: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def backward(loss: torch.Tensor) -> None:
    loss.backward()


def optimizer_step(opt: torch.optim.Optimizer) -> None:
    opt.step()
    opt.zero_grad(set_to_none=True)


def profiled_trace(hidden: int = 1024) -> list[dict]:
    """The allocation trace of building the model, 2 steps at batch 128 then 1 at batch 4096 (torch's conversion
    of a CPU profile).  Each phase is its own function: the profiler's Python frames name it."""
    torch.manual_seed(0)
    batches = [_digits(128), _digits(128), _digits(4096)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        model, opt = build_model(hidden)  # built under the profiler: the weights are in the trace
        for x, y in batches:
            loss = forward(model, x, y)
            backward(loss)
            optimizer_step(opt)
    return next(t for t in _profile_to_snapshot(prof)["device_traces"] if t)


def _frames(frames: list[dict]) -> list[dict]:
    """The profiler's ``file.py(N): name`` frames as a CUDA snapshot's ``{filename, line, name}``."""
    out = []
    for f in frames:
        m = _FRAME.match(f["name"])
        out.append({"filename": m["file"], "line": int(m["line"]), "name": m["name"]} if m
                   else {"filename": "??", "line": 0, "name": f["name"]})
    return out


class CachingAllocatorModel:
    """Segments of blocks, as the CUDA caching allocator keeps them (the constants above)."""

    def __init__(self, capacity: int):
        self.capacity, self.segments, self.trace, self.next_addr = capacity, [], [], 1 << 32

    @staticmethod
    def _round(size: int) -> int:
        return max(512, -(-size // 512) * 512)

    @staticmethod
    def _segment_size(size: int) -> int:
        if size <= MIB:
            return 2 * MIB
        return 20 * MIB if size < 10 * MIB else -(-size // (2 * MIB)) * (2 * MIB)

    def reserved(self) -> int:
        return sum(s["total_size"] for s in self.segments)

    def _best_fit(self, size: int, small: bool):
        cands = [(b["size"], s["address"], i, s) for s in self.segments if (s["segment_type"] == "small") == small
                 for i, b in enumerate(s["blocks"]) if b["state"] == "inactive" and b["size"] >= size]
        return min(cands, key=lambda c: (c[0], c[1]))[2:] if cands else None

    def _new_segment(self, size: int, small: bool, frames):
        seg_size = self._segment_size(size)
        if self.reserved() + seg_size > self.capacity:  # release cached, entirely free segments, then retry
            for s in [s for s in self.segments if all(b["state"] == "inactive" for b in s["blocks"])]:
                self.segments.remove(s)
                self.trace.append({"action": "segment_free", "addr": s["address"], "size": s["total_size"],
                                   "stream": 0, "frames": frames})
        if self.reserved() + seg_size > self.capacity:
            return None
        seg = {"device": 0, "address": self.next_addr, "total_size": seg_size, "stream": 0,
               "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
               "blocks": [{"address": self.next_addr, "size": seg_size, "requested_size": 0, "state": "inactive"}]}
        self.next_addr += seg_size + 2 * MIB
        self.segments.append(seg)
        self.trace.append({"action": "segment_alloc", "addr": seg["address"], "size": seg_size, "stream": 0,
                           "frames": frames})
        return 0, seg

    def malloc(self, requested: int, frames: list[dict], category: str | None) -> int | None:
        """The block's address, or None after recording an ``oom`` entry."""
        size, small = self._round(requested), requested <= MIB
        hit = self._best_fit(size, small) or self._new_segment(size, small, frames)
        if hit is None:
            self.trace.append({"action": "oom", "size": size, "device_free": self.capacity - self.reserved(),
                               "stream": 0, "frames": frames})
            return None
        i, seg = hit
        b = seg["blocks"][i]
        rest = b["size"] - size
        if rest >= (512 if small else MIB + 1):  # the allocator splits a block only when the rest is worth keeping
            seg["blocks"].insert(i + 1, {"address": b["address"] + size, "size": rest, "requested_size": 0,
                                         "state": "inactive"})
            b["size"] = size
        b.update(state="active_allocated", requested_size=requested, frames=frames)
        if category:
            b["category"] = category
        self.trace.append({"action": "alloc", "addr": b["address"], "size": b["size"], "stream": 0,
                           "frames": frames, **({"category": category} if category else {})})
        return b["address"]

    def free(self, addr: int) -> None:
        for seg in self.segments:
            for i, b in enumerate(seg["blocks"]):
                if b["address"] == addr and b["state"] == "active_allocated":
                    for action in ("free_requested", "free_completed"):
                        self.trace.append({"action": action, "addr": addr, "size": b["size"], "stream": 0,
                                           "frames": b["frames"]})
                    b.update(state="inactive", requested_size=0)
                    b.pop("frames"), b.pop("category", None)
                    blocks = seg["blocks"]
                    if i + 1 < len(blocks) and blocks[i + 1]["state"] == "inactive":
                        b["size"] += blocks.pop(i + 1)["size"]
                    if i > 0 and blocks[i - 1]["state"] == "inactive":
                        blocks[i - 1]["size"] += blocks.pop(i)["size"]
                    return


def snapshot(capacity: int = CAPACITY) -> dict:
    """The snapshot dict (``segments``, ``device_traces``, ``generated_by``) of the replayed profile."""
    alloc = CachingAllocatorModel(capacity)
    where: dict[int, int] = {}
    for e in profiled_trace():
        if e["action"] == "alloc":
            addr = alloc.malloc(e["size"], _frames(e["frames"]), e.get("category"))
            if addr is None:
                break
            where[e["addr"]] = addr
        elif e["action"] == "free_completed" and e["addr"] in where:
            alloc.free(where.pop(e["addr"]))
    for seg in alloc.segments:
        seg["allocated_size"] = sum(b["requested_size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        seg["active_size"] = sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive")
    return {"segments": alloc.segments, "device_traces": [alloc.trace],
            "generated_by": ("tests/data/memory_snapshots/make_cpu_snapshot.py: a CPU profile's allocations "
                             "replayed through a model of the CUDA caching allocator; not a GPU recording")}


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("digits_mlp_oom.pickle"))
    out.write_bytes(pickle.dumps(snapshot(), protocol=4))
    print(f"wrote {out} ({out.stat().st_size} bytes)")
