"""Child-process harness: runs a user's training script unmodified for a step budget.

Invoked as ``PYTHON .../goblin_assets/runners/harness.py SPEC.json`` by the
local runner, where ``PYTHON`` is the user's interpreter (the workload's
``python:``, ``goblin audit --python``, or Goblin's own by default).  The file
is run by path and imports nothing but the standard library and the user's
torch, so the user's environment needs nothing of Goblin installed; only the
``sketch`` mode's tap is imported from Goblin's package, whose folder the spec
names (``goblin_path``, appended to ``sys.path`` after the user's own
packages), and its stdlib+torch siblings are loaded by their file path
(:func:`_sibling`: ``memory_probe.py``, the tensor census and the device
memory snapshot of a failed allocation).  Step boundaries come from torch's *global* optimizer step post hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``), so the user's
script is never edited: after ``warmup`` optimizer steps the harness starts
``torch.profiler`` (mode ``profile``), times steps without a profiler (mode
``benchmark``) or enables an on-device tap (mode ``sketch``), and after
``warmup + steps`` optimizer steps it stops the script by raising
:class:`StepBudgetReached` (a ``BaseException``, so ``except Exception`` in
user code does not swallow it).

Samples and tokens are counted from the real batches: the harness wraps
``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (the profiler's
``enumerate(DataLoader)#...__next__`` range stays inside the wrapper) and reads
the workload's ``batch_field`` of each batch.

Steady state: a DataLoader with workers fills a queue of ``num_workers x
prefetch_factor`` batches while the first steps run, so the first measured
steps would find their batches waiting and look faster than the loader can
sustain.  In ``profile`` and ``benchmark`` mode the warm-up is extended by the
optimizer steps that consume that queue (``prefetch_warmup_steps`` in the
result, at most :data:`MAX_PREFETCH_WARMUP`).  After the run, every parameter
the stepped optimizers hold is checked for NaN/Inf (``nonfinite_params``), and after
every warm-up step and, in ``sketch`` mode, every step (``first_nonfinite_step``):
never inside a timed step.

A launch script entry is run by the parent under bash with ``python`` /
``python3`` on ``PATH`` pointing here as ``harness.py --launched SPEC.json
ARGS...`` (:func:`launched`): a command that runs a script file runs it
inside the harness with its own arguments, any other (``-c``, ``-m``) runs as
it is.

Where the script is (``Harness.phase``: setup, data loading, forward,
backward, optimizer step) comes from the same hooks, and every optimizer the
script constructs is tracked (a wrapped ``Optimizer.__init__``, weak
references).  When the script dies of a failed allocation (:func:`is_oom`),
``OUT/oom.json`` records the phase, the script's frame and what held memory
(``Harness.write_oom``; the parent's :mod:`goblin_assets.runners.oom` turns it
into the failure line).

Everything the parent needs goes to ``OUT/result.json`` (plain JSON that the
parent validates as one :class:`~goblin_assets.runners.result.HarnessResult`:
field names here and there must agree); the Chrome trace to
``OUT/trace.json``; sketch rows to ``OUT/sketches.json``.  Facts about the
machine (cores, CPU instruction sets) are not measured here: the parent reads
them from :mod:`goblin_assets.host`, which this child would see the same way.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import json
import math
import os
import re
import resource
import runpy
import sys
import time
import traceback
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import dataloader as _dl
from torch.utils.data._utils import worker as _dl_worker

#: The most optimizer steps the warm-up is extended by to drain a DataLoader's prefetch queue.
MAX_PREFETCH_WARMUP = 8

#: User annotations and Python-level ranges that are not ops (excluded from top-5).
_NOT_OPS = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.", "## ", "<built-in", "DataLoader")
#: The file the harness writes when the script dies of a failed allocation (read by runners/oom.py).
OOM_NAME = "oom.json"
#: The observed settings so far, written after each warm-up step (``result.OBSERVED_NAME``: the names must agree).
OBSERVED_NAME = "observed.json"
#: Exception text of a failed allocation: torch's CPU allocator (ENOMEM), CUDA/HIP caching allocator.
_OOM_TEXT = re.compile(r"out of memory|can't allocate memory|Cannot allocate memory", re.IGNORECASE)
#: Where the script is, by the hooks the harness sees (``Harness.phase``).
SETUP = "setup, before the first batch"
FORWARD = "forward (a batch loaded, no backward yet)"


def sibling(name: str):
    """The stdlib+torch module ``name``.py next to this file, loaded by its path (as this file is run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"goblin_harness_{name}", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


#: Tensor census, saved activations, device allocator history (runners/memory_probe.py).
_memory_probe = sibling("memory_probe")


#: The most ``torch.save`` calls recorded (a script that saves every step stays bounded).
MAX_SAVES = 200
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _caller_outside_torch() -> str | None:
    """``file:line in function`` of the innermost frame outside torch and this file (None when there is none)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != __file__:
            return f"{Path(name).name}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return None


def is_oom(exc: BaseException) -> bool:
    """True for a failed allocation: ``MemoryError``, torch's ``OutOfMemoryError``, or an allocator's ENOMEM text."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or bool(
        _OOM_TEXT.search(str(exc)))


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors in a batch (a tensor, or tensors in tuples, lists and mappings)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _vm_bytes() -> dict[str, int]:
    """``VmSize`` (address space now) and ``VmPeak`` of this process from ``/proc/self/status``, bytes."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmSize", "VmPeak"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _current_rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc/self/statm``), bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run ``fn(module)`` right after module ``name`` is first imported (a post-import hook)."""

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                break
        else:
            return None
        exec_module, fn = spec.loader.exec_module, self.fn

        def run_then_hook(module):
            exec_module(module)
            fn(module)

        spec.loader.exec_module = run_then_hook
        return spec


