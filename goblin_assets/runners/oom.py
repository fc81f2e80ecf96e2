"""An out-of-memory failure, told by what used the memory: the allocation that failed, where, what was held.

When the user's script dies of a failed allocation, the harness
(:mod:`goblin_assets.runners.harness`, ``Harness.write_oom``) writes
``RUN_DIR/oom.json`` (:class:`OomState`): the optimizer step and phase the
script was in, its innermost frame, its peak resident memory and address
space, the bytes its optimizers held (parameters, gradients, optimizer
state) and the last DataLoader batch.  :func:`oom_failure` turns that and the
error text into the one-line failure of the run: the allocation (its size
parsed from the error text when it names one), where, what was held, and
only then the limit that was hit (device memory, the runner's address-space
cap, or the machine's memory).  What the harness could not see is said to be
``not observable``, never guessed.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from goblin_assets.errors import GoblinError
from goblin_assets.runners.result import read_json_model

#: The file the harness writes on a failed allocation (``harness.OOM_NAME``: the names must agree).
OOM_NAME = "oom.json"
#: stderr text of an allocation that failed: Python, torch's CPU allocator (ENOMEM), CUDA/HIP.
OOM_TEXT = re.compile(r"MemoryError|out of memory|can't allocate memory|Cannot allocate memory", re.IGNORECASE)
#: A device allocator's failure (torch's caching allocator on CUDA and ROCm).
_DEVICE_OOM = re.compile(r"(CUDA|HIP) out of memory|OutOfMemoryError", re.IGNORECASE)
#: torch's CPU allocator: "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes".
_CPU_REQUEST = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
#: torch's caching allocator: "Tried to allocate 2.00 GiB".
_DEVICE_REQUEST = re.compile(r"Tried to allocate ([\d.]+) ?(B|KiB|MiB|GiB|TiB)\b")
#: "GPU 0 has a total capacity of 79.15 GiB" (torch >= 2.1) or "(GPU 0; 79.15 GiB total capacity".
_CAPACITY = re.compile(r"total capacity of ([\d.]+ ?[KMGT]iB)|([\d.]+ ?[KMGT]iB) total capacity")
_BINARY = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


class OomError(GoblinError):
    """An ``oom.json`` that is not JSON or not an :class:`OomState` (names the file and the field)."""


class OomState(BaseModel):
    """What the harness saw when the allocation failed (``RUN_DIR/oom.json``; ``Harness.write_oom``).

    Bytes throughout; None where the harness cannot see it.  ``steps_done``:
    optimizer steps finished before the failure (warm-up counted);
    ``warmup``: warm-up steps of the run; ``phase``: ``setup, before the
    first batch``, ``data loading``, ``forward (...)``, ``backward``, ``after
    backward, before the optimizer step``, ``optimizer step`` or ``after the
    optimizer step``; ``where``: the script's innermost frame
    (``file:line in function``); ``error``: the exception's text;
    ``address_space_bytes``: VmSize (what ``RLIMIT_AS`` caps);
    ``optimizers``: live optimizers the script constructed (0: the byte
    counts of parameters, gradients and optimizer state are None).
    """

    model_config = ConfigDict(extra="forbid")

    steps_done: int
    warmup: int
    phase: str
    where: str | None = None
    error: str = ""
    peak_rss_bytes: int | None = None
    address_space_bytes: int | None = None
    address_space_peak_bytes: int | None = None
    batch_bytes: int | None = None
    optimizers: int = 0
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    device_allocated_bytes: int | None = None
    device_reserved_bytes: int | None = None
    device_peak_bytes: int | None = None
    census: dict[str, Any] | None = None
    census_note: str | None = None
    rss_bytes_by_step: list[int | None] = []
    saved_activation_bytes: int | None = None
    device_oom: dict[str, Any] | None = None
    snapshot: str | None = None


def size_text(n: float) -> str:
    """``n`` bytes in decimal units: ``2.1 kB``, ``16.6 kB``, ``8.59 GB`` (GB = 1e9 bytes, as RunMetrics)."""
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def requested_bytes(text: str) -> int | None:
    """The size of the allocation that failed, parsed from an error text; None when it names none.

    ``"... you tried to allocate 1073741824 bytes ..."`` -> 1073741824;
    ``"CUDA out of memory. Tried to allocate 2.00 GiB"`` -> 2147483648.  The
    last size in the text wins (a traceback repeats the message).
    """
    cpu = _CPU_REQUEST.findall(text)
    if cpu:
        return int(cpu[-1])
    dev = _DEVICE_REQUEST.findall(text)
    if dev:
        value, unit = dev[-1]
        return int(float(value) * _BINARY[unit])
    return None


#: A size as torch's caching allocator prints it (c10 ``format_size``): ``0 bytes``, ``512.00 KiB``, ``1.96 GiB``.
_SIZE = r"([\d.]+)\s?(bytes|B|KiB|MiB|GiB|TiB)"


def _pattern(text: str) -> re.Pattern:
    """``text`` with ``SIZE`` standing for :data:`_SIZE` and any run of spaces matching any whitespace (the
    message is often wrapped across lines when pasted into a report)."""
    return re.compile(r"\s+".join(part.replace("SIZE", _SIZE) for part in text.split(" ")), re.DOTALL)


#: torch >= 2.1 (CUDA and HIP): "Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.18 GiB of which
#: 1.08 GiB is free. Including non-PyTorch memory, this process has 78.09 GiB memory in use. Of the allocated
#: memory 75.31 GiB is allocated by PyTorch, [with 46.00 MiB allocated in private pools (e.g., CUDA Graphs),]
#: and 1.83 GiB is reserved by PyTorch but unallocated."
_OOM_NEW = _pattern(r"Tried to allocate SIZE\. GPU (\d+) has a total capacity of SIZE of which SIZE is free\."
                    r"(.{0,400}?)Of the allocated memory SIZE is allocated by PyTorch,"
                    r"(?: with SIZE allocated in private pools \(e\.g\., CUDA Graphs\),)?"
                    r" and SIZE is reserved by PyTorch but unallocated")
#: torch < 2.1: "Tried to allocate 1.50 GiB (GPU 0; 15.78 GiB total capacity; 13.19 GiB already allocated;
#: 1.41 GiB free; [4.08 GiB allowed;] 13.22 GiB reserved in total by PyTorch)".
_OOM_OLD = _pattern(r"Tried to allocate SIZE \(GPU (\d+); SIZE total capacity; SIZE already allocated;"
                    r" SIZE free;(?: SIZE allowed;)? SIZE reserved in total by PyTorch\)")
_THIS_PROCESS = _pattern(r"this process has SIZE memory in use")


def _bytes(value: str | None, unit: str | None) -> int | None:
    if value is None:
        return None
    return int(float(value) * (1 if unit in ("B", "bytes") else _BINARY[unit]))


class DeviceOom(BaseModel):
    """A device allocator's out-of-memory message, read (torch's CUDA/HIP caching allocator; bytes throughout).

    ``reserved_unallocated_bytes``: memory the allocator holds but had not
    handed to a tensor when the request failed (it frees what it can and
    retries first, so this is memory in segments it cannot release: split
    blocks); ``this_process_bytes``: the process's use of the device,
    non-PyTorch memory included (torch >= 2.1 prints it; None before);
    ``private_pool_bytes``: allocated in private pools (CUDA Graphs);
    ``allowed_bytes``: the process's cap (``set_per_process_memory_fraction``;
    torch < 2.1 prints it), None when none is printed.

    ``kind`` (first that holds): ``exceeds_device`` (the one request is
    larger than the device), ``memory_fraction`` (the allocator reached the
    process's allowed share of the device), ``other_processes`` (other
    processes on the device held at least the request), ``fragmentation``
    (less is free than the request, but free plus reserved-but-
    unallocated would have held the request: the memory was there, in blocks
    too small; PyTorch's own message suggests ``expandable_segments`` for
    this), else ``shortage`` (what the step holds
    does not fit).  Source: PyTorch, "CUDA semantics: memory management" and
    the caching allocator's out-of-memory message (c10/cuda/CUDACachingAllocator.cpp).
    """

    model_config = ConfigDict(extra="forbid")

    device_index: int
    request_bytes: int
    total_bytes: int
    free_bytes: int
    allocated_bytes: int
    reserved_unallocated_bytes: int
    this_process_bytes: int | None = None
    private_pool_bytes: int | None = None
    allowed_bytes: int | None = None

    @property
    def other_processes_bytes(self) -> int | None:
        """Device memory in use by others: total - free - this process (None when the message does not say)."""
        if self.this_process_bytes is None:
            return None
        return max(0, self.total_bytes - self.free_bytes - self.this_process_bytes)

    @property
    def kind(self) -> str:
        """``exceeds_device``, ``memory_fraction``, ``fragmentation``, ``other_processes`` or ``shortage``
        (see the class)."""
        if self.request_bytes > self.total_bytes:
            return "exceeds_device"
        if self.allowed_bytes is not None and \
                self.allocated_bytes + self.reserved_unallocated_bytes + self.request_bytes > self.allowed_bytes:
            return "memory_fraction"
        others = self.other_processes_bytes
        if others is not None and self.request_bytes <= others:
            return "other_processes"
        if self.free_bytes < self.request_bytes <= self.free_bytes + self.reserved_unallocated_bytes:
            return "fragmentation"
        return "shortage"

    def values(self) -> dict[str, Any]:
        """The rules' ``oom.<key>`` values (kb/rules.py): the fields, ``other_processes_bytes`` and ``kind``."""
        return self.model_dump() | {"other_processes_bytes": self.other_processes_bytes, "kind": self.kind}

    def sentence(self) -> str:
        """One sentence for people: the allocator's numbers, then what they mean."""
        g = lambda n: f"{n / 1024**3:.2f} GiB"  # noqa: E731 - the allocator's own unit
        head = (f"{g(self.request_bytes)} requested on GPU {self.device_index}, "
                f"{g(self.free_bytes)} free of {g(self.total_bytes)}, {g(self.allocated_bytes)} allocated by "
                f"PyTorch, {g(self.reserved_unallocated_bytes)} reserved but unallocated")
        if self.this_process_bytes is not None:
            head += f", this process {g(self.this_process_bytes)} in all"
        spare = self.free_bytes + self.reserved_unallocated_bytes - self.request_bytes
        why = {
            "exceeds_device": "the one request is larger than the whole device: no allocator setting helps, the "
                              "tensor itself must shrink (micro-batch, sequence length) or be sharded",
            "memory_fraction": f"the process's allowed share of the device ({g(self.allowed_bytes or 0)}, "
                               f"torch.cuda.set_per_process_memory_fraction) was reached, not the device",
            "fragmentation": f"free and reserved-but-unallocated memory together would have held the request "
                             f"({g(spare)} to spare): the memory was there in blocks too small, which is "
                             f"fragmentation (expandable_segments:True lets the allocator grow one segment)"
                             + ("; with so little to spare (under 5 % of the device) the step is at the "
                                "device's edge, so lower its peak as well" if spare < 0.05 * self.total_bytes
                                else ""),
            "other_processes": f"other processes held {g(self.other_processes_bytes or 0)} of the device, "
                               f"more than the request: free the device or run alone on it",
            "shortage": "neither free nor cached memory could hold the request: what the step holds does not fit",
        }[self.kind]
        return f"{head}; {why}"


