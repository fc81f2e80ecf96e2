"""Will it fit?  The memory model of a workload's step, from two small-batch probes, against a memory budget.

``goblin fit`` and the out-of-memory fix of an audit (:func:`oom_fix`) both
start here.  The configured run is never started: the workload runs for a
few optimizer steps at two small micro-batches (``PROBE_BATCHES``, written
into a copy of the user's file as a what-if), under the profiler, as a memory
probe (:mod:`goblin_assets.runners.memory_probe`).  Each probe gives the
live tensors by role when its warm-up ended (weights by dtype, trainable and
frozen, gradients, optimizer state, batch) and the profiler's in-step peak
over the step's start (``[memory]`` events on the CPU;
``max_memory_allocated`` minus the allocation after the optimizer step on
CUDA/ROCm).  The in-step peak is a line in the micro-batch: its slope is the
activation memory per sample, its intercept the batch-independent step
transients; :mod:`goblin_assets.measure.memory_model` adds the terms and
tries the levers.

The budget: ``--device NAME`` takes the part's memory from the device table
(:mod:`goblin_assets.runners.devices`, sources there); a CPU run under the
runner's address-space cap (``GOBLIN_RUNNER_MEM_CAP_GB``) has the cap minus
what the probe's address space holds besides tensors (libraries, thread
arenas); a CPU run without a cap the machine's memory.
"""
from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from goblin_assets.errors import GoblinError
from goblin_assets.kb.rules import version_at_least
from goblin_assets.measure.memory_model import Facts, fit_answer, optimizer_key, size_gb, step_memory
from goblin_assets.runners.devices import lookup
from goblin_assets.runners.result import RawRun
from goblin_assets.runners.trace import read_trace

if TYPE_CHECKING:
    from goblin_assets.audit.session import AuditSession

#: Micro-batches of the two probes (the configured batch is never run by ``goblin fit``).
PROBE_BATCHES: tuple[int, int] = (2, 4)
#: Steps of a probe: one unprofiled (the census is taken when it ends), then profiled ones.
PROBE_WARMUP, PROBE_STEPS = 1, 2
#: Share of the budget the OOM fix's split may fill by the model: the line through two small probes under-predicted
#: docstring_lm_oom's peak at micro-batch 32 by 20 % (benchmarks/fit_accuracy.py, docs/measured_facts.md).
FIX_BUDGET_SHARE = 0.8
#: The KB rule that says which bitsandbytes releases support ROCm officially.
BNB_ROCM_RULE = "optimizer.bnb_before_official_rocm_support"
BNB_ROCM_MIN = "0.50"


class FitError(GoblinError):
    """A workload's memory cannot be modelled (names the workload and the missing fact or failed probe)."""


@dataclass
class Probe:
    """One probe run: its micro-batch, the census at the end of its warm-up, the in-step peak over the start."""

    micro_batch: int
    raw: RawRun
    census: dict[str, Any]
    in_step_bytes: float
    basis: str


def in_step_peak(raw: RawRun) -> tuple[float, str]:
    """Peak over start of a measured step, bytes (the largest over the profiled steps after the first).

    CUDA/ROCm: ``mem_peak_gb - mem_static_gb`` (max allocated since the
    measured steps began minus the least allocated after an optimizer step).
    CPU: the profiler's ``[memory]`` events (``TraceSummary.alloc_step_bytes``).
    Raises FitError when the run measured neither.
    """
    r = raw.result
    if r is None:
        raise FitError(f"the run wrote no results ({raw.failure})")
    if r.device == "cuda" and r.mem_peak_gb is not None and r.mem_static_gb is not None:
        return (r.mem_peak_gb - r.mem_static_gb) * 1e9, "torch.cuda max_memory_allocated - allocated after the step"
    if not r.trace:
        raise FitError("the run has no trace: it was not profiled")
    steps = [v for _, v in sorted(read_trace(r.trace).alloc_step_bytes.items())]
    steps = steps[1:] if len(steps) > 1 else steps
    if not steps:
        raise FitError("the trace has no allocator [memory] events")
    return max(pk - st for st, pk in steps), "torch.profiler [memory] events, peak - start of step (max over steps)"


