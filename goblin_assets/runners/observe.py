"""Observed settings: what the running program really uses, read inside it without changing it (issue 27).

Loaded by the child harness (:mod:`goblin_assets.runners.harness`) from its
own folder, by path, so like the harness it imports only the standard
library and torch and runs in the user's interpreter.  :class:`Observer`
installs pass-through wrappers before the user's script starts and writes one
record per run (``observed`` in ``result.json``,
:class:`goblin_assets.runners.result.ObservedRecord`):

* every DataLoader the script iterates: ``batch_size`` (or its batch
  sampler's), ``num_workers``, ``pin_memory``, ``prefetch_factor``,
  ``persistent_workers``, ``drop_last``, sampler and dataset classes
  (``_BaseDataLoaderIter.__init__``, which every iteration of a loader runs);
* every optimizer stepped: class, each parameter group's learning rate (the
  ``initial_lr`` an LR scheduler stores, else ``lr``), betas, momentum,
  weight decay, ``fused`` / ``foreach`` (the global optimizer step pre hook);
* LR schedulers constructed (``LRScheduler.__init__``): class and, where the
  object states it, the warm-up length (Hugging Face's schedules are a
  ``LambdaLR`` over a ``functools.partial`` with ``num_warmup_steps``;
  ``LinearLR`` with ``start_factor < 1`` warms up over ``total_iters``);
* backward passes per optimizer step (``torch.autograd.backward``, which
  ``Tensor.backward`` calls): gradient accumulation as it ran;
* every ``torch.autocast`` entered (device type, dtype, enabled, the first
  frame outside torch that entered it, how often), a ``GradScaler``
  constructed, the dtypes of the trainable parameters and of their gradients
  at the first optimizer step;
* ``torch.utils.checkpoint.checkpoint`` calls and
  ``scaled_dot_product_attention`` calls (with the SDPA backends torch has
  enabled), per run;
* at the first optimizer step, from the frames on the stack: the model that
  holds the stepped parameters (its class, ``config._name_or_path``,
  ``config._attn_implementation``, ``is_gradient_checkpointing``, a peft
  adapter's ``r`` / ``lora_alpha`` / ``target_modules``), a Hugging Face
  ``TrainingArguments`` and a Lightning ``Trainer`` when one exists, and
  ``torch.get_num_threads()``;
* the first batches' shapes: width and padding of the token field
  (sequence length and padding as they ran).

Nothing here changes a value the script sees; every wrapper calls the
original with the same arguments.  The parent turns the record into
ConfigDict values of provenance ``observed``
(:mod:`goblin_assets.config.observed`).
"""
from __future__ import annotations

import collections
import functools
import os
import sys
from collections.abc import Mapping

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import dataloader as _dl

#: Batches whose shapes are recorded (the first ones; enough to see fixed vs per-batch widths).
MAX_BATCHES = 64
#: Modules whose first inputs are kept before the first optimizer step (the model is found then).
MAX_INPUT_MODULES = 4096
#: Optimizer steps whose backward and batch counts are recorded.
MAX_STEPS = 64
#: Frames searched for the model and the trainer objects at the first optimizer step.
MAX_FRAMES = 80
#: TrainingArguments fields recorded (names as transformers spells them).
TRAINING_ARGUMENTS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "warmup_steps",
    "warmup_ratio", "bf16", "fp16", "tf32", "optim", "gradient_checkpointing", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_prefetch_factor", "dataloader_persistent_workers", "group_by_length",
    "train_sampling_strategy", "weight_decay", "max_steps", "torch_compile", "lr_scheduler_type",
)
#: Lightning Trainer attributes recorded.
LIGHTNING_TRAINER = ("precision", "accumulate_grad_batches", "max_steps", "max_epochs", "num_devices",
                     "world_size", "strategy")
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _number(v):
    """An optimizer hyperparameter as JSON numbers: a float, a one-element tensor's value (torch accepts
    ``lr=torch.tensor(1e-3)``), a list of those for a tuple (``betas``; Adafactor's ``eps`` pair, whose None
    stays None); anything else None (not a number the schema can hold)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach().cpu().item())
    if isinstance(v, (list, tuple)):
        return [_number(x) for x in v]
    return None


def _scalar(v):
    n = _number(v)
    return n if not isinstance(n, list) else None


def _list(v):
    n = _number(v)
    return n if isinstance(n, list) else None


def _plain(v):
    """A JSON-able copy of a setting: numbers, strings, bools, None, lists of those; an object whose repr is only
    its address (``<...Strategy object at 0x...>``) as its class's dotted name; else its repr."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in (sorted(v, key=str) if isinstance(v, (set, frozenset)) else v)]
    if hasattr(v, "value") and isinstance(getattr(v, "value"), (str, int)):  # an Enum (IntervalStrategy, ...)
        return v.value
    text = repr(v)
    if " object at 0x" in text:
        return f"{type(v).__module__}.{type(v).__qualname__}"
    return text[:200]


