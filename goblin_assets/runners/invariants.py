"""Run-time invariants of a healthy training step, recorded inside the user's process (stdlib + torch only).

Loaded by the child harness (:mod:`goblin_assets.runners.harness`) as it loads
the sketch tap: from the Goblin folder the spec names (``goblin_path``), else
from the file beside the harness.  Like the harness it imports nothing but the
standard library and the user's torch.  It records raw measurements only; the
parent judges them (:mod:`goblin_assets.measure.invariants`) against cited
thresholds and the host's facts.

What is recorded, and when (``W`` is the spec's warm-up, the *window step*;
all heavy work happens in warm-up steps, outside every timed step):

* ``numerics``: during step ``W`` (``W >= 2``: a step that ran once before) a global forward hook keeps, for the first
  call of each leaf module (at most :data:`MAX_MODULES`, :data:`MAX_CAPTURE_BYTES`
  of tensors), its inputs and output in the run's precision; after step ``W``
  each module is run again on the CPU in float64 from the same inputs (a deep
  copy) and the normwise relative error ``||y - y64|| / ||y64||`` is kept with
  the output dtype, the inner dimension and the share of outputs that are
  exactly zero where the reference is not (flushed values).  Backward too:
  a hook on the output keeps the gradient backward brought to it, and the
  module's backward is replayed from the same inputs for that gradient (scaled
  to a largest value of 1: backward is linear in it) in the run's precision
  (its device and autocast) and in float64; the gradients of
  its floating inputs and parameters are compared the same way (rows with
  ``pass: backward``).
* ``grads``: before the optimizer step ``W``, per parameter group: the gradient
  norm, the share of non-zero gradient values below the smallest normal of the
  run's compute dtype (``torch.finfo(dtype).tiny``), the share of exact zeros,
  and the parameters whose gradient is all zeros; after it, the
  update-to-weight ratio ``||dw|| / ||w||`` on a strided sample of at most
  :data:`SAMPLE` elements per tensor, and the share of sampled elements whose
  gradient was non-zero but whose value did not move (updates lost).
* ``unchanged``: trainable parameters whose sampled values are the same at the
  end of the run as before the first optimizer step.
* ``optimizer``: each stepped optimizer's class, its parameters' dtypes and
  its state tensors' dtypes, and whether any fp32 copy of a 16-bit parameter
  is held in its state (a master weight).
* ``labels``: per batch with a ``labels`` field of two or more dimensions
  (token-level), ignored positions (-100) and whether each row's last attended
  token (by ``attention_mask``) is a target.
* ``threads``: torch's intra-/inter-op threads, the DataLoader's workers, the
  CPUs this process may run on (``os.sched_getaffinity``), the launcher's
  ``LOCAL_WORLD_SIZE`` / ``WORLD_SIZE``, and over the measured steps the share
  of the host's CPU time that was busy (``/proc/stat``) and this process's CPU
  seconds (``os.times``).
* ``workers``: each multi-process DataLoader iterator started (its step,
  workers, ``persistent_workers``) and the seconds from its start to its first
  batch.
* ``shapes``: per optimizer step the shapes of the batch tensors, the step's
  wall time and the largest learning rate of its groups (all steps, warm-up included).

``cost_s`` is the time spent in this module's own code (perf_counter), for the
budget check (benchmarks/invariants_overhead.py).
"""
from __future__ import annotations

import copy
import math
import os
import time
import weakref
from collections.abc import Mapping

import torch

#: Leaf modules whose forward is compared against a float64 reference at most.
MAX_MODULES = 64
#: Bytes of captured inputs/outputs at most (the rest of the modules are skipped, and counted).
MAX_CAPTURE_BYTES = 64 * 2**20
#: Elements sampled per parameter for the update and never-changed checks.
SAMPLE = 4096
#: Module classes whose forward is random in training mode: their output cannot be recomputed.
_RANDOM = ("Dropout", "AlphaDropout", "FeatureAlphaDropout")
#: Label value of positions the loss ignores (torch.nn.CrossEntropyLoss ``ignore_index`` default).
IGNORE_INDEX = -100


