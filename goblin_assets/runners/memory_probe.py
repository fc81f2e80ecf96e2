"""Inside the user's process: what tensor memory a training step holds, and a snapshot at a failed allocation.

Imports only the standard library and torch: like
:mod:`goblin_assets.runners.harness`, which loads this file by its path (the
user's interpreter needs nothing of Goblin installed).

* :func:`tensor_census` walks the live Python objects (``gc``) once and sorts
  every tensor's storage (each counted once, by its data pointer) into
  parameters (by dtype, trainable or frozen), their gradients, the optimizers'
  state, the last DataLoader batch and other live tensors, with the largest
  tensors named.  Tensors only autograd holds (activations saved for
  backward) are not Python objects: :class:`SavedActivations` counts them.
* :class:`SavedActivations` is a ``torch.autograd.graph.saved_tensors_hooks``
  pair that keeps the tensor as it is and adds its bytes to the current step's
  count (PyTorch docs, "Autograd mechanics: Hooks for saved tensors").  It is
  entered only for a memory probe (spec key ``memory_probe``): a hook on every
  saved tensor is a cost a timed run must not pay, and torch.compile treats
  such hooks specially.
* :func:`record_device_history` / :func:`dump_device_snapshot`: on CUDA and
  ROCm the caching allocator's history
  (``torch.cuda.memory._record_memory_history``) and an out-of-memory observer
  that writes the snapshot at the failure
  (``torch._C._cuda_attach_out_of_memory_observer``; PyTorch docs,
  "Understanding CUDA Memory Usage").  On the CPU both say why they recorded
  nothing.
"""
from __future__ import annotations

import gc
import math
import os
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

#: The file a device snapshot is written to (``torch.cuda.memory._dump_snapshot`` format).
SNAPSHOT_NAME = "memory_snapshot.pickle"
#: Allocation events the device history keeps (PyTorch's docs use 100,000).
HISTORY_ENTRIES = 100_000
#: Environment variable that turns a run into a memory probe (the parent's ``goblin fit`` sets it).
PROBE_ENV = "GOBLIN_MEMORY_PROBE"
#: Largest tensors named in a census.
TOP_TENSORS = 8


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of ``t``'s storage; None for a tensor without one (meta, sparse, fake)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def batch_storages(obj) -> set[int]:
    """Data pointers of the storages of the tensors in a batch (a tensor, or tensors in tuples, lists, mappings)."""
    if isinstance(obj, torch.Tensor):
        st = _storage(obj)
        return {st[0]} if st else set()
    if isinstance(obj, Mapping):
        return set().union(*(batch_storages(v) for v in obj.values())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(batch_storages(v) for v in obj)) if obj else set()
    return set()


def _is_tensor(o) -> bool:
    """``isinstance(o, torch.Tensor)``, False for a ``weakref.proxy`` whose object is gone (torch.compile keeps
    such proxies: ``isinstance`` on one raises ReferenceError)."""
    try:
        return isinstance(o, torch.Tensor)
    except ReferenceError:
        return False


def factored_elements(shape: tuple[int, ...]) -> int:
    """Elements of Adafactor's second moment for a parameter of ``shape``: for 2 or more dimensions a row
    factor (``shape[:-1]``) and a column factor (``shape[:-2] + shape[-1:]``), else the full tensor.  As
    ``torch.optim.Adafactor`` (torch 2.5+, ``row_var``/``col_var``) and transformers' Adafactor
    (``exp_avg_sq_row``/``exp_avg_sq_col``) keep it (Shazeer and Stern, 2018, section 3)."""
    if len(shape) < 2:
        return math.prod(shape)
    return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]