#: The keys a rule reads as ``oom.<key>`` (kb/rules.py): :meth:`DeviceOom.values`.
OOM_KEYS: tuple[str, ...] = (*DeviceOom.model_fields, "other_processes_bytes", "kind")


def parse_device_oom(text: str) -> DeviceOom | None:
    """The last device out-of-memory message in ``text`` (torch's caching allocator, both message formats),
    read into a :class:`DeviceOom`; None when ``text`` holds none (a CPU out-of-memory, or no numbers)."""
    new = list(_OOM_NEW.finditer(text))
    old = list(_OOM_OLD.finditer(text))
    if not new and not old:
        return None
    if new and (not old or new[-1].start() > old[-1].start()):
        m = new[-1]
        req, req_u, dev, tot, tot_u, free, free_u, middle, alloc, alloc_u, priv, priv_u, un, un_u = m.groups()
        this = _THIS_PROCESS.search(middle or "")
        return DeviceOom(device_index=int(dev), request_bytes=_bytes(req, req_u), total_bytes=_bytes(tot, tot_u),
                         free_bytes=_bytes(free, free_u), allocated_bytes=_bytes(alloc, alloc_u),
                         reserved_unallocated_bytes=_bytes(un, un_u),
                         this_process_bytes=_bytes(*this.groups()) if this else None,
                         private_pool_bytes=_bytes(priv, priv_u))
    m = old[-1]
    req, req_u, dev, tot, tot_u, alloc, alloc_u, free, free_u, allowed, allowed_u, res, res_u = m.groups()
    allocated, reserved = _bytes(alloc, alloc_u), _bytes(res, res_u)
    return DeviceOom(device_index=int(dev), request_bytes=_bytes(req, req_u), total_bytes=_bytes(tot, tot_u),
                     free_bytes=_bytes(free, free_u), allocated_bytes=allocated,
                     reserved_unallocated_bytes=max(0, reserved - allocated),
                     allowed_bytes=_bytes(allowed, allowed_u))