def _sample(p: torch.Tensor) -> torch.Tensor:
    """A strided float64 CPU sample of at most :data:`SAMPLE` elements of ``p`` (a copy)."""
    flat = p.detach().reshape(-1)
    stride = max(1, flat.numel() // SAMPLE)
    return flat[::stride][:SAMPLE].to("cpu", torch.float64, copy=True)


def _tensors(obj):
    """The tensors in a batch or an argument tuple (tensors, tuples, lists, mappings), in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _map(obj, fn):
    """``obj`` with every tensor replaced by ``fn(tensor)`` (tuples, lists and dicts rebuilt)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj) if not hasattr(obj, "_fields") else obj
    return obj


def _autocast_device() -> str | None:
    """The device type whose autocast is on here (``cuda`` first, then ``cpu``), or None."""
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return dev
        except TypeError:  # an older torch: is_autocast_enabled() is CUDA's, the CPU one has its own name
            if (torch.is_autocast_enabled() if dev == "cuda" else torch.is_autocast_cpu_enabled()):
                return dev
    return None


def _cpu_busy() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from ``/proc/stat`` (None where unreadable)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals) - idle, sum(vals)
    except (OSError, ValueError, IndexError):
        return None


def _never_raises(method):
    """A hook that must not break the user's script: an exception is kept in ``errors`` (first 10), not raised."""
    import functools

    @functools.wraps(method)
    def run(self, *a, **kw):
        try:
            return method(self, *a, **kw)
        except Exception as exc:  # noqa: BLE001 - the user's run goes on; the check says what failed
            if len(self.errors) < 10:
                self.errors.append(f"{method.__name__}: {type(exc).__name__}: {exc}"[:300])
            return None

    return run


