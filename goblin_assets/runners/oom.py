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


def _limit(text: str, s: OomState | None, request: int | None, cap_gb: float | None) -> str:
    if _DEVICE_OOM.search(text):
        cap = _CAPACITY.search(text)
        return "the limit hit: the device's memory" + (f" ({cap.group(1) or cap.group(2)} total)" if cap else "")
    if not cap_gb:
        return "the limit hit: the machine's memory"
    cap = int(cap_gb * 1024**3)  # as LocalRunner applies it
    if s is not None and s.address_space_bytes is not None and request is not None \
            and s.address_space_bytes + request <= cap:
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