def measured_peak(raw: RawRun) -> tuple[float, str]:
    """Measured peak tensor memory of a profiled run's step, bytes, and how.

    CUDA/ROCm: ``max_memory_allocated``.  CPU: the live tensors when the
    warm-up ended (the harness's census) plus the in-step peak over the
    step's start (:func:`in_step_peak`).
    """
    r = raw.result
    if r is not None and r.device == "cuda" and r.mem_peak_gb is not None:
        return r.mem_peak_gb * 1e9, "torch.cuda.max_memory_allocated"
    census = (r.memory or {}).get("census") if r is not None else None
    if not census:
        raise FitError("the run has no tensor census (a benchmark-mode run?)")
    delta, how = in_step_peak(raw)
    return census["total_tensor_bytes"] + delta, f"live tensors at the step boundary (gc census) + {how}"


def probe_runner(runner: Any) -> Any:
    """The runner the probes run under: ``runner`` itself, or a copy whose address-space cap is lifted to the
    machine's physical memory when the cap is lower.  A probe measures the step's memory and the cap is the
    budget it is compared against (:func:`budget`): under the cap, a workload whose weights, gradients and
    optimizer state alone do not fit would leave nothing to measure (``goblin fit`` could not say by how
    much it does not fit).  A device's memory is never lifted."""
    import copy

    cap = getattr(runner, "mem_cap_gb", None)
    physical_gib = psutil.virtual_memory().total / 1024**3
    if cap is None or cap >= physical_gib:
        return runner
    lifted = copy.copy(runner)
    lifted.mem_cap_gb = physical_gib
    return lifted


def probes(session: AuditSession, batches: tuple[int, ...] = PROBE_BATCHES) -> list[Probe]:
    """Run ``session``'s workload at each micro-batch of ``batches`` as a memory probe (profile mode, a few
    steps; the copies are written first, then the probes run side by side, under :func:`probe_runner`)."""
    cfg_batch = session.training_config().batch_size
    variants = [session.what_if({"batch_size": b}) if b != cfg_batch else session for b in batches]

    def run(vb: tuple[AuditSession, int]) -> RawRun:
        v, b = vb
        from goblin_assets.runners.memory_probe import PROBE_ENV  # harness-side module: imports torch

        return probe_runner(v.runner).run(v.workload, "profile", steps=PROBE_STEPS, warmup=PROBE_WARMUP,
                                          env={PROBE_ENV: "1"}, label=f"fit-b{b}")

    with ThreadPoolExecutor(max_workers=len(batches)) as pool:
        raws = list(pool.map(run, zip(variants, batches)))
    out = []
    for b, raw in zip(batches, raws):
        if not raw.ok:
            raise FitError(f"{session.workload.name}: the probe at micro-batch {b} failed: {raw.failure}")
        census = (raw.result.memory or {}).get("census")
        if not census:
            raise FitError(f"{session.workload.name}: the probe at micro-batch {b} took no tensor census")
        delta, how = in_step_peak(raw)
        out.append(Probe(b, raw, census, delta, how))
    return out