def read_oom_state(run_dir: Path) -> OomState | None:
    """``RUN_DIR/oom.json`` as an :class:`OomState`, or None when the harness wrote none or it is invalid."""
    p = Path(run_dir) / OOM_NAME
    if not p.is_file():
        return None
    try:
        return read_json_model(p, OomState, OomError)
    except OomError:
        return None


def _where(s: OomState | None) -> str:
    if s is None:
        return "(where and what held memory: not observable, the harness recorded no state)"
    if s.phase.startswith("setup"):
        out = "during setup, before the first batch"
    else:
        step = s.steps_done + 1
        out = f"in step {step} ({'warm-up' if step <= s.warmup else f'measured step {step - s.warmup}'}), " \
              f"during {s.phase}"
    return out + (f", at {s.where}" if s.where else "")


def _held(s: OomState) -> str:
    parts = []
    if s.peak_rss_bytes is not None:
        parts.append(f"peak resident memory {size_text(s.peak_rss_bytes)}")
    if s.address_space_bytes is not None:
        parts.append(f"address space {size_text(s.address_space_bytes)}")
    if s.optimizers and s.params_bytes is not None:
        parts.append(f"parameters {size_text(s.params_bytes)} + gradients {size_text(s.grads_bytes or 0)} + "
                     f"optimizer state {size_text(s.optimizer_state_bytes or 0)} "
                     f"({s.optimizers} optimizer{'s' if s.optimizers != 1 else ''})")
    else:
        parts.append("parameters, gradients and optimizer state not observable (no optimizer constructed yet)")
    parts.append(f"last DataLoader batch {size_text(s.batch_bytes)}" if s.batch_bytes is not None
                 else "DataLoader batch not observable (no batch loaded through a DataLoader yet)")
    if s.device_allocated_bytes is not None:
        parts.append(f"device memory allocated {size_text(s.device_allocated_bytes)} "
                     f"(reserved {size_text(s.device_reserved_bytes or 0)})")
    return "held at the time: " + ", ".join(parts)