class InvariantRecorder:
    """Raw measurements of one child run for the invariant checks (see the module docstring).

    ``window`` is the optimizer step (from 1) whose forward is captured and whose
    gradients and update are measured: the spec's last warm-up step.
    """

    def __init__(self, window: int, names_from=None):
        self.window = max(1, int(window))
        self.errors: list[str] = []  # hooks that failed (never raised into the user's script)
        self.cost_s = 0.0
        self.step = 0
        self.numerics: list[dict] = []
        self.numerics_skipped = 0
        self.grads: list[dict] = []
        self.zero_grad_params: list[str] = []
        self.update: list[dict] = []
        self.unchanged: list[str] = []
        self.trainable_checked = 0
        self.optimizer: list[dict] = []
        self.labels = {"batches": 0, "positions": 0, "ignored": 0, "attended": 0, "attended_ignored": 0,
                       "rows": 0, "rows_last_masked": 0}
        self.threads: dict = {}
        self.workers: list[dict] = []
        self.shapes: list[str] = []
        self.step_times_s: list[float] = []
        self.lrs: list[float] = []  # per step: the largest learning rate of the stepped optimizer's groups
        self.compute_dtype: str | None = None
        self._cur_shape: list[str] = []
        self._t_step = time.perf_counter()
        self._first: dict[int, torch.Tensor] = {}   # id(param) -> sample before the first step
        self._params: dict[int, weakref.ref] = {}
        self._before: dict[int, torch.Tensor] = {}  # window step: samples before the update
        self._grad_nz: dict[int, torch.Tensor] = {}
        self._captured: list[tuple] = []
        self._grad_out: dict[int, torch.Tensor] = {}
        self._autocast: dict[int, tuple | None] = {}
        self._capture_bytes = 0
        self._hooks: list = []
        self._depth = 0
        self._root = None
        self._names: dict[int, str] = {}
        self._open_iters: list = []
        self._busy0 = None

    def install(self) -> InvariantRecorder:
        """Hook into the process (the child harness calls this once): DataLoader worker starts and, for a
        window of step 1, no forward capture: its copies of each module's inputs would be held in a step that
        has not yet run once, where they could be what makes the program run out of memory (a capped run's
        phase of failure would then be ours).  Returns the recorder."""
        self._watch_workers()
        return self

    def _watch_workers(self) -> None:
        """Stamp each multi-process DataLoader iterator's start (its workers start in ``__init__``)."""
        from torch.utils.data import dataloader as dl

        init, rec = dl._MultiProcessingDataLoaderIter.__init__, self

        def stamped_init(it, *a, **kw):
            t0 = time.perf_counter()
            init(it, *a, **kw)
            it._goblin_t0 = t0
            rec.on_iter(it)

        dl._MultiProcessingDataLoaderIter.__init__ = stamped_init

    # -- names ------------------------------------------------------------------------
    def _name(self, p: torch.Tensor, where: str) -> str:
        return self._names.get(id(p)) or where

    def _learn_names(self, root: torch.nn.Module) -> None:
        for n, m in root.named_modules():
            self._names.setdefault(id(m), n or type(m).__name__)
        for n, p in root.named_parameters():
            self._names.setdefault(id(p), n)

    # -- forward capture (the window step) ------------------------------------------------
    def _start_capture(self) -> None:
        reg = torch.nn.modules.module
        self._hooks = [reg.register_module_forward_pre_hook(self._pre),
                       reg.register_module_forward_hook(self._post)]

    def _stop_capture(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    @_never_raises
    def _pre(self, module, args):
        if self._depth == 0 and self._root is None:
            self._root = module
            self._learn_names(module)
        self._depth += 1
        if self.compute_dtype is None:
            dev = _autocast_device()
            if dev is not None:
                self.compute_dtype = str(torch.get_autocast_dtype(dev))

    @_never_raises
    def _post(self, module, args, output):
        self._depth = max(0, self._depth - 1)
        t0 = time.perf_counter()
        try:
            if next(module.children(), None) is not None or type(module).__name__ in _RANDOM:
                return
            if any(c[0]() is module for c in self._captured):
                return
            outs = [t for t in _tensors(output) if t.is_floating_point()]
            if not outs:
                return
            size = sum(t.numel() * t.element_size() for t in (*_tensors(args), outs[0], *module.parameters()))
            if len(self._captured) >= MAX_MODULES or self._capture_bytes + size > MAX_CAPTURE_BYTES:
                self.numerics_skipped += 1
                return
            self._capture_bytes += size
            keep = _map(args, lambda t: t.detach().clone())
            # the module as it ran: the optimizer step changes its weights before the comparison
            dev = _autocast_device()
            self._captured.append((weakref.ref(module), copy.deepcopy(module), keep, outs[0].detach().clone(),
                                   dev is not None, module.training))
            if outs[0].requires_grad and self._capture_bytes + size // 2 <= MAX_CAPTURE_BYTES:
                # the gradient backward brings to this output: the backward comparison replays it
                slot = len(self._captured) - 1
                self._autocast[slot] = (dev, torch.get_autocast_dtype(dev)) if dev is not None else None
                outs[0].register_hook(lambda g, k=slot: self._grad_out.__setitem__(k, g.detach().clone()))
                self._capture_bytes += outs[0].numel() * outs[0].element_size()
        finally:
            self.cost_s += time.perf_counter() - t0

    def _backward_pair(self, module, args, grad_out, autocast) -> tuple[list, list]:
        """The gradients (of the floating inputs, then of the parameters) one captured module's backward gives
        for ``grad_out`` in the run's precision (its device, its autocast) and in float64 on the CPU."""
        def grads(m, a, g, ctx):
            leaves = [t.requires_grad_() for t in _tensors(a) if t.is_floating_point()]
            for q in m.parameters():
                q.grad = None
            with torch.enable_grad(), ctx:
                y = next(t for t in _tensors(m(*a)) if t.is_floating_point())
            with torch.enable_grad():
                ins = torch.autograd.grad(y, leaves + [q for q in m.parameters() if q.requires_grad], g,
                                          allow_unused=True)
            return [t for t in ins if t is not None]

        run = copy.deepcopy(module).train(module.training)
        a_run = _map(args, lambda t: t.clone())
        ctx = torch.autocast(autocast[0], dtype=autocast[1]) if autocast else torch.autocast("cpu", enabled=False)
        got = grads(run, a_run, grad_out, ctx)
        m64 = copy.deepcopy(module).to("cpu", torch.float64).train(module.training)
        a64 = _map(args, lambda t: t.to("cpu", torch.float64) if t.is_floating_point() else t.to("cpu"))
        ref = grads(m64, a64, grad_out.to("cpu", torch.float64), torch.autocast("cpu", enabled=False))
        return got, ref

    def _compare(self) -> None:
        """Recompute each captured module in float64 on the CPU and keep the error (after the window step);
        where backward brought a gradient to its output, replay that backward in the run's precision and in
        float64 and keep the gradients' error too (rows with ``pass`` ``backward``)."""
        for k, (ref, module, args, out, autocast, training) in enumerate(self._captured):
            if ref() is None:
                continue
            if k in self._grad_out:
                self.numerics.append(self._compare_backward(ref(), module, args, k))
            row = {"module": self._names.get(id(ref()), type(module).__name__), "class": type(module).__name__,
                   "dtype": str(out.dtype), "device": str(out.device), "autocast": autocast,
                   "inner_dim": int(next((t.shape[-1] for t in _tensors(args) if t.dim()), 1))}
            try:
                m64 = module.to("cpu", torch.float64).train(training)
                a64 = _map(args, lambda t: t.to("cpu", torch.float64) if t.is_floating_point() else t.to("cpu"))
                with torch.no_grad(), torch.autocast("cpu", enabled=False):
                    y64 = next(t for t in _tensors(m64(*a64)) if t.is_floating_point())
                y = out.to("cpu", torch.float64)
                if y.shape != y64.shape:
                    raise ValueError(f"shape {list(y.shape)} vs reference {list(y64.shape)}")
                den = float(y64.norm())
                row["rel_err"] = float((y - y64).norm()) / den if den > 0 else 0.0
                ref_nz = y64.abs() >= torch.finfo(out.dtype).tiny  # values the dtype holds as normals
                row["flushed_share"] = float(((y == 0) & ref_nz).sum()) / max(1, int(ref_nz.sum()))
                row["numel"] = int(y.numel())
            except Exception as exc:  # noqa: BLE001 - a module that cannot run on the CPU in float64 is not observable
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            self.numerics.append(row)
        self._captured, self._grad_out, self._autocast = [], {}, {}

    def _compare_backward(self, live, module, args, k: int) -> dict:
        g = self._grad_out[k]
        row = {"module": self._names.get(id(live), type(module).__name__), "class": type(module).__name__,
               "pass": "backward", "dtype": str(g.dtype), "device": str(g.device),
               "autocast": self._autocast.get(k) is not None,
               # gradients sum over the output's last dimension (inputs) and its rows (weights): the longer sum
               "inner_dim": int(max(g.shape[-1], g.numel() // max(1, g.shape[-1]))) if g.dim() else 1}
        try:
            # backward is linear in the output's gradient: replay it scaled to a largest value of 1, so what is
            # compared is the kernels' error, not the underflow of a tiny loss (grad_below_normal's finding)
            peak = float(g.abs().max()) if g.numel() else 0.0
            if not peak > 0 or not math.isfinite(peak):
                raise ValueError("the output's gradient is all zero or not finite")
            got, ref = self._backward_pair(module, args, g / peak, self._autocast.get(k))
            if len(got) != len(ref) or not ref:
                raise ValueError(f"{len(got)} gradients vs {len(ref)} in the reference")
            y = torch.cat([t.detach().to("cpu", torch.float64).reshape(-1) for t in got])
            y64 = torch.cat([t.detach().reshape(-1) for t in ref])
            den = float(y64.norm())
            row["rel_err"] = float((y - y64).norm()) / den if den > 0 else 0.0
            ac = self._autocast.get(k)
            low = ac[1] if ac else min((t.dtype for t in got), key=lambda d: torch.finfo(d).bits)
            row["dtype"] = str(low)   # the precision the backward computed in (autocast's, else the gradients')
            ref_nz = y64.abs() >= torch.finfo(low).tiny
            row["flushed_share"] = float(((y == 0) & ref_nz).sum()) / max(1, int(ref_nz.sum()))
            row["numel"] = int(y.numel())
        except Exception as exc:  # noqa: BLE001 - a backward that cannot be replayed is not observable
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        return row

    # -- batches ----------------------------------------------------------------------
    @_never_raises
    def on_iter(self, it) -> None:
        """A DataLoader iterator's first ``__next__``: a multi-process one started its workers."""
        workers = int(getattr(it, "_num_workers", 0) or 0)
        if not self.threads.get("dataloader_workers"):
            self.threads["dataloader_workers"] = workers
        if workers:
            self.workers.append({"step": self.step + 1, "workers": workers,
                                 "persistent": bool(getattr(it, "_persistent_workers", False)),
                                 "t0": getattr(it, "_goblin_t0", None)})

    @_never_raises
    def on_batch(self, it, batch, t_call: float) -> None:
        """One batch from a DataLoader: label masking (token-level labels) and the batch's shapes."""
        t0 = time.perf_counter()
        if workers := [w for w in self.workers if w.get("t0") is not None and "startup_s" not in w]:
            for w in workers:
                w["startup_s"] = max(0.0, t0 - w.pop("t0"))
        shapes = [str(list(t.shape)) for t in _tensors(batch)]
        self._cur_shape.append(";".join(shapes))
        if isinstance(batch, Mapping) and isinstance(batch.get("labels"), torch.Tensor) and batch["labels"].dim() >= 2:
            lab = batch["labels"]
            ign = lab == IGNORE_INDEX
            st = self.labels
            st["batches"] += 1
            st["positions"] += int(lab.numel())
            st["ignored"] += int(ign.sum())
            mask = batch.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.shape == lab.shape:
                att = mask.bool()
                st["attended"] += int(att.sum())
                st["attended_ignored"] += int((att & ign).sum())
                last = (att.long().cumsum(-1) == att.long().sum(-1, keepdim=True)) & att
                rows = last.any(-1)
                st["rows"] += int(rows.sum())
                st["rows_last_masked"] += int((last & ign).any(-1).sum())
        self.cost_s += time.perf_counter() - t0

    # -- optimizer steps -----------------------------------------------------------------
    @_never_raises
    def before_step(self, optimizer) -> None:
        """Before each optimizer step: the first step's samples; the window step's gradients and samples."""
        t0 = time.perf_counter()
        step = self.step + 1
        with torch.no_grad():
            for gi, g in enumerate(optimizer.param_groups):
                params = [p for p in g["params"] if isinstance(p, torch.Tensor) and p.requires_grad]
                for k, p in enumerate(params):
                    if id(p) not in self._params:
                        self._params[id(p)] = weakref.ref(p)
                        self._first[id(p)] = _sample(p)
                if step == self.window:
                    self._group_grads(optimizer, gi, params)
        self.cost_s += time.perf_counter() - t0

    def _group_grads(self, optimizer, gi: int, params: list) -> None:
        dtype = getattr(torch, (self.compute_dtype or "").removeprefix("torch."), None)
        low = [p.dtype for p in params if p.is_floating_point() and p.element_size() == 2]
        dtype = dtype if isinstance(dtype, torch.dtype) else (low[0] if low else torch.float32)
        tiny = torch.finfo(dtype).tiny
        sq = n = zeros = below = 0.0
        for k, p in enumerate(params):
            self._before[id(p)] = _sample(p)
            if p.grad is None:
                continue
            gr = p.grad.detach()
            if gr.is_sparse:
                gr = gr.coalesce().values()
            a = gr.abs()
            nz = int((a != 0).sum())
            sq += float(gr.float().pow(2).sum())
            n += gr.numel()
            zeros += gr.numel() - nz
            below += int(((a < tiny) & (a != 0)).sum())
            if nz == 0 and gr.numel() > 0:
                self.zero_grad_params.append(self._name(p, f"group {gi}, tensor {k} {list(p.shape)}"))
            flat = gr.reshape(-1)
            stride = max(1, flat.numel() // SAMPLE)
            self._grad_nz[id(p)] = (flat[::stride][:SAMPLE] != 0).cpu()
        self.grads.append({"group": gi, "optimizer": type(optimizer).__name__, "params": len(params),
                           "grad_norm": math.sqrt(sq), "elements": int(n),
                           "zero_share": zeros / n if n else None, "below_normal_share": below / n if n else None,
                           "compute_dtype": str(dtype)})

    @_never_raises
    def after_step(self, optimizer) -> None:
        """After each optimizer step: its shapes and wall time; after the window step, the update and numerics."""
        t0 = time.perf_counter()
        self.step += 1
        self.step_times_s.append(t0 - self._t_step)
        self.lrs.append(max((float(g.get("lr", 0.0) or 0.0) for g in optimizer.param_groups), default=0.0))
        self.shapes.append("|".join(self._cur_shape))
        self._cur_shape = []
        if self.step == self.window - 1:
            self._start_capture()
        if self.step == self.window:
            self._stop_capture()
            self._update(optimizer)
            self._optimizer_state(optimizer)
            self._compare()
        self.cost_s += time.perf_counter() - t0
        self._t_step = time.perf_counter()

    def _update(self, optimizer) -> None:
        with torch.no_grad():
            for gi, g in enumerate(optimizer.param_groups):
                dw = w = 0.0
                lost = moved_ok = 0
                for p in g["params"]:
                    before = self._before.pop(id(p), None)
                    if before is None:
                        continue
                    after = _sample(p)
                    dw += float((after - before).pow(2).sum())
                    w += float(before.pow(2).sum())
                    nz = self._grad_nz.pop(id(p), None)
                    if nz is not None and nz.numel() == after.numel():
                        still = (after == before) & nz
                        lost += int(still.sum())
                        moved_ok += int(nz.sum())
                self.update.append({"group": gi, "lr": float(g.get("lr", 0.0) or 0.0),
                                    "update_ratio": math.sqrt(dw / w) if w > 0 else None,
                                    "lost_share": lost / moved_ok if moved_ok else None})

    def _optimizer_state(self, optimizer) -> None:
        pdt = sorted({str(p.dtype) for g in optimizer.param_groups for p in g["params"]
                      if isinstance(p, torch.Tensor) and p.requires_grad})
        sdt: dict[str, set] = {}
        master = False
        shapes16 = {tuple(p.shape) for g in optimizer.param_groups for p in g["params"]
                    if isinstance(p, torch.Tensor) and p.is_floating_point() and p.element_size() == 2}
        for st in optimizer.state.values():
            for key, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim():
                    sdt.setdefault(key, set()).add(str(v.dtype))
                    master |= v.dtype == torch.float32 and tuple(v.shape) in shapes16 and "exp_avg" not in key
        self.optimizer.append({"optimizer": type(optimizer).__name__, "param_dtypes": pdt,
                               "state_dtypes": {k: sorted(v) for k, v in sdt.items()}, "master_copy": master})

    # -- measured steps: threads and CPU load ---------------------------------------------
    @_never_raises
    def begin_measured(self) -> None:
        """At the first timed step: threads, CPUs and the launcher's ranks; start the CPU-load window."""
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = None
        self.threads.update(intra_op=torch.get_num_threads(), inter_op=torch.get_num_interop_threads(),
                            affinity_cpus=affinity, local_world_size=os.environ.get("LOCAL_WORLD_SIZE"),
                            world_size=os.environ.get("WORLD_SIZE"), omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
        self.threads.setdefault("dataloader_workers", 0)
        self._busy0 = (_cpu_busy(), os.times(), time.perf_counter())

    @_never_raises
    def end_measured(self) -> None:
        """At the last timed step: the host's busy share and this process's CPU seconds over the timed steps."""
        if self._busy0 is None:
            return
        (b0, times0, w0), b1, times1 = self._busy0, _cpu_busy(), os.times()
        if b0 and b1 and b1[1] > b0[1]:
            self.threads["host_busy_share"] = (b1[0] - b0[0]) / (b1[1] - b0[1])
        self.threads["process_cpu_s"] = (times1.user + times1.system) - (times0.user + times0.system)
        self.threads["wall_s"] = time.perf_counter() - w0
        self._busy0 = None

    # -- the end ---------------------------------------------------------------------------
    def report(self) -> dict:
        """Everything recorded, as plain JSON (``result.json``'s ``invariants``); ``errors`` names hooks that failed."""
        t0 = time.perf_counter()
        self._stop_capture()
        self.end_measured()
        self._unchanged()
        self.cost_s += time.perf_counter() - t0
        return {"window_step": self.window, "steps": self.step, "cost_s": self.cost_s, "errors": self.errors,
                "compute_dtype": self.compute_dtype, "numerics": self.numerics,
                "numerics_skipped": self.numerics_skipped, "numerics_window_too_early": self.window == 1,
                "grads": self.grads,
                "zero_grad_params": self.zero_grad_params[:20], "update": self.update,
                "unchanged_params": self.unchanged, "trainable_checked": self.trainable_checked,
                "optimizer": self.optimizer, "labels": self.labels, "threads": self.threads,
                "workers": [{k: v for k, v in w.items() if k != "t0"} for w in self.workers],
                "shapes": self.shapes, "step_times_s": self.step_times_s, "lrs": self.lrs}

    @_never_raises
    def _unchanged(self) -> None:
        with torch.no_grad():
            for pid, ref in self._params.items():
                p = ref()
                if p is None:
                    continue
                self.trainable_checked += 1
                if torch.equal(_sample(p), self._first[pid]) and len(self.unchanged) < 20:
                    self.unchanged.append(self._name(p, f"{list(p.shape)} {p.dtype}"))