def facts_from_probes(session: AuditSession, small: Probe, large: Probe) -> Facts:
    """The memory model's facts: the larger probe's census, the slope and intercept of the two in-step peaks."""
    cfg = session.training_config()
    if cfg.batch_size is None:
        raise FitError(f"{session.workload.name}: the micro-batch is undetermined ({cfg.source_file})")
    c = large.census
    span = large.micro_batch - small.micro_batch
    slope = max(0.0, (large.in_step_bytes - small.in_step_bytes) / span)
    intercept = max(0.0, small.in_step_bytes - slope * small.micro_batch)
    opt = optimizer_key((c.get("optimizer_classes") or [None])[0]) or optimizer_key(cfg.optimizer)
    if opt == "sgd_momentum" and c.get("optimizer_state_bytes") == 0:
        opt = "sgd"  # SGD without momentum keeps no state
    notes = [f"probes at micro-batches {small.micro_batch} and {large.micro_batch}: in-step peak "
             f"{size_gb(small.in_step_bytes)} and {size_gb(large.in_step_bytes)} ({large.basis})"]
    saved = (large.raw.result.memory or {}).get("saved_activation_bytes_by_step") or []
    if saved:
        notes.append(f"autograd saved {size_gb(statistics.median(saved))} for backward per step at micro-batch "
                     f"{large.micro_batch} (saved-tensor hooks)")
    return Facts(
        params_bytes_by_dtype={k: float(v) for k, v in c["params_bytes_by_dtype"].items()},
        trainable_params=int(c["trainable_params"]), trainable_param_bytes=float(c["trainable_param_bytes"]),
        optimizer=opt, micro_batch=int(cfg.batch_size), grad_accum=int(cfg.grad_accum_steps or 1),
        activation_per_sample=slope, step_transient=intercept,
        batch_bytes_per_sample=c["batch_bytes"] / large.micro_batch, other_bytes=float(c["other_tensor_bytes"]),
        optimizer_state_measured=float(c["optimizer_state_bytes"]), grads_measured=float(c["grads_bytes"]),
        master_fp32=False, lora_rank=cfg.lora_rank, seq_len=cfg.seq_len,
        checkpointing=bool(cfg.gradient_checkpointing), source="measured", notes=notes,
        factored_state_elements=c.get("adafactor_state_elements"))


def budget(session: AuditSession, device: str | None, large: Probe | None) -> tuple[float | None, str]:
    """The bytes a step's tensors may use, and where the figure comes from."""
    if device:
        part = lookup(device)
        if part is None:
            raise FitError(f"--device {device}: not a part in the device table (runners/devices.py)")
        return part.memory_gb * 1e9, (f"{part.name} memory, {part.memory_gb:g} GB (device table, "
                                      "runners/devices.py; the runtime's own reservation not counted)")
    cap_gb = getattr(session.runner, "mem_cap_gb", None)
    r = large.raw.result if large is not None else None
    if r is not None and r.device == "cuda" and r.mem_total_gb:
        return r.mem_total_gb * 1e9, "the device's memory as torch.cuda.mem_get_info reports it (measured)"
    if cap_gb:
        cap = cap_gb * 1024**3
        c = large.census if large is not None else {}
        vm = c.get("address_space_bytes")
        if vm is None:
            return cap, f"the runner's address-space cap, {cap_gb:g} GiB (mem_cap_gb; overhead not observable)"
        overhead = vm - c["total_tensor_bytes"]
        return cap - overhead, (f"the runner's address-space cap of {size_gb(cap)} (mem_cap_gb={cap_gb:g}) minus "
                                f"{size_gb(overhead)} of address space that is not tensors (libraries, thread "
                                "arenas: the probe's VmSize minus its live tensors; measured)")
    return float(psutil.virtual_memory().total), "this machine's physical memory (psutil; no address-space cap)"


def _installed_8bit(session: AuditSession, device: str | None) -> tuple[bool, str | None]:
    """Whether an 8-bit optimizer is a lever here: bitsandbytes installed, and on ROCm a release the KB allows."""
    bnb = session.packages().get("bitsandbytes")
    if not bnb:
        return False, "8-bit and paged optimizers need bitsandbytes, which is not installed"
    part = lookup(device) if device else None
    if part is not None and part.arch.startswith("gfx") and not version_at_least(bnb, BNB_ROCM_MIN):
        rule = session.rules().by_id.get(BNB_ROCM_RULE)
        cite = f" ({rule.citation.title}, {rule.citation.url})" if rule else ""
        return False, (f"bitsandbytes {bnb} predates official ROCm support ({BNB_ROCM_MIN}): KB rule "
                       f"{BNB_ROCM_RULE}{cite}")
    return True, None