#: Share of the runner's cap under which an address space plus its request is not blamed on the cap (ours:
#: a 33.6 MB request failed at VmSize 1.57 GB under a 1.61 GB cap, tests/data/deep_mlp_oom).
CAP_SLACK = 0.05


def _limit(text: str, s: OomState | None, request: int | None, cap_gb: float | None) -> str:
    if _DEVICE_OOM.search(text):
        cap = _CAPACITY.search(text)
        dev = parse_device_oom(text)
        return "the limit hit: the device's memory" + (f" ({cap.group(1) or cap.group(2)} total)" if cap else "") \
            + (f"; the allocator's numbers ({dev.kind}): {dev.sentence()}" if dev is not None else "")
    if not cap_gb:
        return "the limit hit: the machine's memory"
    cap = int(cap_gb * 1024**3)  # as LocalRunner applies it
    # the address space read after the failure may have shrunk as frames unwound: its peak (VmPeak) counts;
    # within CAP_SLACK of the cap the request (rounded up to whole mappings, with the allocator's own
    # mappings) can still be what crossed it
    vm = max(filter(None, (s.address_space_bytes, s.address_space_peak_bytes)), default=None) if s else None
    if vm is not None and request is not None and vm + request <= cap * (1 - CAP_SLACK):
        return (f"the limit hit: the machine's memory (the address space plus the request stays under the runner's "
                f"cap of {size_text(cap)})")
    return (f"the limit hit: the runner's address-space cap of {size_text(cap)} (mem_cap_gb={cap_gb:g}; RLIMIT_AS "
            "counts virtual memory, mapped libraries included, not only resident pages)")


def oom_failure(script_name: str, stderr_tail: str, run_dir: Path, cap_gb: float | None) -> tuple[str, dict | None]:
    """The one-line failure of a run that ran out of memory, and the harness's state as a dict (None if none).

    The line: ``NAME: ran out of memory <where>: <the allocation>; held at
    the time: <...>; the limit hit: <...>``.  The allocation's size comes
    from the exception text the harness recorded, else from ``stderr_tail``;
    ``cap_gb`` is the runner's address-space cap (GiB, as
    :class:`~goblin_assets.runners.local.LocalRunner` applies it; None for
    none).
    """
    s = read_oom_state(run_dir)
    text = f"{s.error}\n{stderr_tail}" if s is not None else stderr_tail
    request = requested_bytes(text)
    alloc = (f"an allocation of {size_text(request)} ({request} bytes) failed" if request is not None
             else "an allocation failed (its size: not observable, the error text names none)")
    parts = [f"{script_name}: ran out of memory {_where(s)}: {alloc}"]
    if s is not None:
        parts.append(_held(s))
    parts.append(_limit(text, s, request, cap_gb))
    return "; ".join(parts), (s.model_dump() if s is not None else None)