def cap_trainer_max_steps(budget: int) -> None:
    """Make every HF ``TrainingArguments`` (and subclasses: SFTConfig, ...) end after ``budget`` steps.

    The optimizer hook already stops the run; setting ``max_steps`` as well
    lets a ``Trainer`` size its schedules and progress for the short run, as the
    issue asks ("for HF Trainer scripts also ``max_steps``").  Applied when
    ``transformers.training_args`` is imported, so scripts without
    transformers never pay for it.  A script's smaller ``max_steps`` is kept.
    """
    def patch(module) -> None:
        cls = module.TrainingArguments
        orig = cls.__post_init__

        def __post_init__(self, *a, **kw):  # noqa: N807 - the dataclass hook's name
            orig(self, *a, **kw)
            if self.max_steps is None or self.max_steps <= 0 or self.max_steps > budget:
                self.max_steps = budget

        cls.__post_init__ = __post_init__

    mod = sys.modules.get("transformers.training_args")
    if mod is not None:
        patch(mod)
    else:
        sys.meta_path.insert(0, _AfterImport("transformers.training_args", patch))


class StepBudgetReached(BaseException):
    """Raised from the optimizer hook once the step budget is spent."""


def _in_memory(ds) -> bool:
    """Whether a dataset's items are slices of tensors already in memory (``TensorDataset``, and ``Subset`` /
    ``ConcatDataset`` of such): then fetching an item costs an index, and DataLoader worker processes only add
    start-up and inter-process copies (PyTorch's data-loading docs: workers parallelise ``__getitem__``)."""
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    if isinstance(ds, TensorDataset):
        return True
    if isinstance(ds, Subset):
        return _in_memory(ds.dataset)
    if isinstance(ds, ConcatDataset):
        return all(_in_memory(d) for d in ds.datasets)
    return False