def memory_fit(session: AuditSession, device: str | None = None) -> dict[str, Any]:
    """Whether ``session``'s configured step fits, by how much, and the levers, from two probes.

    Returns :func:`~goblin_assets.measure.memory_model.fit_answer`'s dict
    plus ``workload``, ``device`` and ``probes`` (micro-batch, in-step peak
    bytes, run folder).  Raises FitError (a probe failed, the micro-batch is
    undetermined) naming the workload.
    """
    if session.replay:
        raise FitError(f"{session.workload.name}: a recording, not a runnable script: nothing to probe")
    if device and lookup(device) is None:
        raise FitError(f"--device {device}: not a part in the device table (runners/devices.py)")
    cfg = session.training_config()
    if cfg.batch_size is None:
        raise FitError(f"{session.workload.name}: the micro-batch is undetermined in {cfg.source_file}")
    small, large = probes(session)
    facts = facts_from_probes(session, small, large)
    limit, basis = budget(session, device, large)
    ok8, why8 = _installed_8bit(session, device)
    if why8:
        facts.notes.append(f"8-bit/paged optimizer levers left out: {why8}")
    out = fit_answer(facts, limit, basis, installed_8bit=ok8)
    out.update(workload=session.workload.name, device=device or (large.raw.result.device if large.raw.result
                                                                 else None),
               probes=[{"micro_batch": p.micro_batch, "in_step_peak_bytes": p.in_step_bytes,
                        "run_dir": str(p.raw.run_dir)} for p in (small, large)])
    session.results["memory_fit_facts"] = facts
    return out


def fit_text(ans: dict[str, Any]) -> str:
    """``goblin fit``'s answer as text: verdict, each term with provenance, the levers that fit."""
    st = ans["step"]
    verdict = {True: "fits", False: "does not fit", None: "undetermined"}[ans["fits"]]
    lines = [f"{ans['workload']}: {verdict}: predicted peak {size_gb(ans['peak_bytes'])} against "
             f"{size_gb(ans['budget_bytes'])} ({ans['budget_basis']})"]
    if ans["margin_bytes"] is not None:
        lines.append(f"  margin: {size_gb(abs(ans['margin_bytes']))} {'free' if ans['margin_bytes'] >= 0 else 'over'}")
    lines.append(f"  micro-batch {st['micro_batch']} x accumulation {st['grad_accum']} x world {st['world_size']} "
                 f"= global batch {st['global_batch']}")
    for t in st["terms"]:
        lines.append(f"  {t['name']:<20} {size_gb(t['bytes']):>16}  {t['provenance']:<12} {t['basis']}")
    good = [lv for lv in ans["levers"] if lv["fits"]]
    if ans["fits"] is False:
        lines.append("levers that bring it under:" if good else "no single lever brings it under")
        for lv in good:
            ch = ", ".join(f"{k}={v}" for k, v in lv["change"].items())
            kept = "kept" if lv["global_batch"] == st["global_batch"] else f"changes from {st['global_batch']}"
            lines.append(f"  {lv['lever']}: {ch} -> {size_gb(lv['peak_bytes'])} (global batch {lv['global_batch']}, "
                         f"{kept})")
    lines += [f"  note: {n}" for n in ans.get("notes", [])]
    return "\n".join(lines)


def _validate(session: AuditSession, change: dict[str, Any], label: str) -> tuple[AuditSession, RawRun, float | None]:
    """Write ``change`` into a what-if copy and run it once under the same runner (the same memory cap) in
    benchmark mode; the copy, its run and its samples/s (None when not observable)."""
    variant = session.what_if(change)
    raw = variant.runner.run(variant.workload, "benchmark", steps=1, warmup=1, label=label)
    sps = None
    if raw.ok and raw.result is not None:
        samples = sum(p.samples for p in raw.result.per_step)
        secs = sum(p.step_time_s for p in raw.result.per_step)
        sps = samples / secs if secs > 0 else None
    return variant, raw, sps