def _where_outside(skip: tuple[str, ...]) -> str | None:
    """``file:line`` of the innermost frame not in torch, contextlib, this folder or ``skip``."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name.startswith(_HERE) or "contextlib" in name
                or any(s in name for s in skip)):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return None


def _mro_names(obj) -> list[str]:
    return [c.__name__ for c in type(obj).__mro__]


def _unwrap(model):
    """The module inside DDP / FSDP / accelerate / torch.compile wrappers (``.module``, ``._orig_mod``)."""
    for _ in range(4):
        inner = getattr(model, "_orig_mod", None) or (
            model.module if type(model).__name__ in ("DistributedDataParallel", "DataParallel",
                                                     "FullyShardedDataParallel") else None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def _field_tensor(batch, field):
    """The batch's ``field`` (a key of a mapping batch, an index of a tuple batch), else the batch itself."""
    if isinstance(batch, Mapping):
        if isinstance(field, int):
            vals = list(batch.values())
            return vals[field] if field < len(vals) else None
        return batch.get(field)
    if isinstance(batch, (list, tuple)):
        i = field if isinstance(field, int) else 0
        return batch[i] if i < len(batch) else None
    return batch


class Observer:
    """Records the running program's effective settings (see the module docstring).

    ``spec`` is the harness's run spec: ``batch_field`` and ``mask_field``
    say which batch entry holds the inputs and the attention mask.
    """

    def __init__(self, spec: dict):
        self.field = spec.get("batch_field", 0)
        self.mask_field = spec.get("mask_field")
        self.loaders: list[dict] = []
        self._loader_ids: dict[int, int] = {}
        self.optimizers: list[dict] = []
        self._opt_ids: set[int] = set()
        self.schedulers: list[dict] = []
        self.backward_per_step: list[int] = []
        self.batches_per_step: list[int] = []
        self._backward = 0
        self._batches = 0
        self.autocast: dict[tuple, dict] = {}
        self.grad_scaler: dict | None = None
        self.param_dtypes: dict[str, int] = {}
        self.grad_dtypes: dict[str, int] = {}
        self.checkpoint_calls = 0
        self.sdpa_calls = 0
        self.sdpa_backends: dict[str, bool] = {}
        self.batches: list[dict] = []
        self.model: dict | None = None
        self.adapter: dict | None = None
        self.training_arguments: dict | None = None
        self.lightning_trainer: dict | None = None
        self.threads: int | None = None
        self.steps = 0
        self.errors: list[str] = []
        self._handles: list = []
        # the model's own inputs, for a loop that makes its batches without a DataLoader: the first tensor
        # argument of every module call until the first optimizer step (by module), then of the stepped model's
        # calls only (see _saw_forward)
        self.inputs: list[dict] = []
        self._inputs_by_module: dict[int, list[dict]] = {}
        self._input_modules: set[int] | None = None
        self._forward_handle = None

    # ------------------------------------------------------------------ installing

    def install(self) -> None:
        """Install every pass-through wrapper and hook (before the user's script runs)."""
        self._wrap_loaders()
        self._wrap_backward()
        self._wrap_autocast()
        self._wrap_checkpoint_and_sdpa()
        self._wrap_schedulers()
        self._forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(self._saw_forward)
        self._handles.append(register_optimizer_step_pre_hook(self._before_step))
        self._handles.append(register_optimizer_step_post_hook(self._after_step))

    def _wrap_loaders(self) -> None:
        obs = self
        init = _dl._BaseDataLoaderIter.__init__
        nxt = _dl._BaseDataLoaderIter.__next__

        def __init__(it, loader, *a, **kw):  # noqa: N807 - the wrapped method's name
            init(it, loader, *a, **kw)
            try:
                obs._saw_loader(loader)
            except Exception as exc:  # noqa: BLE001 - observing must never break the script
                obs.errors.append(f"loader: {exc}")

        def __next__(it):  # noqa: N807
            batch = nxt(it)
            obs._batches += 1
            if len(obs.batches) < MAX_BATCHES:
                try:
                    obs._saw_batch(batch)
                except Exception as exc:  # noqa: BLE001
                    obs.errors.append(f"batch: {exc}")
            return batch

        _dl._BaseDataLoaderIter.__init__ = __init__
        _dl._BaseDataLoaderIter.__next__ = __next__

    def _saw_loader(self, loader) -> None:
        key = id(loader)
        if key in self._loader_ids:
            self.loaders[self._loader_ids[key]]["iterations"] += 1
            return
        bs = getattr(loader, "batch_size", None)
        bsampler = getattr(loader, "batch_sampler", None)
        if bs is None and bsampler is not None:
            bs = getattr(bsampler, "batch_size", None)
        sampler = getattr(loader, "sampler", None)
        inner = bsampler
        for _ in range(3):  # accelerate wraps the batch sampler: find the index sampler inside
            if inner is None or not hasattr(inner, "sampler") and not hasattr(inner, "batch_sampler"):
                break
            cand = getattr(inner, "sampler", None)
            if cand is not None and not hasattr(cand, "batch_size"):
                sampler = cand
                break
            inner = getattr(inner, "batch_sampler", None) or cand
        ds = getattr(loader, "dataset", None)
        self._loader_ids[key] = len(self.loaders)
        self.loaders.append(dict(
            cls=f"{type(loader).__module__}.{type(loader).__qualname__}", batch_size=_plain(bs),
            num_workers=int(getattr(loader, "num_workers", 0) or 0),
            pin_memory=bool(getattr(loader, "pin_memory", False)),
            prefetch_factor=_plain(getattr(loader, "prefetch_factor", None)),
            persistent_workers=bool(getattr(loader, "persistent_workers", False)),
            drop_last=bool(getattr(loader, "drop_last", False)),
            sampler=type(sampler).__name__ if sampler is not None else None,
            dataset=type(ds).__name__ if ds is not None else None,
            step=self.steps + 1, iterations=1, where=_where_outside(("accelerate", "transformers"))))

    def _saw_batch(self, batch) -> None:
        x = _field_tensor(batch, self.field)
        if not isinstance(x, torch.Tensor):
            self.batches.append(dict(shape=None, dtype=None, step=self.steps + 1))
            return
        row = dict(shape=list(x.shape), dtype=str(x.dtype).replace("torch.", ""), step=self.steps + 1,
                   padded_rows=None)
        mask = _field_tensor(batch, self.mask_field) if self.mask_field and isinstance(batch, Mapping) else None
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            full = mask.sum(dim=1)
            row["padded_rows"] = int((full < mask.shape[1]).sum())
            row["longest"] = int(full.max()) if full.numel() else 0
        elif x.dim() == 2 and x.shape[1] >= 2 and not x.dtype.is_floating_point and x.numel():
            row.update(_trailing_pad(x))
        self.batches.append(row)

    def _saw_forward(self, module, args) -> None:
        """Global forward pre-hook: the shape of the first tensor argument of a module call (never inside a
        graph torch.compile traces: the compiled model's own wrapper is called eagerly and is what counts).

        Before the first optimizer step every module's first calls are kept (the model is not known yet); at
        that step :meth:`_keep_model_inputs` keeps the stepped model's and drops the rest, or removes the hook
        when a DataLoader was iterated (its batches are the record).
        """
        if torch.compiler.is_compiling():
            return None
        key = id(module)
        if self._input_modules is not None and key not in self._input_modules:
            return None
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        rows = self._inputs_by_module.setdefault(key, []) if self._input_modules is None else self.inputs
        if self._input_modules is not None and len(rows) >= MAX_BATCHES:
            self._stop_forward()  # the model's inputs are recorded: no hook left on its calls
            return None
        if x is None or len(rows) >= MAX_BATCHES or (self._input_modules is None
                                                     and len(self._inputs_by_module) > MAX_INPUT_MODULES):
            return None
        try:
            row = dict(shape=list(x.shape), dtype=str(x.dtype).replace("torch.", ""), step=self.steps + 1,
                       padded_rows=None)
            if x.dim() == 2 and x.shape[1] >= 2 and not x.dtype.is_floating_point and x.numel():
                row.update(_trailing_pad(x))
            rows.append(row)
        except Exception as exc:  # noqa: BLE001 - observing must never break the script
            self.errors.append(f"forward input: {exc}")
        return None

    def _keep_model_inputs(self, model_ids: set[int]) -> None:
        """At the first optimizer step: keep the inputs of the stepped model (``model_ids``: it and its
        wrappers, torch.compile's or DDP's, found on the stack), or stop watching module calls when the script
        iterated a DataLoader or no model was found."""
        if self.loaders or not model_ids:
            self._stop_forward()
            return
        self._input_modules = set(model_ids)
        # the outermost of them was called first and eagerly: its rows are the batches
        firsts = [rows for k, rows in self._inputs_by_module.items() if k in model_ids and rows]
        self.inputs = max(firsts, key=len) if firsts else []
        self._inputs_by_module = {}

    def _stop_forward(self) -> None:
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None
        self._inputs_by_module = {}

    def _wrap_backward(self) -> None:
        obs = self
        backward = torch.autograd.backward

        @functools.wraps(backward)
        def counted_backward(*a, **kw):
            obs._backward += 1
            return backward(*a, **kw)

        torch.autograd.backward = counted_backward

    def _wrap_autocast(self) -> None:
        obs = self
        cls = torch.amp.autocast_mode.autocast
        enter = cls.__enter__

        def __enter__(ac):  # noqa: N807
            out = enter(ac)
            if os.path.dirname(os.path.abspath(sys._getframe(1).f_code.co_filename)) == _HERE:
                return out  # entered by the harness's own checks (runners/invariants.py), not the program
            try:
                key = (str(getattr(ac, "device", "")), _plain(getattr(ac, "fast_dtype", None)),
                       bool(getattr(ac, "_enabled", True)))
                seen = obs.autocast.setdefault(key, dict(device_type=key[0], dtype=key[1], enabled=key[2],
                                                         where=_where_outside(()), count=0, training=False,
                                                         first_step=obs.steps + 1))
                seen["count"] += 1
                if torch.is_grad_enabled():  # entered where gradients are recorded: a training forward
                    seen["training"] = True
            except Exception as exc:  # noqa: BLE001
                obs.errors.append(f"autocast: {exc}")
            return out

        cls.__enter__ = __enter__
        scaler_init = torch.amp.GradScaler.__init__

        def scaler(sc, *a, **kw):
            scaler_init(sc, *a, **kw)
            try:
                obs.grad_scaler = dict(cls=type(sc).__name__, enabled=bool(sc.is_enabled()),
                                       where=_where_outside(()))
            except Exception as exc:  # noqa: BLE001
                obs.errors.append(f"GradScaler: {exc}")

        torch.amp.GradScaler.__init__ = scaler

    def _wrap_checkpoint_and_sdpa(self) -> None:
        obs = self
        import torch.utils.checkpoint as ckpt

        checkpoint = ckpt.checkpoint

        @functools.wraps(checkpoint)
        def counted_checkpoint(*a, **kw):
            obs.checkpoint_calls += 1
            return checkpoint(*a, **kw)

        ckpt.checkpoint = counted_checkpoint
        sdpa = torch.nn.functional.scaled_dot_product_attention

        @functools.wraps(sdpa)
        def counted_sdpa(*a, **kw):
            obs.sdpa_calls += 1
            return sdpa(*a, **kw)

        torch.nn.functional.scaled_dot_product_attention = counted_sdpa

    def _wrap_schedulers(self) -> None:
        obs = self
        base = torch.optim.lr_scheduler.LRScheduler
        init = base.__init__

        def __init__(sched, *a, **kw):  # noqa: N807
            # SequentialLR / ChainedScheduler construct children: record only the outermost call's object
            depth = getattr(obs, "_sched_depth", 0)
            obs._sched_depth = depth + 1
            try:
                init(sched, *a, **kw)
            finally:
                obs._sched_depth = depth
            if depth == 0:
                try:
                    obs.schedulers.append(obs._scheduler_record(sched))
                except Exception as exc:  # noqa: BLE001
                    obs.errors.append(f"scheduler: {exc}")

        base.__init__ = __init__

    @staticmethod
    def _scheduler_record(sched) -> dict:
        """Class and warm-up of one LR scheduler (``warmup_steps`` None: the object does not state it)."""
        cls = type(sched).__name__
        out = dict(cls=cls, warmup_steps=None, detail="")
        if cls == "LambdaLR":
            fns = getattr(sched, "lr_lambdas", [])
            fn = fns[0] if fns else None
            kw = getattr(fn, "keywords", None) or {}
            if "num_warmup_steps" in kw:
                out.update(warmup_steps=_plain(kw["num_warmup_steps"]),
                           detail=f"LambdaLR over {getattr(getattr(fn, 'func', None), '__name__', '?')}"
                                  f"(num_warmup_steps={kw['num_warmup_steps']})")
            else:
                out["detail"] = "LambdaLR over a function that does not state its warm-up"
        elif cls == "LinearLR":
            start = float(getattr(sched, "start_factor", 1.0))
            out.update(warmup_steps=int(sched.total_iters) if start < 1.0 else 0,
                       detail=f"LinearLR(start_factor={start}, total_iters={sched.total_iters})")
        elif cls in ("ConstantLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
                     "PolynomialLR", "MultiplicativeLR"):
            out.update(warmup_steps=0, detail=f"{cls} starts at the peak learning rate (no warm-up)")
        else:
            out["detail"] = f"{cls}: its warm-up is not read"
        return out

    # ------------------------------------------------------------------ optimizer steps

    def _before_step(self, optimizer, args, kwargs) -> None:
        try:
            if id(optimizer) not in self._opt_ids:
                self._opt_ids.add(id(optimizer))
                self.optimizers.append(self._optimizer_record(optimizer))
            if self.steps == 0:
                self._first_step(optimizer)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"optimizer: {exc}")

    def _after_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        if len(self.backward_per_step) < MAX_STEPS:
            self.backward_per_step.append(self._backward)
            self.batches_per_step.append(self._batches)
        self._backward = self._batches = 0

    def _optimizer_record(self, opt) -> dict:
        groups = []
        for g in opt.param_groups:
            groups.append(dict(
                lr=_scalar(g.get("initial_lr", g.get("lr"))), lr_now=_scalar(g.get("lr")),
                betas=_list(g.get("betas")), momentum=_scalar(g.get("momentum")),
                weight_decay=_scalar(g.get("weight_decay")), eps=_number(g.get("eps")),
                params=sum(1 for p in g["params"] if isinstance(p, torch.Tensor))))
        g0 = opt.param_groups[0] if opt.param_groups else {}
        cls = type(opt)
        return dict(cls=cls.__name__, module=cls.__module__, groups=groups, fused=_plain(g0.get("fused")),
                    foreach=_plain(g0.get("foreach")), step=self.steps + 1)

    def _first_step(self, optimizer) -> None:
        """At the first optimizer step: threads, parameter and gradient dtypes, the model and trainer objects."""
        self.threads = torch.get_num_threads()
        params = [p for g in optimizer.param_groups for p in g["params"]
                  if isinstance(p, torch.Tensor) and p.requires_grad]
        for p in params:
            k = str(p.dtype).replace("torch.", "")
            self.param_dtypes[k] = self.param_dtypes.get(k, 0) + 1
            if p.grad is not None:
                k = str(p.grad.dtype).replace("torch.", "")
                self.grad_dtypes[k] = self.grad_dtypes.get(k, 0) + 1
        if torch.cuda.is_available():
            for name in ("flash", "mem_efficient", "math", "cudnn"):
                fn = getattr(torch.backends.cuda, f"{name}_sdp_enabled", None)
                if fn is not None:
                    self.sdpa_backends[name] = bool(fn())
        self._scan_frames(params[0] if params else None)

    def _scan_frames(self, first_param) -> None:
        """The model holding ``first_param`` and any TrainingArguments / Lightning Trainer on the call stack."""
        models: list = []
        f = sys._getframe(1)
        for _ in range(MAX_FRAMES):
            if f is None:
                break
            for v in list(f.f_locals.values()):
                self._consider(v, models)
                for attr in ("model", "args", "trainer"):  # a Trainer's own objects (``self.model``, ``self.args``)
                    if hasattr(type(v), "__dict__") and attr in getattr(v, "__dict__", {}):
                        self._consider(v.__dict__[attr], models)
            f = f.f_back
        best, best_n = None, -1
        for m in models:
            m = _unwrap(m)
            if first_param is not None and not any(p is first_param for p in m.parameters()):
                continue
            n = sum(1 for _ in m.parameters())
            if n > best_n:
                best, best_n = m, n
        if best is not None:
            self.model, self.adapter = self._model_record(best)
        self._keep_model_inputs({id(m) for m in models if best is not None and _unwrap(m) is best})

    def _consider(self, v, models: list) -> None:
        if isinstance(v, torch.nn.Module):
            if not any(v is m for m in models):
                models.append(v)
            return
        names = _mro_names(v)
        if self.training_arguments is None and "TrainingArguments" in names:
            self.training_arguments = {k: _plain(getattr(v, k)) for k in TRAINING_ARGUMENTS if hasattr(v, k)}
            self.training_arguments["cls"] = type(v).__name__
        elif self.lightning_trainer is None and "Trainer" in names and (
                type(v).__module__.startswith(("lightning", "pytorch_lightning"))):
            rec = {}
            for k in LIGHTNING_TRAINER:
                try:
                    rec[k] = _plain(getattr(v, k))
                except Exception:  # noqa: BLE001 - a property that needs state the trainer lacks
                    continue
            self.lightning_trainer = rec

    @staticmethod
    def _model_record(model) -> tuple[dict, dict | None]:
        cfg = getattr(model, "config", None)
        gc_flag = getattr(model, "is_gradient_checkpointing", None)
        if not isinstance(gc_flag, bool):
            gc_flag = any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
        rec = dict(cls=f"{type(model).__module__}.{type(model).__qualname__}",
                   name_or_path=_plain(getattr(cfg, "_name_or_path", None) or getattr(cfg, "name_or_path", None))
                   if cfg is not None else None,
                   attn_implementation=_plain(getattr(cfg, "_attn_implementation", None)) if cfg is not None
                   else None,
                   config_class=type(cfg).__name__ if cfg is not None else None,
                   gradient_checkpointing=bool(gc_flag),
                   attention_modules=sum(1 for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)))
        adapter = None
        pc = getattr(model, "peft_config", None)
        if isinstance(pc, Mapping) and pc:
            name = getattr(model, "active_adapter", None)
            name = name if isinstance(name, str) and name in pc else next(iter(pc))
            a = pc[name]
            adapter = dict(name=name, peft_type=_plain(getattr(a, "peft_type", None)), r=_plain(getattr(a, "r", None)),
                           lora_alpha=_plain(getattr(a, "lora_alpha", None)),
                           target_modules=_plain(getattr(a, "target_modules", None)))
        return rec, adapter

    # ------------------------------------------------------------------ the record

    def record(self) -> dict:
        """The run's observed settings (plain JSON; :class:`~goblin_assets.runners.result.ObservedRecord`), its
        hooks removed (the end of the run)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._stop_forward()
        return self.snapshot()

    def snapshot(self) -> dict:
        """The settings observed so far, the hooks left in place (the harness writes it after each warm-up
        step, so a run that then fails or hangs still has its record)."""
        return dict(
            loaders=self.loaders, optimizers=self.optimizers, schedulers=self.schedulers,
            backward_per_step=self.backward_per_step, batches_per_step=self.batches_per_step,
            autocast=list(self.autocast.values()), grad_scaler=self.grad_scaler,
            param_dtypes=self.param_dtypes, grad_dtypes=self.grad_dtypes,
            checkpoint_calls=self.checkpoint_calls, sdpa_calls=self.sdpa_calls, sdpa_backends=self.sdpa_backends,
            batches=self.batches, inputs=self.inputs, model=self.model, adapter=self.adapter,
            training_arguments=self.training_arguments, lightning_trainer=self.lightning_trainer,
            threads=self.threads, steps=self.steps, errors=self.errors[:20],
            most_common_backward=collections.Counter(self.backward_per_step[1:] or self.backward_per_step)
            .most_common(1)[0][0] if self.backward_per_step else None)


def _trailing_pad(x: torch.Tensor) -> dict:
    """Padding of a token batch without an attention mask: rows that end in a run of at least two of the
    same id, that id being the one most such rows end with (the pad id), with at least three such positions
    in the batch (a single row ending in two equal ids is chance).  ``{}`` when no row does (no
    padding is seen); else ``padded_rows``, ``longest`` (the widest row without its pad run), ``pad_id``
    and ``pad_from`` (how it was told)."""
    ends = x[:, -1]
    runs = ends[ends == x[:, -2]]
    if not runs.numel():
        return {}
    pad = int(torch.mode(runs).values)
    is_pad = x == pad
    # length of each row's trailing run of the pad id
    trail = torch.flip(is_pad.int(), dims=[1]).cumprod(dim=1).sum(dim=1)
    padded = trail >= 2
    if int(trail[padded].sum()) < 3:  # one row ending in two equal ids is chance (1 in vocab), not padding
        return {}
    longest = int((x.shape[1] - torch.where(padded, trail, torch.zeros_like(trail))).max())
    return dict(padded_rows=int(padded.sum()), longest=longest, pad_id=pad,
                pad_from="trailing runs of one id (no attention mask)")
