"""The memory of one training step, term by term, each with its provenance; what fits, and which levers help.

A step's peak tensor memory is the sum of

=====================  =====================================================================================
term                   what it counts
=====================  =====================================================================================
weights                every parameter, by dtype (frozen ones too: a LoRA base, frozen layers)
gradients              trainable parameters only, at their own dtype
optimizer state        Adam/AdamW: 2 states per trainable element (fp32: 8 B; 8-bit: 2 B); SGD with momentum: 1;
                       paged variants keep the same bytes in host memory (0 on the device)
fp32 master copies     4 B per trainable element when 16-bit weights are trained with fp32 masters
                       (mixed precision that stores the model in 16-bit); 0 under autocast (fp32 weights)
batch                  the micro-batch's input tensors
activations            saved for backward: measured per sample (two small-batch probes, slope) or from the
                       model's dimensions; times the micro-batch
step transients        batch-independent buffers inside the step (the probes' intercept: gradient buffers
                       re-allocated every step, GEMM workspaces, temporaries)
other live tensors     buffers and tensors the script keeps (dataset tensors, caches)
fragmentation          reserved minus allocated, only where a device snapshot shows it
=====================  =====================================================================================

Sources: optimizer state per element from the optimizers' own definitions
(``torch.optim.Adam``/``SGD`` docs: ``exp_avg`` + ``exp_avg_sq``;
``momentum_buffer``) and bitsandbytes' 8-bit optimizers (Dettmers et al.,
"8-bit Optimizers via Block-wise Quantization", ICLR 2022: 1 byte per state);
the weights + gradients + Adam total is the one ``accelerate estimate-memory``
computes (``accelerate/commands/estimate.py``, ``estimate_training_usage``);
sharding by world size from ZeRO (Rajbhandari et al., "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC'20: stage 1
shards optimizer state, 2 also gradients, 3 also weights; FSDP FULL_SHARD is
stage 3, SHARD_GRAD_OP stage 2); activations from dimensions with and without
checkpointing from Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models" (2022), eq. 1: ``s*b*h*(34 + 5*a*s/h)`` bytes per
layer at 16-bit, and ``2*s*b*h`` per layer with full recomputation.
docs/sources.md, "Memory model (issue 26)".

Bytes throughout (GB = 1e9 in texts, as RunMetrics).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from goblin_assets.errors import GoblinError

#: Optimizer states per trainable element and the bytes of each, by optimizer name (HF ``optim`` names and
#: torch classes).  ``device`` False: a paged optimizer keeps its states in host memory when pressed.
OPTIMIZER_STATES: dict[str, tuple[int, int, bool]] = {
    "adamw": (2, 4, True), "adam": (2, 4, True), "adamw_torch": (2, 4, True), "adamw_torch_fused": (2, 4, True),
    "adamw_hf": (2, 4, True), "adamw_8bit": (2, 1, True), "adamw_bnb_8bit": (2, 1, True),
    "paged_adamw": (2, 4, False), "paged_adamw_32bit": (2, 4, False), "paged_adamw_8bit": (2, 1, False),
    "adafactor": (1, 4, True), "sgd_momentum": (1, 4, True), "sgd": (0, 4, True), "adagrad": (1, 4, True),
    "rmsprop": (1, 4, True), "lion": (1, 4, True), "lion_8bit": (1, 1, True),
}
#: torch optimizer classes as the harness names them -> the key above.
_CLASSES = {"Adam": "adam", "AdamW": "adamw", "SGD": "sgd_momentum", "Adagrad": "adagrad", "RMSprop": "rmsprop",
            "Adafactor": "adafactor", "AdamW8bit": "adamw_8bit", "PagedAdamW8bit": "paged_adamw_8bit",
            "PagedAdamW": "paged_adamw", "PagedAdamW32bit": "paged_adamw_32bit", "Lion": "lion"}
#: ZeRO stage -> which terms are divided by the world size.
ZERO_SHARDS: dict[int, tuple[str, ...]] = {1: ("optimizer_state",), 2: ("optimizer_state", "gradients"),
                                           3: ("optimizer_state", "gradients", "weights")}


class MemoryModelError(GoblinError):
    """A memory model cannot be built from what was given (names the missing fact)."""


@dataclass
class Term:
    """One term of the step's memory: ``bytes`` (None: undetermined), ``provenance`` (measured / estimated /
    modelled / not_observable / undetermined) and ``basis``, how it was obtained."""

    name: str
    bytes: float | None
    provenance: str
    basis: str
    per_sample: bool = False  # scales with the micro-batch


@dataclass
class StepMemory:
    """The terms of one configuration's step.  ``micro_batch`` samples per device and micro-step,
    ``grad_accum`` micro-steps per optimizer step, ``world_size`` data-parallel ranks."""

    terms: list[Term]
    micro_batch: int
    grad_accum: int = 1
    world_size: int = 1

    @property
    def peak_bytes(self) -> float | None:
        """Sum of the determined terms (None when a per-sample term is undetermined)."""
        if any(t.bytes is None and t.per_sample for t in self.terms):
            return None
        return float(sum(t.bytes or 0.0 for t in self.terms))

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {"micro_batch": self.micro_batch, "grad_accum": self.grad_accum, "world_size": self.world_size,
                "global_batch": self.global_batch, "peak_bytes": self.peak_bytes,
                "terms": [asdict(t) for t in self.terms]}


@dataclass
class Facts:
    """What a memory model is built from (bytes; element counts).

    ``params_bytes_by_dtype`` and ``trainable_params`` / ``trainable_param_bytes``
    come from a probe's tensor census (measured) or a model's parameters;
    ``optimizer`` is a key of :data:`OPTIMIZER_STATES`; ``activation_per_sample``
    and ``step_transient`` the slope and intercept of the probes' in-step peak
    (None: not measured); ``batch_bytes_per_sample``; ``other_bytes``;
    ``master_fp32``: 16-bit weights trained with fp32 master copies;
    ``layers``/``hidden``/``heads``/``seq_len``: a transformer's dimensions when known;
    ``factored_state_elements``: Adafactor's second-moment elements for the trainable parameters (the
    census's ``adafactor_state_elements``; None: unknown, one state per element is assumed).
    """

    params_bytes_by_dtype: dict[str, float]
    trainable_params: int
    trainable_param_bytes: float
    optimizer: str | None
    micro_batch: int
    grad_accum: int = 1
    activation_per_sample: float | None = None
    step_transient: float | None = None
    batch_bytes_per_sample: float = 0.0
    other_bytes: float = 0.0
    optimizer_state_measured: float | None = None
    grads_measured: float | None = None
    master_fp32: bool = False
    lora_rank: int | None = None
    seq_len: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    checkpointing: bool = False
    source: str = "measured"
    notes: list[str] = field(default_factory=list)
    factored_state_elements: int | None = None


def optimizer_key(name: str | None) -> str | None:
    """The :data:`OPTIMIZER_STATES` key of an optimizer name or class (``torch.optim.sgd.SGD`` -> sgd_momentum);
    None when unknown."""
    if not name:
        return None
    short = name.rsplit(".", 1)[-1]
    if short in _CLASSES:
        return _CLASSES[short]
    low = name.lower()
    return low if low in OPTIMIZER_STATES else None


def optimizer_state_bytes(trainable_params: int, optimizer: str | None, world_size: int = 1,
                          zero_stage: int = 0, factored_elements: int | None = None) -> tuple[float | None, str]:
    """Device bytes of the optimizer state for ``trainable_params`` elements, and the basis; None if unknown.

    Adafactor with ``factored_elements`` known keeps 4 B for each of them (its factored second moment, no
    first moment: Shazeer and Stern 2018; ``memory_probe.factored_elements``); without it, one state per
    element (the unfactored upper bound).
    """
    key = optimizer_key(optimizer)
    if key is None:
        return None, f"optimizer {optimizer!r}: its state per element is undetermined"
    n, size, on_device = OPTIMIZER_STATES[key]
    b = float(trainable_params * n * size) if on_device else 0.0
    basis = f"{key}: {n} state(s) x {size} B per trainable element"
    if key == "adafactor" and factored_elements is not None:
        b = float(factored_elements * size)
        basis = (f"adafactor: factored second moment, {factored_elements:,} elements x {size} B (a row and a column "
                 "vector per matrix, no first moment)")
    elif key == "adafactor":
        basis += " (an upper bound: the factoring of matrices is not known here)"
    if zero_stage >= 1:
        b /= world_size
    where = "" if on_device else " (paged: kept in host memory, 0 on the device)"
    return b, basis + where


def activations_from_dims(f: Facts, micro_batch: int, checkpointing: bool) -> tuple[float | None, str]:
    """Activation bytes of a transformer from its dimensions (Korthikanti et al. 2022, eq. 1), else None.

    ``s*b*h*(34 + 5*a*s/h)`` bytes per layer at 16-bit (doubled for fp32
    weights), ``2*s*b*h`` per layer (x2 for fp32) with full recomputation.
    """
    if not (f.layers and f.hidden and f.heads and f.seq_len):
        return None, "the model's layers, hidden size, heads and sequence length are not all known"
    s, h, a, b = f.seq_len, f.hidden, f.heads, micro_batch
    scale = 2.0 if "float32" in f.params_bytes_by_dtype and not f.master_fp32 else 1.0
    per_layer = 2 * s * b * h if checkpointing else s * b * h * (34 + 5 * a * s / h)
    return (f.layers * per_layer * scale,
            f"Korthikanti et al. 2022: {f.layers} layers x {'2sbh' if checkpointing else 'sbh(34+5as/h)'}"
            f"{' x2 (fp32)' if scale == 2 else ''}, s={s}, h={h}, a={a}, b={b}")


def step_memory(f: Facts, micro_batch: int | None = None, grad_accum: int | None = None, world_size: int = 1,
                zero_stage: int = 0, optimizer: str | None = None, checkpointing: bool | None = None,
                lora_rank: int | None = None, seq_len: int | None = None) -> StepMemory:
    """The step's terms for ``f`` with the given changes (None: as configured).

    Levers: ``micro_batch`` / ``grad_accum`` (activations and batch scale with
    the micro-batch), ``optimizer`` (its state per element), ``zero_stage``
    with ``world_size`` (ZERO_SHARDS), ``checkpointing`` (activations from
    dimensions; undetermined without them), ``lora_rank`` (trainable elements
    scale with the rank), ``seq_len`` (activations scale at least linearly:
    the measured per-sample value times the ratio, a lower bound when
    attention scores grow with its square).
    """
    mb = micro_batch or f.micro_batch
    ga = grad_accum or f.grad_accum
    opt = optimizer or f.optimizer
    ckpt = f.checkpointing if checkpointing is None else checkpointing
    trainable, trainable_bytes = f.trainable_params, f.trainable_param_bytes
    if lora_rank and f.lora_rank and lora_rank != f.lora_rank:
        # LoRA adds r*(d_in + d_out) elements per adapted matrix: linear in r (Hu et al. 2021, LoRA)
        trainable = int(trainable * lora_rank / f.lora_rank)
        trainable_bytes *= lora_rank / f.lora_rank
    weights = float(sum(f.params_bytes_by_dtype.values())) + (trainable_bytes - f.trainable_param_bytes)
    src = f.source
    by_dtype = ", ".join(f"{d} {b / 1e6:.2f} MB" for d, b in sorted(f.params_bytes_by_dtype.items()))
    terms = [Term("weights", weights, src, f"parameters by dtype: {by_dtype}")]
    grads = trainable_bytes
    terms.append(Term("gradients", grads, src if f.grads_measured is None or lora_rank is None else "modelled",
                      f"trainable parameters only: {trainable:,} elements"))
    factored = f.factored_state_elements
    if factored is not None and lora_rank and f.lora_rank:
        factored = int(factored * lora_rank / f.lora_rank)
    state, basis = optimizer_state_bytes(trainable, opt, world_size, zero_stage, factored)
    prov = "modelled"
    if (f.optimizer_state_measured is not None and opt == f.optimizer and not lora_rank and not zero_stage):
        state, prov, basis = f.optimizer_state_measured, src, basis + " (as the probe counted)"
    terms.append(Term("optimizer_state", state, prov if state is not None else "undetermined", basis))
    terms.append(Term("fp32_master_copies", 4.0 * trainable if f.master_fp32 else 0.0, "modelled",
                      "4 B per trainable element (16-bit weights, fp32 masters)" if f.master_fp32 else
                      "none: the trained weights are fp32 (autocast keeps no master copy)"))
    terms.append(Term("batch", f.batch_bytes_per_sample * mb, src, f"{f.batch_bytes_per_sample:,.0f} B per sample",
                      per_sample=True))
    act, act_basis, act_prov = None, "", "undetermined"
    if ckpt != f.checkpointing or (f.activation_per_sample is None):
        act, act_basis = activations_from_dims(f, mb, ckpt)
        act_prov = "estimated" if act is not None else "undetermined"
    else:
        act = f.activation_per_sample * mb
        act_prov, act_basis = src, f"{f.activation_per_sample / 1e6:.3f} MB per sample x {mb}"
    if act is not None and seq_len and f.seq_len and seq_len != f.seq_len:
        act *= seq_len / f.seq_len
        act_basis += f"; x {seq_len}/{f.seq_len} for the sequence length (a lower bound: attention grows with s^2)"
        act_prov = "estimated"
    terms.append(Term("activations", act, act_prov, act_basis, per_sample=True))
    terms.append(Term("step_transients", f.step_transient, src if f.step_transient is not None else "undetermined",
                      "batch-independent buffers inside the step (probes' intercept)"))
    terms.append(Term("other_live_tensors", f.other_bytes, src, "buffers and tensors the script keeps"))
    for t in terms:
        if zero_stage and t.bytes is not None and t.name in ZERO_SHARDS.get(zero_stage, ()) and t.name != \
                "optimizer_state":
            t.bytes /= world_size
            t.basis += f"; / {world_size} ranks (ZeRO stage {zero_stage})"
    return StepMemory(terms, mb, ga, world_size)


def _fits(m: StepMemory, budget: float) -> bool:
    return m.peak_bytes is not None and m.peak_bytes <= budget


def levers(f: Facts, budget: float, world_sizes: tuple[int, ...] = (2, 4, 8),
           installed_8bit: bool = True) -> list[dict[str, Any]]:
    """The changes that bring the step under ``budget`` bytes, each with its predicted peak; global batch kept.

    Tried, each alone: the micro-batch halved (and halved again, while it is
    >= 1) with the accumulation doubled; gradient checkpointing; each
    lower-state optimizer (8-bit ones only when ``installed_8bit``); a LoRA
    rank half the configured one; ZeRO stages 1-3 over ``world_sizes``, the
    accumulation (else the micro-batch) divided by the world size when it
    divides, so the global batch stays (each lever's ``global_batch`` says
    when it cannot).  A lever whose prediction is undetermined is listed
    with ``fits`` None.
    """
    out: list[dict[str, Any]] = []

    def add(name: str, change: dict[str, Any], m: StepMemory) -> None:
        out.append({"lever": name, "change": change, "peak_bytes": m.peak_bytes,
                    "fits": None if m.peak_bytes is None else m.peak_bytes <= budget,
                    "global_batch": m.global_batch})

    mb, ga = f.micro_batch, f.grad_accum
    k = 1
    while mb // (2 ** k) >= 1:
        new_mb = mb // 2 ** k
        if mb % new_mb == 0:
            m = step_memory(f, micro_batch=new_mb, grad_accum=ga * (mb // new_mb))
            add("micro_batch", {"batch_size": new_mb, "grad_accum_steps": ga * (mb // new_mb)}, m)
            if _fits(m, budget):
                break
        k += 1
    if not f.checkpointing:
        add("gradient_checkpointing", {"gradient_checkpointing": True}, step_memory(f, checkpointing=True))
    for opt in ("sgd", "adafactor", "adamw_8bit", "paged_adamw_8bit"):
        cur = optimizer_key(f.optimizer)
        if cur is None or opt == cur or ("8bit" in opt and not installed_8bit):
            continue
        if OPTIMIZER_STATES[opt][0] * OPTIMIZER_STATES[opt][1] < OPTIMIZER_STATES[cur][0] * OPTIMIZER_STATES[cur][1] \
                or not OPTIMIZER_STATES[opt][2]:
            add("optimizer", {"optimizer": opt}, step_memory(f, optimizer=opt))
    if f.lora_rank and f.lora_rank > 1:
        add("lora_rank", {"lora_rank": f.lora_rank // 2}, step_memory(f, lora_rank=f.lora_rank // 2))
    if f.seq_len and f.seq_len > 16:
        add("seq_len", {"seq_len": f.seq_len // 2}, step_memory(f, seq_len=f.seq_len // 2))
    for n in world_sizes:
        # n data-parallel ranks multiply the global batch by n: the accumulation (else the micro-batch) is
        # divided by n to keep it, when it divides; otherwise the lever changes the global batch and says so
        keep: dict[str, int] = {}
        if ga % n == 0:
            keep = {"grad_accum_steps": ga // n}
        elif mb % n == 0:
            keep = {"batch_size": mb // n}
        for stage in (1, 2, 3):
            add(f"zero_stage_{stage}", {"world_size": n, "zero_stage": stage, **keep},
                step_memory(f, micro_batch=keep.get("batch_size"), grad_accum=keep.get("grad_accum_steps"),
                            world_size=n, zero_stage=stage))
    return out


def fit_answer(f: Facts, budget: float | None, budget_basis: str, **lever_kw: Any) -> dict[str, Any]:
    """Whether the configured step fits ``budget`` bytes, by how much, and the levers that bring it under.

    Returns ``{"fits", "peak_bytes", "budget_bytes", "budget_basis", "margin_bytes" (budget - peak; negative:
    over), "step": StepMemory.as_dict(), "levers": [...]}``; ``fits`` None when the peak or the budget is
    undetermined.
    """
    m = step_memory(f)
    peak = m.peak_bytes
    fits = None if peak is None or budget is None else peak <= budget
    out = {"fits": fits, "peak_bytes": peak, "budget_bytes": budget, "budget_basis": budget_basis,
           "margin_bytes": None if fits is None else budget - peak, "step": m.as_dict(), "notes": list(f.notes)}
    out["levers"] = levers(f, budget, **lever_kw) if budget is not None else []
    return out


def smallest_fitting_micro_batch(f: Facts, budget: float) -> tuple[int, int] | None:
    """The largest divisor of the micro-batch (halving) that fits ``budget``, and the accumulation that keeps the
    global batch: ``(micro_batch, grad_accum)``; None when even one sample does not fit or the peak is
    undetermined."""
    mb = f.micro_batch
    d = 1
    while mb // d >= 1:
        if mb % d == 0:
            m = step_memory(f, micro_batch=mb // d, grad_accum=f.grad_accum * d)
            if m.peak_bytes is None:
                return None
            if m.peak_bytes <= budget:
                return mb // d, f.grad_accum * d
        d *= 2
    return None


def size_gb(b: float | None) -> str:
    """``b`` bytes in decimal units (``1.234 GB``, ``12.35 MB``, ``3.4 kB``; 1e9 / 1e6 / 1e3), or ``undetermined``."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return "undetermined"
    for unit, scale, digits in (("GB", 1e9, 3), ("MB", 1e6, 2), ("kB", 1e3, 1)):
        if abs(b) >= scale:
            return f"{b / scale:.{digits}f} {unit}"
    return f"{b:.0f} B"


def module_facts(module: Any, optimizer: str, micro_batch: int = 1, grad_accum: int = 1) -> Facts:
    """Facts of a ``torch.nn.Module`` from its parameters alone (no run): weights by dtype, trainable
    elements by ``requires_grad``; activations undetermined.  Works on a model built on the ``meta``
    device (nothing allocated).  Buffers count as other live tensors."""
    by_dtype: dict[str, float] = {}
    trainable = trainable_bytes = 0
    for p in module.parameters():
        d = str(p.dtype).removeprefix("torch.")
        by_dtype[d] = by_dtype.get(d, 0.0) + p.numel() * p.element_size()
        if p.requires_grad:
            trainable += p.numel()
            trainable_bytes += p.numel() * p.element_size()
    buffers = float(sum(b.numel() * b.element_size() for b in module.buffers()))
    return Facts(params_bytes_by_dtype=by_dtype, trainable_params=trainable, trainable_param_bytes=trainable_bytes,
                 optimizer=optimizer, micro_batch=micro_batch, grad_accum=grad_accum, other_bytes=buffers,
                 source="modelled")