def _split_fix(session: AuditSession) -> dict[str, Any] | None:
    """The micro-batch split the memory model sizes, validated (see :func:`oom_fix`); None, with the reason in
    ``session.not_observable["oom_fix"]``, when the probes fail or no split fits."""
    from goblin_assets.measure.memory_model import smallest_fitting_micro_batch

    if _in_optimizer_step(session):
        session.not_observable["oom_fix"] = (
            "split: the original ran out of memory in its optimizer step, after backward had freed the "
            "activations: a smaller micro-batch does not shrink the weights, gradients or optimizer state")
        return None
    try:
        small, large = probes(session)
        facts = facts_from_probes(session, small, large)
    except FitError as exc:
        session.not_observable["oom_fix"] = str(exc)
        return None
    limit, basis = budget(session, None, large)
    found = smallest_fitting_micro_batch(facts, FIX_BUDGET_SHARE * limit) if limit is not None else None
    if found is None:
        one = step_memory(facts, micro_batch=1, grad_accum=facts.micro_batch * facts.grad_accum)
        session.not_observable["oom_fix"] = (
            "no micro-batch split of the configured batch fits the budget" + (
                f" (micro-batch 1: predicted peak {size_gb(one.peak_bytes)} against {FIX_BUDGET_SHARE:.0%} of "
                f"{size_gb(limit)})" if limit is not None and one.peak_bytes is not None else ""))
        return None
    mb, ga = found
    before = step_memory(facts)
    after = step_memory(facts, micro_batch=mb, grad_accum=ga)
    change = {"batch_size": mb, "grad_accum_steps": ga}
    variant, raw, sps = _validate(session, change, "oom-fix")
    return {"lever": "micro_batch", "rule": OOM_RULES[0], "change": change,
            "global_batch_before": before.global_batch, "global_batch_after": after.global_batch,
            "predicted_peak_bytes_before": before.peak_bytes, "predicted_peak_bytes": after.peak_bytes,
            "budget_bytes": limit, "budget_basis": basis, "diff": variant.whatif_diff, "ok": raw.ok,
            "failure": raw.failure, "samples_per_sec": sps, "run_dir": str(raw.run_dir), "facts_notes": facts.notes,
            "terms_before": before.as_dict()["terms"], "optimizer": facts.optimizer}


def _checkpointing_fix(session: AuditSession, why_not: str) -> dict[str, Any] | None:
    """Gradient checkpointing written into the user's file and validated under the same cap, for when no
    micro-batch split fits or ran (KB rule ``memory.oom_gradient_checkpointing``); the micro-batch and the
    accumulation are kept, so the global batch is.  None (the reason in ``session.not_observable
    ["oom_fix"]``) when checkpointing is already on, the original ran out of memory in its optimizer step
    (the activations are freed by then), or the file has nothing that turns it on.  ``why_not``: why the
    levers tried before it were not the fix."""
    cfg = session.training_config()
    reason = None
    if cfg.gradient_checkpointing is True:
        reason = "gradient checkpointing is already on"
    elif _in_optimizer_step(session):
        reason = "the original ran out of memory in its optimizer step, after backward had freed the activations"
    else:
        variant = session.what_if({"gradient_checkpointing": True})
        if variant is session or not variant.whatif_diff:
            reason = f"{cfg.source_file} has no setting that turns gradient checkpointing on"
    if reason is not None:
        session.not_observable["oom_fix"] = f"checkpointing: {reason}"
        return None
    variant, raw, sps = _validate(session, {"gradient_checkpointing": True}, "oom-fix-checkpointing")
    glob = _global_batch(cfg)
    return {"lever": "gradient_checkpointing", "rule": OOM_RULES[1], "change": {"gradient_checkpointing": True},
            "global_batch_before": glob, "global_batch_after": glob, "why_not_split": why_not,
            "predicted_peak_bytes_before": None, "predicted_peak_bytes": None, "budget_bytes": None,
            "budget_basis": "not predicted: " + why_not, "diff": variant.whatif_diff, "ok": raw.ok,
            "failure": raw.failure, "samples_per_sec": sps, "run_dir": str(raw.run_dir), "facts_notes": [],
            "terms_before": [], "optimizer": cfg.optimizer}


def _global_batch(cfg: Any) -> int | None:
    mb, ga = cfg.batch_size, cfg.grad_accum_steps or 1
    return mb * ga if mb is not None else None


def _in_optimizer_step(session: AuditSession) -> bool:
    """Whether the harness saw the original's failed allocation inside ``optimizer.step()``."""
    return str((session.results.get("oom_state") or {}).get("phase") or "") == "optimizer step"