def tensor_census(optimizers: list, batch: set[int] | None = None, top: int = TOP_TENSORS) -> dict:
    """Live tensor memory of this process now, by role; bytes, each storage counted once.

    Parameters
    ----------
    optimizers:
        The live optimizers (their ``state`` tensors are the optimizer state).
    batch:
        Data pointers of the last DataLoader batch's storages (:func:`batch_storages`), or None.

    Returns
    -------
    dict
        ``params_bytes_by_dtype`` ({dtype: bytes}, all ``nn.Parameter``
        objects), ``trainable_param_bytes`` / ``frozen_param_bytes`` and
        ``trainable_params`` / ``frozen_params`` (element counts, by
        ``requires_grad``), ``adafactor_state_elements`` (the second moment
        Adafactor would keep for the trainable parameters,
        :func:`factored_elements`), ``grads_bytes``, ``optimizer_state_bytes`` (and
        ``optimizer_state_bytes_by_dtype``), ``optimizer_classes``,
        ``batch_bytes``, ``other_tensor_bytes`` (every other live tensor:
        buffers, activations a frame holds), ``total_tensor_bytes``, and
        ``largest``: the ``top`` largest storages as ``{role, shape, dtype,
        bytes}``; ``_param_storages``, the parameters' data pointers (internal:
        :class:`MemoryRecorder` removes it).  Counts only tensors Python objects reach (``gc``); what
        only autograd holds is :class:`SavedActivations`'s.
    """
    seen: dict[int, int] = {}
    largest: list[dict] = []
    out = {"params_bytes_by_dtype": {}, "trainable_param_bytes": 0, "frozen_param_bytes": 0,
           "trainable_params": 0, "frozen_params": 0, "grads_bytes": 0, "optimizer_state_bytes": 0,
           "optimizer_state_bytes_by_dtype": {}, "batch_bytes": 0, "other_tensor_bytes": 0,
           "adafactor_state_elements": 0}

    def count(t: torch.Tensor, role: str) -> int:
        st = _storage(t)
        if st is None or st[0] in seen or st[1] == 0:
            return 0
        seen[st[0]] = st[1]
        largest.append({"role": role, "shape": list(t.shape), "dtype": _dtype(t), "bytes": st[1]})
        return st[1]

    with warnings.catch_warnings():  # isinstance on a deprecated module attribute warns (torch.distributed.reduce_op)
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if _is_tensor(o)]
    params = [o for o in objs if isinstance(o, torch.nn.Parameter)]
    for p in params:
        n = count(p, "parameter (trainable)" if p.requires_grad else "parameter (frozen)")
        if n:
            d = out["params_bytes_by_dtype"]
            d[_dtype(p)] = d.get(_dtype(p), 0) + n
        key = "trainable" if p.requires_grad else "frozen"
        out[f"{key}_param_bytes"] += n
        out[f"{key}_params"] += p.numel()
        if p.requires_grad and n:
            out["adafactor_state_elements"] += factored_elements(tuple(p.shape))
    for p in params:
        if p.grad is not None:
            out["grads_bytes"] += count(p.grad, "gradient")
    for o in optimizers:
        for st in o.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    n = count(v, "optimizer state")
                    out["optimizer_state_bytes"] += n
                    if n:
                        d = out["optimizer_state_bytes_by_dtype"]
                        d[_dtype(v)] = d.get(_dtype(v), 0) + n
    batch = batch or set()
    for t in objs:
        st = _storage(t)
        in_batch = st is not None and st[0] in batch
        n = count(t, "DataLoader batch" if in_batch else "other live tensor")
        out["batch_bytes" if in_batch else "other_tensor_bytes"] += n
    out["optimizer_classes"] = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in optimizers})
    out["total_tensor_bytes"] = sum(seen.values())
    out["largest"] = sorted(largest, key=lambda r: -r["bytes"])[:top]
    out["_param_storages"] = {st[0] for st in (_storage(p) for p in params) if st is not None}
    return out


class SavedActivations:
    """Bytes of the tensors autograd saves for backward, per optimizer step (a ``saved_tensors_hooks`` pair).

    ``step_bytes`` is the running count of the current step (each storage
    once); :meth:`end_step` appends it to ``per_step`` and starts again.  The
    pack hook returns the tensor itself, so nothing is copied or kept longer.
    """

    def __init__(self):
        self.step_bytes = 0
        self.exclude: set[int] = set()  # storages not counted: the parameters (a matmul saves its weight)
        self._seen: set[int] = set()
        self.per_step: list[int] = []
        self._ctx = None

    def _pack(self, t):
        st = _storage(t) if isinstance(t, torch.Tensor) else None
        if st is not None and st[0] not in self._seen and st[0] not in self.exclude:
            self._seen.add(st[0])
            self.step_bytes += st[1]
        return t

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self) -> SavedActivations:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None

    def end_step(self) -> None:
        self.per_step.append(self.step_bytes)
        self.step_bytes = 0
        self._seen.clear()


def record_device_history() -> str | None:
    """Start the caching allocator's history (CUDA/ROCm): None, or why nothing is recorded.

    ``torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)``
    keeps the stack of every allocation, so a snapshot shows what held memory.
    """
    if not torch.cuda.is_available():
        return "no CUDA/ROCm device: the allocator history is a device allocator's"
    try:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
    except (AttributeError, RuntimeError, TypeError) as exc:
        return f"torch.cuda.memory._record_memory_history failed: {exc}"
    return None


def dump_device_snapshot(out_dir: Path) -> str | None:
    """Write the allocator's snapshot to ``out_dir/SNAPSHOT_NAME``: its path, or None when there is no device."""
    if not torch.cuda.is_available():
        return None
    path = Path(out_dir) / SNAPSHOT_NAME
    try:
        torch.cuda.memory._dump_snapshot(str(path))
    except (AttributeError, RuntimeError, OSError, pickle.PicklingError):
        return None
    return str(path)