def _leading_count(batch, field, unit: str, mask_field: str | None) -> tuple[int, int, int]:
    """(samples, tokens, non-padding tokens) in one batch; 0s when unreadable."""
    try:
        if isinstance(batch, Mapping):
            x = batch[field] if not isinstance(field, int) else list(batch.values())[field]
        elif isinstance(batch, (list, tuple)):
            x = batch[field if isinstance(field, int) else 0]
        else:
            x = batch
        samples = int(x.shape[0]) if hasattr(x, "shape") and len(x.shape) else 0
        tokens = int(x.numel()) if unit == "tokens" and hasattr(x, "numel") else 0
        nonpad = tokens
        if unit == "tokens" and mask_field and isinstance(batch, Mapping) and mask_field in batch:
            nonpad = int(batch[mask_field].sum().item())
        return samples, tokens, nonpad
    except Exception:  # noqa: BLE001 - an unreadable batch counts as 0, reported by the parent
        return 0, 0, 0


def load_invariants(window: int):
    """The recorder of run-time invariants (``invariants.py`` beside this file, stdlib + torch only), or None
    when that file is absent (a harness copied on its own) or ``GOBLIN_INVARIANTS=0`` switches it off."""
    path = Path(__file__).with_name("invariants.py")
    if not path.is_file() or os.environ.get("GOBLIN_INVARIANTS") == "0":  # off: benchmarks/invariants_overhead.py
        return None
    return sibling("invariants").InvariantRecorder(window).install()