def lower_memory_optimizers(session: AuditSession, device: str | None = None) -> tuple[list[str], list[str]]:
    """The optimizers (Hugging Face ``optim`` names) with less state per element than the configured one that
    the installed stack can construct, the closest to it first, and why others are left out.

    An 8-bit AdamW (bitsandbytes; on ROCm only a release the KB allows, :func:`_installed_8bit`) keeps Adam's
    update with quantized states, 2 B per element instead of 8 (Dettmers et al., 8-bit Optimizers via
    Block-wise Quantization, ICLR 2022); Adafactor (torch.optim.Adafactor since torch 2.5, or the
    Trainer's own) factors the second moment into a row and a column vector and keeps no first moment
    (Shazeer and Stern, 2018).  Returns ``([], [reason])`` when the configured optimizer is undetermined or
    keeps no more state than they do.
    """
    from goblin_assets.measure.memory_model import OPTIMIZER_STATES

    cur = optimizer_key(session.training_config().optimizer)
    if cur is None:
        return [], [f"the configured optimizer ({session.training_config().optimizer!r}) has no known state size"]
    per_element = OPTIMIZER_STATES[cur][0] * OPTIMIZER_STATES[cur][1]
    out, why = [], []
    ok8, why8 = _installed_8bit(session, device)
    for name, key in (("adamw_bnb_8bit", "adamw_8bit"), ("adafactor", "adafactor")):
        states, nbytes, _ = OPTIMIZER_STATES[key]
        if states * nbytes >= per_element:
            continue
        if key == "adamw_8bit" and not ok8:
            why.append(f"{name}: {why8}")
            continue
        out.append(name)
    if not out and not why:
        why.append(f"the configured optimizer ({cur}) keeps no more state per element than the lower-memory ones")
    return out, why


def _optimizer_fix(session: AuditSession, why_not: str) -> dict[str, Any] | None:
    """A lower-memory optimizer (:func:`lower_memory_optimizers`) written into the user's file and validated
    under the same cap (KB rule ``memory.oom_lower_memory_optimizer``); micro-batch and accumulation kept.
    The first that ran is returned, else the first that failed; None (the reason in ``session.not_observable
    ["oom_fix"]``) when none is installed or none can be written into the file."""
    from goblin_assets.errors import PatchError

    cfg = session.training_config()
    if not why_not and _in_optimizer_step(session):
        why_not = ("the allocation failed inside the optimizer step, after backward had freed the activations: "
                   "a smaller micro-batch or checkpointing cannot help")
    names, reasons = lower_memory_optimizers(session)
    failed = None
    for name in names:
        try:
            variant = session.what_if({"optimizer": name})
        except (PatchError, GoblinError) as exc:
            reasons.append(f"{name}: {exc}")
            continue
        if variant is session or not variant.whatif_diff:
            reasons.append(f"{name}: {cfg.source_file} has no setting that chooses the optimizer")
            continue
        variant, raw, sps = _validate(session, {"optimizer": name}, f"oom-fix-{name}")
        glob = _global_batch(cfg)
        fix = {"lever": "optimizer", "rule": OOM_RULES[2], "change": {"optimizer": name},
               "global_batch_before": glob, "global_batch_after": glob, "why_not_split": why_not,
               "predicted_peak_bytes_before": None, "predicted_peak_bytes": None, "budget_bytes": None,
               "budget_basis": "not predicted: " + (why_not or "validated by running it"),
               "diff": variant.whatif_diff, "ok": raw.ok, "failure": raw.failure, "samples_per_sec": sps,
               "run_dir": str(raw.run_dir), "facts_notes": [], "terms_before": [], "optimizer": cfg.optimizer}
        if raw.ok:
            return fix
        failed = failed or fix
    if failed is None:
        session.not_observable["oom_fix"] = "lower-memory optimizer: " + ("; ".join(reasons) or "none applies")
    return failed


