"""The fused CPU sketch kernels (``_sketch.c``), loaded with ctypes.

``_sketch.c`` is compiled by setuptools when the package is installed
(``pyproject.toml``, ``[tool.setuptools] ext-modules``, optional: an install
without a C compiler still succeeds).  It is a plain shared library, not a
Python extension module: it is never imported, only loaded here.  When it is
missing (no compiler at install time, or ``GOBLIN_SKETCH_KERNEL=torch`` in the
environment), :func:`lib` returns None and
:func:`goblin_assets.opscope.sketches.sketch_vector` uses its torch path, which
computes the same statistics with more passes over the tensor.

Why C: on the CPU the torch path reads an activation four times (per-channel
min and max, sum, per-row norm) and runs about a hundred small ops per tensor;
the kernel reads it once.  Measured (one thread, float32, warm in cache): the
exact tier of a 4096 x 1536 activation 10-12 ms -> 2.0-2.3 ms, 4096 x 384
0.6-0.7 ms -> 0.21-0.25 ms.  In a recorded MiniLM forward (batch 32 x 128,
55 sites, one thread) the sketch nodes took ~790 ms on torch ops and
~190 ms with the kernel, against ~1.7 s for the model itself
(``benchmarks/opscope_overhead.py``).  ctypes releases the GIL during a
call, so row blocks of a large tensor run on threads (:func:`rows`).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

#: Environment switch: ``torch`` forces the torch path (for comparisons); anything else uses the kernel when built.
ENV = "GOBLIN_SKETCH_KERNEL"

#: Interface version of ``_sketch.c`` this module speaks (``goblin_sketch_abi()``); a library built from an
#: older source (other statistics, other outputs) is not loaded: the torch path runs until it is rebuilt.
ABI = 2

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_PAR_MIN_NUMEL = 1 << 20   # rows of a tensor this large are split across torch's intra-op thread count
_state: dict = {}
_local = threading.local()


def scratch(n: int, dtype: torch.dtype = torch.float32, slot: str = "rows") -> torch.Tensor:
    """A reused buffer of at least ``n`` elements of this thread (its first ``n``, uninitialised).

    The kernels' work arrays come from here rather than from a fresh
    allocation per call: glibc serves an allocation of 128 KiB or more with
    ``mmap``, and every call would fault its pages in again (measured: ~30,000
    minor faults and 0.1 s of system time per injected MiniLM forward before,
    next to none in the plain forward).  Only for values that are consumed
    before the next call on the same thread.
    """
    key = (slot, dtype)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(key)
    if buf is None or buf.numel() < n:
        buf = bufs[key] = torch.empty(max(n, 1 << 16), dtype=dtype)
    return buf[:n]


def scratch_bytes() -> int:
    """Bytes of this thread's :func:`scratch` buffers (bounded: each is the largest request so far, reused)."""
    bufs = getattr(_local, "bufs", None) or {}
    return int(sum(b.numel() * b.element_size() for b in bufs.values()))


def path() -> str | None:
    """File of the built kernel library, or None when it was not built."""
    spec = importlib.util.find_spec("goblin_assets.opscope._sketch")
    return spec.origin if spec is not None and spec.origin and os.path.exists(spec.origin) else None


def lib() -> ctypes.CDLL | None:
    """The loaded kernel library (cached), or None when it is not built, is stale or :data:`ENV` is ``torch``.

    Stale: built from a ``_sketch.c`` of another interface version (:data:`ABI`),
    e.g. an install that predates a new statistic; ``pip install -e .`` (``make
    install``) rebuilds it.
    """
    if os.environ.get(ENV, "").lower() == "torch":
        return None
    if "lib" not in _state:
        where = path()
        cdll = None
        if where is not None:
            try:
                cdll = ctypes.CDLL(where)
                cdll.goblin_sketch_abi.restype = _i64
                if cdll.goblin_sketch_abi() != ABI:
                    cdll = None
            except (OSError, AttributeError):     # not loadable, or older than the version function
                cdll = None
        if cdll is not None:
            cdll.goblin_rows_f32.argtypes = [_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr]
            cdll.goblin_rows_f32.restype = None
            cdll.goblin_rows_mid_f32.argtypes = [_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr]
            cdll.goblin_rows_mid_f32.restype = None
            cdll.goblin_finish_f32.argtypes = [_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr,   # x, R, C, cs, exact
                                               _ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _i64,   # rep, adj, far
                                               _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr]   # sample, pos, ys, out
            cdll.goblin_finish_f32.restype = _i64
            cdll.goblin_probs_f32.argtypes = [_ptr, _i64, _i64, _i64, _ptr, _ptr]
            cdll.goblin_probs_f32.restype = _i64
        _state["lib"] = cdll
    return _state["lib"]


def _pool(workers: int) -> ThreadPoolExecutor:
    """A thread pool of this process (a forked child gets its own)."""
    key = (os.getpid(), workers)
    if _state.get("pool_key") != key:
        _state["pool"] = ThreadPoolExecutor(workers, thread_name_prefix="goblin-sketch")
        _state["pool_key"] = key
    return _state["pool"]


def rows(cdll: ctypes.CDLL, x: torch.Tensor, a: int, c: int, n: int = 1) -> tuple[int, int, int, int]:
    """Exact tier of a float32 CPU tensor whose memory is a dense ``(a, c, n)`` block, in one pass.

    ``c`` is the channel axis (``n = 1``: a contiguous ``(a, c)`` matrix).
    Returns the addresses ``(lo, hi, rsum, rsq)`` of float32 arrays in this
    thread's :func:`scratch` (valid until the next call on the thread):
    per-channel min and max ``(c,)``, and the sum and sum of squares of each
    row ``(a * n,)`` in memory order (row ``(i, k)`` at ``i * n + k``).  With
    ``torch.get_num_threads() > 1`` a tensor of at least 2**20 elements is
    split into that many blocks along ``a``, run on threads and combined.
    Addresses, not tensors: a sketch call is ~100 microseconds of Python at
    most, and views cost a few each.
    """
    r = a * n
    threads = torch.get_num_threads()
    blocks = min(threads, a) if threads > 1 and r * c >= _PAR_MIN_NUMEL else 1
    work = scratch(2 * blocks * c + 2 * r)
    base, f4 = work.data_ptr(), 4
    rsum, rsq = base + f4 * 2 * blocks * c, base + f4 * (2 * blocks * c + r)
    xp = x.data_ptr()
    if blocks == 1:
        (cdll.goblin_rows_f32(xp, c, 0, a, base, base + f4 * c, rsum, rsq) if n == 1 else
         cdll.goblin_rows_mid_f32(xp, c, n, 0, a, base, base + f4 * c, rsum, rsq))
        return base, base + f4 * c, rsum, rsq
    bounds = [(a * b // blocks, a * (b + 1) // blocks) for b in range(blocks)]

    def run(b: int) -> None:
        a0, a1 = bounds[b]
        lo, hi = base + f4 * 2 * b * c, base + f4 * (2 * b + 1) * c
        if n == 1:
            cdll.goblin_rows_f32(xp, c, a0, a1, lo, hi, rsum, rsq)
        else:
            cdll.goblin_rows_mid_f32(xp, c, n, a0, a1, lo, hi, rsum, rsq)

    list(_pool(blocks).map(run, range(blocks)))
    lohi = work[: 2 * blocks * c].view(blocks, 2, c)
    lohi[0, 0] = lohi[:, 0].amin(0)            # block 0's slots take the combined min and max
    lohi[0, 1] = lohi[:, 1].amax(0)
    return base, base + f4 * c, rsum, rsq