class Harness:
    """State of one child run; see the module docstring."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.out = Path(spec["out_dir"])
        self.mode = spec["mode"]
        self.warmup = int(spec.get("warmup", 2))
        self.steps = int(spec["steps"])
        self.unit = spec.get("unit", "samples")
        self.field = spec.get("batch_field", 0)
        self.mask_field = spec.get("mask_field")
        self.step = 0
        self.t_last = None
        self.step_end_times: list[float] = []
        self.cur = [0, 0, 0, 0.0, 0]  # samples, tokens, nonpad, data-wait seconds, batches in the current step
        self.mem_boundary: list[float] = []  # device bytes allocated at each measured step's end (cuda)
        self.per_step: list[dict] = []
        self.prefetch_depth: int | None = None  # batches a loader's workers queue ahead (workers x prefetch_factor)
        self.prefetch_warmup = 0  # optimizer steps added to the warm-up to drain that queue
        self.all_step_s: list[float] = []  # seconds of every optimizer step, step 1 first
        self.saves: list[dict] = []  # every torch.save: the step it ran in, its seconds, who called it
        self.dataset_samples: int | None = None  # len() of the first loader's dataset (None: unknown)
        self.dataset_class: str | None = None  # the first loader's dataset class, module-qualified
        self.dataset_in_memory: bool | None = None  # its items are slices of tensors already in memory
        self.py_warnings: dict[tuple[str, str], dict] = {}  # (category, message) -> where first seen, count
        self.step_losses: list = []     # the last scalar .backward() of each optimizer step (detached tensors)
        self.cur_loss = None
        self.grads_missing: list[int] = []  # per optimizer step: trainable parameters with no gradient
        self.params_trainable = 0
        self.optimizers: list = []
        self.first_nonfinite: int | None = None
        self.prof = None
        self.tap = None
        self.rss_samples: list[int] = []
        self.device_kind = "cuda" if torch.cuda.is_available() else "cpu"
        self.phase = SETUP  # where the script is (see install_loader_counter / install_signal_hooks)
        self.batch_bytes: int | None = None  # tensor bytes of the last DataLoader batch
        self.constructed: list = []  # weak references to every optimizer the script constructed
        # run-time invariants (runners/invariants.py), profile mode only; heavy work in the last warm-up step
        self.inv = load_invariants(self.warmup) if self.mode == "profile" else None
        self.heartbeat = self.compile_probe = None  # see install_watchers
        self.batch_ptrs: set[int] = set()  # storages of the last DataLoader batch (memory census)
        self.memory = _memory_probe.MemoryRecorder(spec, self.out)

    def install_watchers(self) -> None:
        """A heartbeat per optimizer step and stack dumps on a signal (``stall``: the parent's hang watch), and
        dynamo's record of the run once the script imports ``torch._dynamo`` (``compile_probe``)."""
        self.heartbeat = sibling("stall").install(self.out, _dl_worker)
        self.compile_probe = sibling("compile_probe").CompileProbe(lambda: self.step)
        sys.meta_path.insert(0, _AfterImport("torch._dynamo", self.compile_probe.attach))

    # -- data loader wrapper --------------------------------------------------
    def install_loader_counter(self) -> None:
        orig = _dl._BaseDataLoaderIter.__next__
        h = self

        def __next__(it):  # noqa: N807 - same name as the wrapped method
            if h.prefetch_depth is None:  # the first loader the script iterates
                h.prefetch_depth = int(getattr(it, "_num_workers", 0) or 0) * int(
                    getattr(it, "_prefetch_factor", 0) or 0)
                try:
                    h.dataset_samples = len(it._dataset)
                except (AttributeError, TypeError, NotImplementedError):  # an IterableDataset has no length
                    h.dataset_samples = None
                ds = getattr(it, "_dataset", None)
                if ds is not None:
                    h.dataset_class = f"{type(ds).__module__}.{type(ds).__qualname__}"
                    h.dataset_in_memory = _in_memory(ds)
            h.phase = "data loading"
            t0 = time.perf_counter()
            batch = orig(it)
            h.cur[3] += time.perf_counter() - t0
            h.phase, h.batch_bytes = FORWARD, _tensor_bytes(batch)
            h.batch_ptrs = _memory_probe.batch_storages(batch)
            s, t, n = _leading_count(batch, h.field, h.unit, h.mask_field)
            h.cur[0] += s
            h.cur[1] += t
            h.cur[2] += n
            h.cur[4] += 1
            if h.inv is not None:
                h.inv.on_batch(it, batch, t0)
            return batch

        _dl._BaseDataLoaderIter.__next__ = __next__

    # -- the run's own signals -----------------------------------------------------
    def install_signal_hooks(self) -> None:
        """Record Python warnings (deduplicated), each step's loss (the last scalar ``.backward()``), before
        each optimizer step how many trainable parameters have no gradient, and every ``torch.save`` (a checkpoint
        save: the step it ran in, its seconds and the innermost caller outside torch; at most :data:`MAX_SAVES`)."""
        h = self
        show = warnings.showwarning
        save = torch.save

        @functools.wraps(save)
        def timed_save(*a, **kw):
            t0 = time.perf_counter()
            try:
                return save(*a, **kw)
            finally:
                if len(h.saves) < MAX_SAVES:
                    h.saves.append({"step": h.step + 1, "seconds": time.perf_counter() - t0,
                                    "where": _caller_outside_torch()})

        torch.save = timed_save

        def showwarning(message, category, filename, lineno, file=None, line=None):
            key = (category.__name__, str(message)[:500])
            seen = h.py_warnings.setdefault(key, {"category": key[0], "message": key[1],
                                                  "where": f"{Path(filename).name}:{lineno}", "count": 0,
                                                  "step": h.step + 1})
            seen["count"] += 1
            if seen["count"] == 1:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        backward = torch.Tensor.backward

        def recording_backward(tensor, *a, **kw):
            if tensor.numel() == 1:
                h.cur_loss = tensor.detach()
            h.phase = "backward"
            out = backward(tensor, *a, **kw)
            h.phase = "after backward, before the optimizer step"
            return out

        torch.Tensor.backward = recording_backward
        init = torch.optim.Optimizer.__init__

        def tracking_init(optimizer, *a, **kw):
            init(optimizer, *a, **kw)
            h.constructed.append(weakref.ref(optimizer))

        torch.optim.Optimizer.__init__ = tracking_init

        def before_step(optimizer, args, kwargs):
            h.phase = "optimizer step"
            params = [p for g in optimizer.param_groups for p in g["params"]
                      if isinstance(p, torch.Tensor) and p.requires_grad]
            h.params_trainable = max(h.params_trainable, len(params))
            h.grads_missing.append(sum(p.grad is None for p in params))
            if h.inv is not None:
                h.inv.before_step(optimizer)

        self._pre_hook = register_optimizer_step_pre_hook(before_step)

    # -- optimizer hook ----------------------------------------------------------
    def on_step(self, optimizer, args, kwargs) -> None:
        now = time.perf_counter()
        self.step += 1
        if self.heartbeat is not None:
            self.heartbeat.beat(self.step)
        self.all_step_s.append(now - self.t_last)  # every step, warm-up included (issue 29)
        self.phase = "after the optimizer step"
        self.step_losses.append(self.cur_loss)
        if self.inv is not None:
            self.inv.after_step(optimizer)
        self.cur_loss = None
        if not any(o is optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)
        # parameters checked for NaN/Inf after every warm-up step and every sketch step (never inside a timed step)
        if self.first_nonfinite is None and (self.mode == "sketch" or self.step <= self.warmup) \
                and self._nonfinite_params():
            self.first_nonfinite = self.step
        if self.step == self.warmup:
            self._extend_warmup_for_prefetch()
        if self.step > self.warmup:
            self.per_step.append(dict(
                samples=self.cur[0], tokens=self.cur[1], nonpad_tokens=self.cur[2], data_wait_s=self.cur[3],
                batches=self.cur[4], step_time_s=now - self.t_last,
                # CLOCK_MONOTONIC seconds (perf_counter on Linux): lines steps up with
                # rocprofv3's nanosecond timestamps (runners/rocprof.py).
                t_start_s=self.t_last, t_end_s=now))
            self.rss_samples.append(_current_rss_bytes())
            if self.device_kind == "cuda":
                # After optimizer.step activations are freed: what stays is weights, grads and
                # optimizer state (the batch-independent part of the peak).
                self.mem_boundary.append(float(torch.cuda.memory_allocated()))
            if self.tap is not None:
                self.tap.flush(self.step - self.warmup - 1)
        self.cur = [0, 0, 0, 0.0, 0]
        self.memory.on_step(self.step, self.warmup, self._live_optimizers(), self.batch_ptrs)
        if self.step <= self.warmup:  # never in a timed step
            self._write_observed()
        if self.step == self.warmup:
            self._begin_measured()
        elif self.step > self.warmup and self.prof is not None and self.step < self.warmup + self.steps:
            self.prof.step()
        if self.step >= self.warmup + self.steps:
            if self.inv is not None:
                self.inv.end_measured()
            if self.prof is not None:
                self.prof.stop()  # before unwinding: loader teardown is not a step
            raise StepBudgetReached()
        self.t_last = time.perf_counter()

    def _write_observed(self) -> None:
        """The settings observed so far to ``RUN_DIR/observed.json`` (atomic), so that a run that fails or
        hangs after its warm-up steps began still says how it ran; never raises."""
        obs = getattr(self, "observer", None)
        if obs is None:
            return
        try:
            tmp = self.out / (OBSERVED_NAME + ".tmp")
            tmp.write_text(json.dumps(obs.snapshot(), default=str), encoding="utf-8")
            os.replace(tmp, self.out / OBSERVED_NAME)
        except Exception:  # noqa: BLE001 - observing must never stop the user's program
            pass

    def _extend_warmup_for_prefetch(self) -> None:
        """At the end of the warm-up, add the steps that consume the loader's prefetch queue (profile/benchmark)."""
        if (self.mode not in ("profile", "benchmark") or not self.prefetch_depth or self.cur[4] <= 0
                or self.prefetch_warmup):
            return  # once: the extended warm-up's own end must not extend it again
        self.prefetch_warmup = min(MAX_PREFETCH_WARMUP, -(-self.prefetch_depth // self.cur[4]))
        self.warmup += self.prefetch_warmup

    def _losses(self) -> list:
        """Each optimizer step's loss as a float (None: no scalar backward seen; NaN/inf as strings for JSON)."""
        out = []
        for t in self.step_losses:
            v = None if t is None else float(t.float().cpu())
            out.append(v if v is None or math.isfinite(v) else str(v))
        return out

    def _nonfinite_params(self, limit: int = 10) -> list[str]:
        """The parameters of the optimizers stepped so far that hold NaN or Inf (at most ``limit``), described.

        Optimizers hold tensors, not names: each is described by its place and shape,
        ``optimizer 0, group 0, tensor 3 [256, 64] torch.float16``.
        """
        out: list[str] = []
        with torch.no_grad():
            for i, o in enumerate(self.optimizers):
                for j, g in enumerate(o.param_groups):
                    for k, p in enumerate(g["params"]):
                        if isinstance(p, torch.Tensor) and p.is_floating_point() and not bool(torch.isfinite(p).all()):
                            out.append(f"optimizer {i}, group {j}, tensor {k} {list(p.shape)} {p.dtype}")
                            if len(out) >= limit:
                                return out
        return out

    def _begin_measured(self) -> None:
        if self.device_kind == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if self.mode == "profile":
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device_kind == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            # An explicit schedule makes the profiler write ProfilerStep#N ranges; the
            # harness has already run its own warm-up steps, so the schedule has none.
            sched = torch.profiler.schedule(wait=0, warmup=0, active=self.steps, repeat=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # On CPU the allocator's [memory] events are the only per-step activation
                # memory there is (RSS keeps freed pages); CUDA has its own counters.
                self.prof = torch.profiler.profile(activities=acts, schedule=sched, record_shapes=True,
                                                   with_flops=True,
                                                   profile_memory=self.device_kind == "cpu")
            self.prof.start()
            if self.inv is not None:
                self.inv.begin_measured()
        elif self.mode == "sketch":
            if self.spec.get("goblin_path") and self.spec["goblin_path"] not in sys.path:
                sys.path.append(self.spec["goblin_path"])  # after the user's packages: only our tap comes from it
            mod, _, cls = self.spec["tap"].partition(":")
            self.tap = getattr(importlib.import_module(mod), cls)()
            self.tap.__enter__()

    # -- a failed allocation ------------------------------------------------------
    def _live_optimizers(self) -> list:
        return [o for o in (r() for r in self.constructed) if o is not None]

    def memory_held(self) -> dict:
        """Bytes the script's optimizers hold: parameters, gradients and optimizer state (each tensor once).

        ``optimizers`` counts the live optimizers the script constructed; the
        byte counts are None when it has constructed none yet.
        """
        opts = [o for o in (r() for r in self.constructed) if o is not None]
        if not opts:
            return {"optimizers": 0, "params_bytes": None, "grads_bytes": None, "optimizer_state_bytes": None}
        seen: set[int] = set()
        params = grads = state = 0
        for o in opts:
            for g in o.param_groups:
                for p in g["params"]:
                    if isinstance(p, torch.Tensor) and id(p) not in seen:
                        seen.add(id(p))
                        params += p.numel() * p.element_size()
                        if p.grad is not None:
                            grads += p.grad.numel() * p.grad.element_size()
            state += sum(v.numel() * v.element_size() for st in o.state.values() for v in st.values()
                         if isinstance(v, torch.Tensor))
        return {"optimizers": len(opts), "params_bytes": params, "grads_bytes": grads,
                "optimizer_state_bytes": state}

    def write_oom(self, exc: BaseException) -> None:
        """Write ``OUT/oom.json``: where the script was and what held memory when an allocation failed.

        Fields (bytes unless named otherwise): ``steps_done`` (optimizer steps
        before the failure), ``warmup``, ``phase`` (:data:`SETUP`, ``data
        loading``, :data:`FORWARD`, ``backward``, ...), ``where`` (the
        script's innermost frame, ``file:line in function``), ``error`` (the
        exception, first 1000 characters), ``peak_rss_bytes``,
        ``address_space_bytes`` / ``address_space_peak_bytes`` (VmSize /
        VmPeak), ``batch_bytes`` (the last DataLoader batch), those of
        :meth:`memory_held`, and on ``cuda`` ``device_allocated_bytes`` /
        ``device_reserved_bytes`` / ``device_peak_bytes``.  None where the
        harness cannot see it.  Never raises: a failure to record is a note
        on stderr.
        """
        try:
            script_dir = str(Path(self.spec["script"]).parent)
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(script_dir)]
            vm = _vm_bytes()
            state = dict(steps_done=self.step, warmup=self.warmup, phase=self.phase,
                         where=f"{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}"
                         if frames else None,
                         error=f"{type(exc).__name__}: {exc}"[:1000],
                         peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                         address_space_bytes=vm.get("VmSize"), address_space_peak_bytes=vm.get("VmPeak"),
                         batch_bytes=self.batch_bytes, **self.memory_held())
            state.update(self.memory.at_oom(self._live_optimizers(), self.batch_ptrs))
            if self.device_kind == "cuda":
                state.update(device_allocated_bytes=torch.cuda.memory_allocated(),
                             device_reserved_bytes=torch.cuda.memory_reserved(),
                             device_peak_bytes=torch.cuda.max_memory_allocated())
            (self.out / OOM_NAME).write_text(json.dumps(state), encoding="utf-8")
        except Exception as err:  # noqa: BLE001 - the script's own error is what the parent reports
            print(f"goblin harness: could not record the memory state: {err}", file=sys.stderr)

    # -- results -----------------------------------------------------------------
    def finish(self, reached: bool) -> None:
        warn: list[str] = []
        if self.device_kind == "cuda" and torch.cuda.max_memory_allocated() == 0:
            # A GPU is present but the script never put a tensor on it (e.g. digits_mlp).
            warn.append("a GPU is present but the script allocated nothing on it: measured as a CPU run")
            self.device_kind = "cpu"
        result: dict = dict(
            warnings=warn, reached_budget=reached, steps_seen=self.step, per_step=self.per_step,
            device=self.device_kind, torch_version=torch.__version__,
            hip_version=getattr(torch.version, "hip", None), cuda_version=getattr(torch.version, "cuda", None),
            num_threads=torch.get_num_threads(),
            max_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            rss_gb_samples=[r / 1e9 for r in self.rss_samples], python=sys.executable,
            prefetch_warmup_steps=self.prefetch_warmup, dataset_samples=self.dataset_samples,
            dataset_class=self.dataset_class, dataset_in_memory=self.dataset_in_memory,
            python_warnings=list(self.py_warnings.values())[:50], losses=self._losses(),
            grads_missing=self.grads_missing, params_trainable=self.params_trainable,
            nonfinite_params=self._nonfinite_params(),
            first_nonfinite_step=self.first_nonfinite, memory=self.memory.result(),
            observed=self.observer.record() if getattr(self, "observer", None) is not None else None,
            dynamo=self.compile_probe.summary() if self.compile_probe is not None else None,
            all_step_times_s=self.all_step_s, saves=self.saves,
        )
        if self.device_kind == "cuda":
            result["device_name"] = torch.cuda.get_device_name(0)
            props = torch.cuda.get_device_properties(0)
            # ROCm: the LLVM target ("gfx942:sramecc+:xnack-"); CUDA: the compute capability as sm_XY
            result["device_arch"] = (getattr(props, "gcnArchName", "") or "").split(":")[0] or \
                f"sm_{props.major}{props.minor}"
            result["mem_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
            if self.mem_boundary:
                result["mem_static_gb"] = min(self.mem_boundary) / 1e9
            free, total = torch.cuda.mem_get_info()
            result["mem_total_gb"] = total / 1e9
        if self.prof is not None:
            trace = self.out / "trace.json"
            self.prof.export_chrome_trace(str(trace))
            result["trace"] = str(trace)
            ops = []
            flops = 0
            for evt in self.prof.key_averages():
                flops += int(getattr(evt, "flops", 0) or 0)
                if evt.key.startswith(_NOT_OPS) or getattr(evt, "is_user_annotation", False):
                    continue
                self_us = evt.self_device_time_total if self.device_kind == "cuda" else evt.self_cpu_time_total
                ops.append(dict(name=evt.key, self_us=float(self_us), count=int(evt.count)))
            ops.sort(key=lambda o: -o["self_us"])
            result["ops"] = ops[:50]
            result["flops_total"] = flops
        if self.inv is not None:
            result["invariants"] = self.inv.report()
        if self.tap is not None:
            self.tap.__exit__(None, None, None)
            (self.out / "sketches.json").write_text(json.dumps(self.tap.rows))
        (self.out / "result.json").write_text(json.dumps(result), encoding="utf-8")


#: Interpreter options that take the next argument as their value (``python -W ignore train.py``).
_PY_OPTS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def python_script_of(argv: list[str]) -> tuple[str, list[str]] | None:
    """The script and its arguments in a ``python`` command line's arguments (after ``python``).

    ``["-u", "train.py", "--lr", "3e-4"]`` -> ``("train.py", ["--lr", "3e-4"])``.
    None when the command runs no script file: ``-c CODE``, ``-m MODULE``,
    ``-`` (stdin) or no argument (a REPL).
    """
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in _PY_OPTS_WITH_VALUE:
            i += 2
            continue
        if a == "-" or (a.startswith("-") and not a.startswith("--") and a[1:2] not in ("W", "X")
                        and {"c", "m"} & set(a[1:])):
            return None
        if a.startswith("-"):
            i += 1
            continue
        return a, argv[i + 1:]
    return None


def launched(spec_path: str, python_argv: list[str]) -> int:
    """A ``python`` command of a launch script (the run's ``bin/python`` shim ends here).

    A command that runs a script file runs it inside the harness, with the
    spec's budget and the command's own arguments; the script is found from
    the working directory, else beside the launch script (``launch_dir``).
    Any other command (``python -c``, ``python -m``) runs in the interpreter
    as it is.  Once a command has taken optimizer steps (its ``result.json``
    says so) the budget is spent: later ``python`` commands of the launch
    script are skipped (exit 0, a note on stderr).
    """
    found = python_script_of(python_argv)
    if found is None:
        os.execv(sys.executable, [sys.executable, *python_argv])
    spec = json.loads(Path(spec_path).read_text())
    prev = Path(spec["out_dir"]) / "result.json"
    if prev.is_file() and json.loads(prev.read_text(encoding="utf-8")).get("steps_seen"):
        print(f"goblin harness: the step budget is spent; skipping python {' '.join(python_argv)}", file=sys.stderr)
        return 0
    script, args = found
    path = Path(script)
    if not path.is_absolute() and not path.exists() and (Path(spec["launch_dir"]) / path).exists():
        path = Path(spec["launch_dir"]) / path
    return run({**spec, "script": str(path.absolute()), "args": args})


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--launched":
        return launched(argv[1], argv[2:])
    return run(json.loads(Path(argv[0]).read_text()))


def run(spec: dict) -> int:
    """Run the spec's script for its step budget and write the results (never returns: ``os._exit``)."""
    h = Harness(spec)
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    h.install_loader_counter()
    h.install_signal_hooks()
    h.observer = sibling("observe").Observer(spec)  # the settings as they ran (runners/observe.py, issue 27)
    h.observer.install()
    h.install_watchers()
    cap_trainer_max_steps(h.warmup + h.steps + (MAX_PREFETCH_WARMUP if h.mode in ("profile", "benchmark") else 0))
    handle = register_optimizer_step_post_hook(h.on_step)
    script = spec["script"]
    sys.argv = [script, *spec.get("args", [])]
    sys.path.insert(0, str(Path(script).parent))
    h.memory.start()
    h.t_last = time.perf_counter()
    reached = False
    try:
        runpy.run_path(script, run_name="__main__")
    except StepBudgetReached:
        reached = True
        if h.heartbeat is not None:
            h.heartbeat.done()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    except BaseException as exc:
        if is_oom(exc):
            h.write_oom(exc)
        raise
    finally:
        handle.remove()
    h.finish(reached)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: data-loader workers and non-daemon threads of the
    # user's script must not keep the child alive after the budget is spent.
    if os.environ.get("GOBLIN_HARNESS_EXIT") == "libc":
        # A profiler wrapping the child (rocprofv3) writes its files from C atexit
        # handlers, which os._exit skips; libc exit() runs them and still skips
        # the interpreter's teardown.
        import ctypes

        ctypes.CDLL(None).exit(0)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