def attach_oom_observer(out_dir: Path, on_oom=None) -> str | None:
    """On CUDA/ROCm, dump the snapshot when the caching allocator fails (before the exception unwinds).

    The observer gets ``(device, alloc, device_alloc, device_free)`` (bytes) from
    ``torch._C._cuda_attach_out_of_memory_observer``; it writes the snapshot and
    passes those to ``on_oom(dict)``.  Returns None, or why no observer is attached.
    """
    if not torch.cuda.is_available():
        return "no CUDA/ROCm device"
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return "this torch has no out-of-memory observer"

    def observer(device, alloc, device_alloc, device_free):
        snap = dump_device_snapshot(out_dir)
        if on_oom is not None:
            on_oom({"device": int(device), "request_bytes": int(alloc), "device_allocated_bytes": int(device_alloc),
                    "device_free_bytes": int(device_free), "snapshot": snap})

    attach(observer)
    return None


def rss_bytes() -> int | None:
    """Resident set size of this process now (``/proc/self/statm``), bytes; None off Linux."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def vm_size_bytes() -> int | None:
    """``VmSize`` of this process (the address space ``RLIMIT_AS`` caps), bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class MemoryRecorder:
    """The harness's memory bookkeeping: census at the measured window's start, saved activations, device history.

    ``spec["memory_probe"]`` (or :data:`PROBE_ENV` ``=1``) turns on the saved-activation count; the device
    history is recorded on CUDA/ROCm in every mode but ``benchmark`` (a timed
    run pays nothing).  :meth:`result` is the ``memory`` section of
    ``result.json``; :meth:`at_oom` the extra fields of ``oom.json``.
    """

    def __init__(self, spec: dict, out_dir: Path):
        self.out = Path(out_dir)
        self.probe = bool(spec.get("memory_probe")) or os.environ.get(PROBE_ENV) == "1"
        self.mode = spec.get("mode")
        self.saved = SavedActivations() if self.probe else None
        self.census: dict | None = None
        self.census_note: str | None = None
        self.rss_by_step: list[int | None] = []
        self.device_oom: dict | None = None
        self.device_note: str | None = None
        if spec.get("mode") != "benchmark":
            self.device_note = record_device_history()
            if self.device_note is None:
                attach_oom_observer(self.out, self._on_device_oom)

    def _on_device_oom(self, info: dict) -> None:
        self.device_oom = info

    def start(self) -> None:
        if self.saved is not None:
            self.saved.__enter__()

    def on_step(self, step: int, warmup: int, optimizers: list, batch: set[int] | None) -> None:
        """After optimizer step ``step``: RSS; the census when the warm-up ends (before the profiler starts;
        not in a ``benchmark`` run, whose steps are timed)."""
        self.rss_by_step.append(rss_bytes())
        if self.saved is not None:
            self.saved.end_step()
        if step == warmup and self.census is None and self.mode != "benchmark":
            try:
                self.census = tensor_census(optimizers, batch)
            except Exception as exc:  # noqa: BLE001 - measuring must never stop the user's program
                self.census, self.census_note = None, f"the census failed: {type(exc).__name__}: {exc}"
                return
            self.census["address_space_bytes"] = vm_size_bytes()
            if self.saved is not None:
                self.saved.exclude = self.census.pop("_param_storages")
        if self.census is not None:
            self.census.pop("_param_storages", None)

    def result(self) -> dict:
        out: dict = {"census": self.census, "rss_bytes_by_step": self.rss_by_step}
        if self.census_note:
            out["census_note"] = self.census_note
        if self.saved is not None:
            out["saved_activation_bytes_by_step"] = self.saved.per_step
        if self.device_note:
            out["device_history"] = self.device_note
        return out

    def at_oom(self, optimizers: list, batch: set[int] | None) -> dict:
        """Census of what is live at the failure, the step's saved activations so far, the device snapshot.

        Never raises for want of memory: a census that cannot be taken is None
        with the reason in ``census_note``.
        """
        extra: dict = {"rss_bytes_by_step": self.rss_by_step}
        try:
            extra["census"] = tensor_census(optimizers, batch)
            extra["census"].pop("_param_storages", None)
        except MemoryError:
            extra["census"], extra["census_note"] = None, "no memory left to walk the live tensors"
        except Exception as exc:  # noqa: BLE001 - the failure report must still be written
            extra["census"], extra["census_note"] = None, f"the census failed: {type(exc).__name__}: {exc}"
        if self.saved is not None:
            extra["saved_activation_bytes"] = self.saved.step_bytes
        if self.device_oom is not None:
            extra["device_oom"] = self.device_oom
            extra["snapshot"] = self.device_oom.get("snapshot")
        elif torch.cuda.is_available():
            extra["snapshot"] = dump_device_snapshot(self.out)
        return extra