def oom_fix(session: AuditSession) -> dict[str, Any] | None:
    """The fix of an out-of-memory original that keeps its training, validated under the same memory limit.

    The levers, each validated before the next is tried: the memory model's micro-batch split (KB rule
    ``memory.oom_split_micro_batch``: the micro-batch halved, the accumulation doubled, so the global batch
    stays, until the predicted peak fits :data:`FIX_BUDGET_SHARE` of the same budget); gradient
    checkpointing (``memory.oom_gradient_checkpointing``) when the file has a setting for it; a
    lower-memory optimizer the installed stack supports (``memory.oom_lower_memory_optimizer``: an 8-bit
    AdamW, then Adafactor).  When the harness saw the failure inside the optimizer step the optimizer is
    tried first (activations are freed by then; the split and checkpointing cannot help).  Each patched
    copy is written as a what-if and run under the same runner (the same memory cap) in benchmark mode.

    Returns ``{"lever" (micro_batch | gradient_checkpointing | optimizer), "rule", "change",
    "global_batch_before", "global_batch_after", "predicted_peak_bytes" (None: not predicted),
    "budget_bytes", "diff", "ok", "failure", "samples_per_sec", "why_not_split" (why the levers tried
    before it were not the fix), ...}``: the first fix that ran, else the first that failed; None when none
    could be tried (the reasons in ``session.not_observable["oom_fix"]``).
    """
    order = (_split_fix, _checkpointing_fix, _optimizer_fix)
    if _in_optimizer_step(session):
        order = (_optimizer_fix, _split_fix, _checkpointing_fix)
    reasons: list[str] = []
    first_failed = None
    for attempt in order:
        why = "; ".join(reasons)
        fix = attempt(session) if attempt is _split_fix else attempt(session, why)
        if fix is None:
            reasons.append(session.not_observable.pop("oom_fix", f"{attempt.__name__}: not tried"))
            continue
        if fix["ok"]:
            return fix
        first_failed = first_failed or fix
        reasons.append(f"the {fix['lever']} fix failed too ({fix['failure']})")
    session.not_observable["oom_fix"] = "; ".join(reasons)
    return first_failed


def _consumers(state: dict[str, Any] | None) -> list[str]:
    """The largest consumers at the failure, from the harness's census (bytes by role, the largest tensors)."""
    c = (state or {}).get("census")
    if not c:
        return ["not observable: the harness took no census at the failure" + (
            f" ({state['census_note']})" if state and state.get("census_note") else "")]
    roles = [("weights (trainable)", c["trainable_param_bytes"]), ("weights (frozen)", c["frozen_param_bytes"]),
             ("gradients", c["grads_bytes"]), ("optimizer state", c["optimizer_state_bytes"]),
             ("DataLoader batch", c["batch_bytes"]), ("other live tensors (activations a frame holds, buffers)",
                                                      c["other_tensor_bytes"])]
    out = [f"{name}: {size_gb(b)}" for name, b in sorted(roles, key=lambda r: -r[1]) if b]
    if state.get("saved_activation_bytes") is not None:
        out.append(f"saved for backward so far in the step: {size_gb(state['saved_activation_bytes'])}")
    else:
        out.append("activations saved for backward: not observable in this run (autograd holds them; the fix's "
                   "probes measure them per sample)")
    out += [f"largest tensor: {t['role']} {t['shape']} {t['dtype']}, {size_gb(t['bytes'])}" for t in c["largest"][:3]]
    return out


#: The KB rules the out-of-memory fix applies (kb/rocm_rules.yaml): the split, checkpointing, a lower-memory optimizer.
OOM_RULES = ("memory.oom_split_micro_batch", "memory.oom_gradient_checkpointing", "memory.oom_lower_memory_optimizer")


def _cite(rules: dict[str, Any] | None, rid: str) -> str:
    r = (rules or {}).get(rid)
    return f"KB rule `{rid}`" + (f" ({r.citation.title}, \"{r.citation.section}\", {r.citation.url})" if r else "")


def oom_report_lines(state: dict[str, Any] | None, fix: dict[str, Any] | None, why_not: str | None,
                     rules: dict[str, Any] | None = None) -> list[str]:
    """The out-of-memory section of a failure report: where, the largest consumers, the fix and its validation.

    ``rules``: the KB's rules by id (``KnowledgeBase.by_id``), for the citations of :data:`OOM_RULES`.
    """
    s = state or {}
    phase = s.get("phase", "not observable")
    step = s.get("steps_done", 0) + 1 if s else None
    lines = ["## Out of memory", "",
             f"The original ran out of memory in optimizer step {step if step else 'not observable'}, during "
             f"{phase}" + (f", at {s['where']}" if s.get("where") else "") + ".", "",
             "Largest consumers at the failure (live tensors, each storage once):", ""]
    lines += [f"- {c}" for c in _consumers(state)] + [""]
    rss = [r for r in s.get("rss_bytes_by_step") or [] if r is not None]
    if rss:
        lines += ["Resident memory after each optimizer step before the failure: "
                  + ", ".join(size_gb(r) for r in rss[-8:]) + (f"; peak {size_gb(s['peak_rss_bytes'])}"
                                                              if s.get("peak_rss_bytes") else "") + ".", ""]
    elif s.get("peak_rss_bytes"):
        lines += [f"Peak resident memory at the failure: {size_gb(s['peak_rss_bytes'])} (no optimizer step finished "
                  "before it).", ""]
    if s.get("snapshot"):
        lines += [f"Device memory snapshot at the failure: `{s['snapshot']}` (read it with `goblin memory`).", ""]
    if fix is None:
        lines += [f"No fix was validated: {why_not or 'not observable'}. When a micro-batch of one does not fit, "
                  f"gradient checkpointing is the next lever ({_cite(rules, OOM_RULES[1])}): turn it on where your "
                  "model is built.", ""]
        return lines
    ch = ", ".join(f"{k}={v}" for k, v in fix["change"].items())
    lines += ["### The fix (keeps the training you asked for)", ""]
    if fix.get("lever", "micro_batch") == "micro_batch":
        lines += [f"Lower the micro-batch and raise gradient accumulation: {ch}. Global batch before "
                  f"{fix['global_batch_before']}, after {fix['global_batch_after']} ({_cite(rules, OOM_RULES[0])}). "
                  f"The memory model predicts a peak of "
                  f"{size_gb(fix['predicted_peak_bytes'])} (was {size_gb(fix['predicted_peak_bytes_before'])}) "
                  f"against {size_gb(fix['budget_bytes'])} (the split must fit {FIX_BUDGET_SHARE:.0%} of it): "
                  f"{fix['budget_basis']}.", ""]
        lines += ["| term | before | provenance |", "|---|---|---|"]
        lines += [f"| {t['name']} | {size_gb(t['bytes'])} | {t['provenance']} |" for t in fix["terms_before"]]
        lines += [""]
    elif fix["lever"] == "optimizer":
        lines += [f"Use a lower-memory optimizer: {ch} (was {fix['optimizer']}); the micro-batch and the "
                  f"accumulation stay, so the global batch stays {fix['global_batch_before']} "
                  f"({_cite(rules, OOM_RULES[2])}). This changes the update rule: compare the loss curves before "
                  f"you keep it. Not the split or checkpointing: {fix['why_not_split']}.", ""]
    else:
        lines += [f"Turn on gradient checkpointing: {ch}; the micro-batch and the accumulation stay, so the global "
                  f"batch stays {fix['global_batch_before']} ({_cite(rules, OOM_RULES[1])}). No micro-batch split "
                  f"was the fix: {fix['why_not_split']}. Its peak is not predicted (the activations kept under "
                  "checkpointing need the model's layer dimensions); the run below is the evidence.", ""]
    lines += ["```diff", fix["diff"].rstrip(), "```", ""]
    at = f"out of memory at step {step} ({phase})"
    if fix["ok"]:
        sps = f"{fix['samples_per_sec']:.2f} samples/s" if fix["samples_per_sec"] else "throughput not observable"
        lines += [f"**original: {at}; patched: ran, {sps}** (the same runner and memory cap; global batch "
                  f"{fix['global_batch_before']} -> {fix['global_batch_after']}).", ""]
    else:
        lines += [f"**original: {at}; patched: failed too** ({fix['failure']}).", ""]
    return lines
