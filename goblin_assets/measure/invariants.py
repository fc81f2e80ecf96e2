"""Judge the run-time invariants of a training step: the harness's raw records -> cited findings.

The child harness records raw measurements in the user's process
(:mod:`goblin_assets.runners.invariants`, ``result.json`` ``invariants``);
here each check becomes one :class:`~goblin_assets.contracts.Invariant`:
``fired`` with its evidence (module, tensor, parameter or step), ``silent``,
or ``not_observable`` with the reason.  Rules read ``invariants.<id>``
(:data:`CHECKS`); the report lists the fired and not-observable ones.

Thresholds and their sources (docs/sources.md):

* numerics: a module's normwise relative error against a float64 reference
  above ``2 u sqrt(K)`` (``u`` the unit roundoff of the output dtype,
  ``finfo.eps / 2``; ``K`` the inner dimension), the probabilistic rounding
  error bound of an inner product of length K (Higham & Mary, "A New Approach
  to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019),
  or more than 1 % of outputs exactly zero where the reference holds a value
  the dtype represents as a normal number (a flush the dtype does not explain).
* gradients: more than 1 % of non-zero gradient values below the smallest
  normal of the compute dtype (they are subnormal or flush to zero in it: the
  reason for loss scaling, Micikevicius et al., "Mixed Precision Training",
  ICLR 2018); a trainable parameter whose gradient is all zeros at the checked
  step and that never changed over the run.
* updates: update-to-weight ratio below 1e-7 with a learning rate above 0, or
  more than half of the sampled elements with a non-zero gradient not moving
  (a healthy ratio is about 1e-3: CS231n, "Neural Networks Part 3", ratio of
  weights:updates); trainable parameters that never changed.
* optimizer state: 16-bit parameters with no fp32 copy, or 16-bit state
  (updates smaller than half an ulp of the weight are lost: Micikevicius et al.
  2018, fp32 master copy of weights).
* loss: no decrease over at least 8 steps at >= 90 % of the run's peak
  learning rate (least-squares slope >= 0 and the last third's mean not below
  the first third's).
* labels: every row's last attended token masked (-100: ``ignore_index`` of
  ``torch.nn.CrossEntropyLoss``) so the end-of-sequence token is never a
  target; all attended positions ignored.
* threads: ranks x (intra-op threads + DataLoader workers) above the cores;
  several ranks on a node each allowed on every CPU (no binding); the run's
  own process using >= 90 % of the cores (PyTorch CPU threading notes).
* DataLoader workers started more than once (``persistent_workers=False``
  restarts them every epoch: torch.utils.data docs).
* per-shape cost: steps that see a new batch shape take longer than steps
  that repeat one by at least 50 % and 5 ms, over at least two of each
  (autotuning and recompiles are paid per new shape: torch.compile docs,
  ``dynamic``; cuDNN benchmark mode).
* warnings that name their remedy: a warning text that tells which argument
  to set (``set `X=Y```, ``pass X=Y``, ``use X=Y``) to a value; patchable when
  X is a ConfigDict field a patch writer can carry.
"""
from __future__ import annotations

import math
import re
import statistics
from typing import Any

from goblin_assets.contracts import CONFIG_FIELDS, Invariant

#: Every check (``invariants.<id>``), what its value counts, and the rules it feeds.
CHECKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "numerics_vs_reference": ("modules whose output (forward) or gradients (backward) differ from a float64 "
                              "reference beyond the dtype's error",
                              ("correctness.numerics_vs_reference",)),
    "grad_below_normal": ("share of non-zero gradient values below the compute dtype's smallest normal",
                          ("correctness.grad_underflow_without_scaling",)),
    "grad_all_zero": ("trainable parameters whose gradient is all zeros at the checked step",
                      ("correctness.grads_all_zero",)),
    "update_too_small": ("update-to-weight ratio below 1e-7 (or most updates lost) with a learning rate above 0",
                         ("correctness.updates_lost",)),
    "params_never_change": ("trainable parameters whose values never changed over the run",
                            ("correctness.params_never_change",)),
    "optimizer_state_low_precision": ("16-bit parameters without an fp32 master copy, or 16-bit optimizer state",
                                      ("correctness.low_precision_master_weights",)),
    "loss_not_decreasing": ("optimizer steps over which the loss did not decrease",
                            ("correctness.loss_not_decreasing",)),
    "eos_never_target": ("rows whose last attended token (end of sequence) is masked from the loss",
                         ("correctness.eos_masked_as_pad",)),
    "labels_all_ignored": ("share of attended label positions ignored (-100)", ("correctness.labels_all_ignored",)),
    "threads_oversubscribed": ("ranks x (intra-op threads + loader workers) over the cores",
                               ("topology.run_threads_oversubscribed",)),
    "ranks_share_cores": ("ranks on the node each allowed on every CPU", ("topology.bind_ranks_to_cores",)),
    "cores_busy": ("share of the cores the run's own process kept busy over the profiled steps",
                   ("data.async_loading_on_gpu (premise: does not fire when busy)",)),
    "worker_restarts": ("DataLoader worker starts after the first", ("data.persistent_workers",)),
    "per_shape_cost": ("seconds a step pays when a new input shape appears", ("data.pad_to_fixed_shapes",)),
    "warning_remedy": ("warnings that name an argument to set and its value", ("config.warning_states_its_remedy",)),
}

_REMEDY = re.compile(r"\b(?:set|pass|use|setting|passing)\s+[`'\"]?([A-Za-z_][\w.]*)[`'\"]?\s*(?:=|to)\s*"
                     r"[`'\"]?([\w.\-]+)[`'\"]?", re.IGNORECASE)
#: Warning-text argument names that are another name of a ConfigDict field.
_ALIASES = {"num_workers": "dataloader_workers", "dataloader_num_workers": "dataloader_workers",
            "attn_implementation": "attention_impl", "torch_dtype": "precision",
            "gradient_accumulation_steps": "grad_accum_steps", "per_device_train_batch_size": "batch_size"}


#: Unit roundoff u = 2^-p of IEEE 754 binary formats and bfloat16 (p: significand bits incl. the implicit one).
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def unit_roundoff(dtype: str) -> float:
    """``u`` of a dtype named like ``torch.float16`` (:data:`UNIT_ROUNDOFF`; float32's for other names)."""
    return UNIT_ROUNDOFF.get(str(dtype).removeprefix("torch."), UNIT_ROUNDOFF["float32"])


def numerics_tolerance(dtype: str, inner_dim: int) -> float:
    """Normwise relative error a dtype explains for an inner dimension K: ``2 u sqrt(K)``, at least ``4 u``.

    Source: Higham & Mary (2019), probabilistic bound ~ sqrt(K) u for an inner product of length K.
    """
    u = unit_roundoff(dtype)
    return max(4 * u, 2 * u * math.sqrt(max(1, int(inner_dim))))


def _inv(cid: str, status: str, value: float | None = None, **kw: Any) -> Invariant:
    meaning, rules = CHECKS[cid]
    return Invariant(id=cid, status=status, value=value if status != "silent" else 0.0,
                     unit=kw.pop("unit", meaning), rules=list(rules), **kw)


def _numerics(raw: dict) -> Invariant:
    rows = [r for r in raw.get("numerics") or [] if "rel_err" in r]
    if not rows and raw.get("numerics_window_too_early"):
        return _inv("numerics_vs_reference", "not_observable",
                    message="one warm-up step: the forward capture waits for a step that ran once before (it holds "
                            "copies of each module's inputs, which must not be what runs the program out of memory)")
    if not rows:
        return _inv("numerics_vs_reference", "not_observable",
                    message="no leaf module's forward could be recomputed in float64 on the CPU")
    bad = []
    for r in rows:
        tol = numerics_tolerance(r["dtype"], r.get("inner_dim", 1))
        if r["rel_err"] > tol or r.get("flushed_share", 0.0) > 0.01:
            bad.append({**r, "tolerance": tol})
    step = raw.get("window_step")
    ev = {"modules_compared": len(rows), "modules_skipped": raw.get("numerics_skipped", 0),
          "backward_compared": sum(1 for r in rows if r.get("pass") == "backward"),
          "worst": max(rows, key=lambda r: r["rel_err"] / numerics_tolerance(r["dtype"], r.get("inner_dim", 1)))}
    thr = "2 u sqrt(K) (Higham & Mary 2019) or >1% outputs flushed to zero"
    if not bad:
        return _inv("numerics_vs_reference", "silent", evidence=ev, threshold=thr, step=step)
    b = bad[0]
    return _inv("numerics_vs_reference", "fired", len(bad), severity="error", step=step, threshold=thr,
                where=f"module {b['module']} ({b['class']}, {b['dtype']} on {b['device']})",
                message=(f"{len(bad)} module pass(es) differ from a float64 reference beyond what {b['dtype']} "
                         f"explains: {b['module']} {b.get('pass', 'forward')} relative error {b['rel_err']:.3g} > "
                         f"{b['tolerance']:.3g}, {b.get('flushed_share', 0):.1%} of "
                         f"{'gradients' if b.get('pass') == 'backward' else 'outputs'} flushed to zero"),
                evidence={**ev, "modules": bad[:10]})


def _grads(raw: dict) -> list[Invariant]:
    groups = raw.get("grads") or []
    step = raw.get("window_step")
    if not groups:
        why = "no optimizer step with gradients was checked"
        return [_inv("grad_below_normal", "not_observable", message=why),
                _inv("grad_all_zero", "not_observable", message=why)]
    out = []
    worst = max(groups, key=lambda g: g.get("below_normal_share") or 0.0)
    share = worst.get("below_normal_share") or 0.0
    thr = "> 1% of non-zero gradients below finfo(compute dtype).tiny (Micikevicius et al. 2018)"
    out.append(_inv("grad_below_normal", "fired" if share > 0.01 else "silent", share, severity="warning",
                    step=step, threshold=thr, unit="share of gradient values",
                    where=f"optimizer {worst['optimizer']}, param group {worst['group']}",
                    message=f"{share:.1%} of gradient values are below the smallest normal of "
                            f"{worst['compute_dtype']} (they underflow in it)" if share > 0.01 else "",
                    evidence={"groups": groups}))
    # an all-zero gradient at one step can be by design (LoRA's A while B is still zero): a finding only for
    # the parameters that also never changed over the run
    still = set(raw.get("unchanged_params") or [])
    zero = [p for p in raw.get("zero_grad_params") or [] if p in still]
    out.append(_inv("grad_all_zero", "fired" if zero else "silent", len(zero), severity="warning", step=step,
                    where=f"parameter {zero[0]}" if zero else "", threshold="a trainable tensor's gradient all zeros",
                    message=f"{len(zero)} trainable parameter(s) got an all-zero gradient at step {step}: "
                            f"{', '.join(zero[:3])}" if zero else "", evidence={"params": zero}))
    return out


def _updates(raw: dict) -> list[Invariant]:
    ups = [u for u in raw.get("update") or [] if u.get("update_ratio") is not None]
    step = raw.get("window_step")
    out = []
    if not ups:
        out.append(_inv("update_too_small", "not_observable", message="no optimizer update was sampled"))
    else:
        bad = [u for u in ups if u["lr"] > 0 and (u["update_ratio"] < 1e-7 or (u.get("lost_share") or 0) > 0.5)]
        b = bad[0] if bad else min(ups, key=lambda u: u["update_ratio"])
        out.append(_inv("update_too_small", "fired" if bad else "silent", len(bad), severity="error",
                        step=step, unit="parameter groups whose update is lost",
                        where=f"param group {b['group']} (lr {b['lr']:.3g})",
                        threshold="ratio < 1e-7 or > 50% of updates lost (healthy ~1e-3: CS231n)",
                        message=f"update-to-weight ratio {b['update_ratio']:.3g} and {b.get('lost_share') or 0:.0%} of "
                                "non-zero-gradient elements did not move: the update is lost" if bad else "",
                        evidence={"groups": ups}))
    same = list(raw.get("unchanged_params") or [])
    checked = raw.get("trainable_checked", 0)
    if not checked or raw.get("steps", 0) < 2:
        out.append(_inv("params_never_change", "not_observable", message="fewer than two optimizer steps"))
    else:
        out.append(_inv("params_never_change", "fired" if same else "silent", len(same), severity="error",
                        where=f"parameter {same[0]}" if same else "", step=raw.get("steps"),
                        threshold="a trainable tensor identical before the first and after the last step",
                        message=f"{len(same)} of {checked} trainable parameters never changed over "
                                f"{raw.get('steps')} steps: {', '.join(same[:3])}" if same else "",
                        evidence={"params": same, "checked": checked}))
    return out


def _optimizer(raw: dict) -> Invariant:
    opts = raw.get("optimizer") or []
    if not opts:
        return _inv("optimizer_state_low_precision", "not_observable", message="no optimizer step was inspected")
    for o in opts:
        p16 = [d for d in o["param_dtypes"] if d in ("torch.float16", "torch.bfloat16")]
        s16 = {k: v for k, v in o["state_dtypes"].items() if {"torch.float16", "torch.bfloat16"} & set(v)}
        if (p16 and not o["master_copy"]) or s16:
            what = (f"parameters in {', '.join(p16)} with no fp32 master copy" if p16 and not o["master_copy"]
                    else "") + (f"; state {', '.join(s16)} in 16 bits" if s16 else "")
            return _inv("optimizer_state_low_precision", "fired", 1.0, severity="warning",
                        where=f"optimizer {o['optimizer']}", step=raw.get("window_step"),
                        threshold="16-bit weights need an fp32 master copy (Micikevicius et al. 2018)",
                        message=f"{o['optimizer']}: {what.strip('; ')}: updates below half an ulp of a weight are lost",
                        evidence=o)
    return _inv("optimizer_state_low_precision", "silent", evidence={"optimizers": opts})


def _loss(losses: list, lrs: list[float]) -> Invariant:
    # only the steps at >= 90 % of the run's peak learning rate: during a warm-up the loss need not move
    peak = max(lrs, default=0.0)
    start = next((i for i, lr in enumerate(lrs) if lr >= 0.9 * peak), 0) if peak > 0 else 0
    vals = [v for v in losses[start:] if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(vals) < 8:
        why = f"{len(vals)} finite losses at >= 90% of the peak learning rate (needs 8)"
        return _inv("loss_not_decreasing", "not_observable", message=why + (
            f"; the learning rate was warming up until step {start + 1}" if start else ""))
    n = len(vals)
    xm = (n - 1) / 2
    ym = statistics.fmean(vals)
    slope = sum((i - xm) * (v - ym) for i, v in enumerate(vals)) / sum((i - xm) ** 2 for i in range(n))
    k = max(1, n // 3)
    first, last = statistics.fmean(vals[:k]), statistics.fmean(vals[-k:])
    bad = slope >= 0 and last >= first
    return _inv("loss_not_decreasing", "fired" if bad else "silent", n, severity="warning", where="loss",
                step=n, threshold="least-squares slope >= 0 and last third's mean >= first third's",
                message=f"the loss did not decrease over {n} steps ({first:.4g} -> {last:.4g}, slope {slope:.3g}/step)"
                if bad else "", evidence={"first_third_mean": first, "last_third_mean": last, "slope": slope})


def _labels(raw: dict) -> list[Invariant]:
    st = raw.get("labels") or {}
    if not st.get("batches"):
        why = "no batch with token-level labels (a 'labels' field of two or more dimensions)"
        return [_inv("eos_never_target", "not_observable", message=why),
                _inv("labels_all_ignored", "not_observable", message=why)]
    out = []
    if st.get("rows"):
        bad = st["rows_last_masked"] == st["rows"] and st["attended_ignored"] < st["attended"]
        out.append(_inv("eos_never_target", "fired" if bad else "silent", st["rows_last_masked"], severity="error",
                        where=f"labels of {st['batches']} batches", threshold="every row's last attended token is -100",
                        message=f"in all {st['rows']} rows the last attended token (end of sequence) is masked: "
                                "the model never learns to stop (pad token == eos token?)" if bad else "",
                        evidence=st))
    else:
        out.append(_inv("eos_never_target", "not_observable", message="no attention_mask beside the labels"))
    share = st["ignored"] / st["positions"] if st["positions"] else 0.0
    att = st["attended_ignored"] / st["attended"] if st.get("attended") else share
    out.append(_inv("labels_all_ignored", "fired" if att >= 1.0 else "silent", att, severity="error",
                    where=f"labels of {st['batches']} batches", threshold="every attended label position is -100",
                    message="every label position is ignored (-100): the loss has no target" if att >= 1.0 else "",
                    evidence={**st, "ignored_share": share}))
    return out


def _threads(raw: dict, cores: int | None, online: int | None) -> list[Invariant]:
    th = raw.get("threads") or {}
    if not th or not cores:
        why = "threads or cores not recorded"
        return [_inv(c, "not_observable", message=why) for c in ("threads_oversubscribed", "ranks_share_cores",
                                                                 "cores_busy")]
    lws = int(th.get("local_world_size") or 1)
    # one process's intra-op threads count up to the cores (torch's default is one per CPU it may use;
    # more than the cores is topology.threads_exceed_pinned_cpus): ranks and loader workers add to them
    demand = lws * (min(int(th.get("intra_op") or 1), cores) + int(th.get("dataloader_workers") or 0))
    over = demand > cores
    out = [_inv("threads_oversubscribed", "fired" if over else "silent", demand / cores, severity="warning",
                unit="threads per core", where=f"{lws} rank(s) x ({th.get('intra_op')} intra-op threads + "
                f"{th.get('dataloader_workers')} loader workers)", threshold="more threads than cores",
                message=f"{demand} threads on {cores} cores: they time-share and every op waits for stragglers"
                if over else "", evidence={**th, "cores": cores})]
    if lws > 1:
        shared = th.get("affinity_cpus") is not None and online is not None and th["affinity_cpus"] >= online
        out.append(_inv("ranks_share_cores", "fired" if shared else "silent", lws, severity="warning",
                        where=f"{lws} ranks", threshold="each rank allowed on every CPU of the node",
                        message=f"{lws} ranks on this node may each run on all {online} CPUs: no binding"
                        if shared else "", evidence=th))
    else:
        out.append(_inv("ranks_share_cores", "not_observable", message="one rank on this node"))
    if th.get("wall_s"):
        share = th.get("process_cpu_s", 0.0) / th["wall_s"] / cores
        out.append(_inv("cores_busy", "fired" if share >= 0.9 else "silent", share, severity="info",
                        unit="share of the cores", where="the run's process over the profiled steps",
                        threshold=">= 90% of the cores busy with the run's own threads",
                        message=f"the run already keeps {share:.0%} of {cores} cores busy: more threads or workers "
                                "would time-share them" if share >= 0.9 else "",
                        evidence={"process_cpu_s": th.get("process_cpu_s"), "wall_s": th["wall_s"],
                                  "host_busy_share (all processes, not hermetic)": th.get("host_busy_share")}))
    else:
        out.append(_inv("cores_busy", "not_observable", message="no profiled steps"))
    return out


def _workers(raw: dict) -> Invariant:
    ws = raw.get("workers") or []
    th = raw.get("threads") or {}
    if not ws:
        return _inv("worker_restarts", "not_observable" if not th.get("dataloader_workers") else "silent",
                    message="no DataLoader with worker processes" if not th.get("dataloader_workers") else "")
    again = ws[1:]
    cost = sum(w.get("startup_s") or 0.0 for w in again)
    return _inv("worker_restarts", "fired" if again else "silent", len(again), severity="warning",
                where=f"DataLoader workers started at steps {', '.join(str(w['step']) for w in ws)}",
                step=again[0]["step"] if again else None, unit="restarts",
                threshold="workers started more than once (persistent_workers=False)",
                message=f"DataLoader workers ({ws[0]['workers']}) were started {len(ws)} times; "
                        f"the restarts cost {cost:.3f} s" if again else "",
                evidence={"starts": ws, "restart_cost_s": cost})


def _shapes(raw: dict) -> Invariant:
    shapes, times = raw.get("shapes") or [], raw.get("step_times_s") or []
    seen: set[str] = set()
    new, old = [], []
    for i, (s, t) in enumerate(zip(shapes, times)):
        if i > 0 and s:  # step 1 pays every first-time cost
            (old if s in seen else new).append((i + 1, t, s))
        seen.add(s)
    if len(new) < 2 or len(old) < 2:
        return _inv("per_shape_cost", "not_observable" if len(seen) > 1 or not shapes else "silent",
                    message="" if len(seen) <= 1 and shapes else f"{len(new)} new-shape and {len(old)} repeat steps "
                    "(needs two of each)", evidence={"distinct_shapes": len(seen)})
    tn, to = statistics.median(t for _, t, _ in new), statistics.median(t for _, t, _ in old)
    extra = tn - to
    bad = tn > 1.5 * to and extra > 0.005
    return _inv("per_shape_cost", "fired" if bad else "silent", extra, severity="warning", unit="s per new shape",
                where=f"steps {', '.join(str(s) for s, _, _ in new[:5])} (new shapes)", step=new[0][0],
                threshold="new-shape steps >= 1.5x and 5 ms slower than repeat-shape steps",
                message=f"{len(new)} steps with a new input shape took {tn * 1e3:.1f} ms against {to * 1e3:.1f} ms "
                        f"for repeated shapes: {extra * 1e3:.1f} ms per new shape" if bad else "",
                evidence={"distinct_shapes": len(seen), "new_shape_steps": [(s, t, sh) for s, t, sh in new[:10]],
                          "median_new_s": tn, "median_repeat_s": to})


#: Warnings that state the value of a lever in their own words: (pattern, lever); group 1 is the value.
_REMEDY_SENTENCES = (
    # torch.utils.data.DataLoader (check_worker_number_rationality)
    (re.compile(r"suggested max number of worker in current system is (\d+)"), "num_workers"),
)


def warning_remedies(texts: list[tuple[str, str]]) -> list[dict]:
    """Remedies named in warning texts: ``[{"lever", "value", "field", "patchable", "where", "text"}]``.

    ``texts`` are ``(where, message)`` pairs; ``field`` is the ConfigDict field the lever names
    (None when it names none), ``patchable`` whether it does.
    """
    out = []
    for where, text in texts:
        found = [(m.group(1).split(".")[-1], m.group(2).rstrip(".")) for m in _REMEDY.finditer(text)]
        found += [(lever, m.group(1)) for pat, lever in _REMEDY_SENTENCES for m in pat.finditer(text)]
        for lever, value in found:
            field = _ALIASES.get(lever, lever if lever in CONFIG_FIELDS else None)
            out.append({"lever": lever, "value": value, "field": field, "patchable": field in CONFIG_FIELDS,
                        "where": where, "text": text[:300]})
    return out


def _remedy(result: Any, stderr_tail: str) -> Invariant:
    texts = [(w.where, w.message) for w in getattr(result, "python_warnings", []) or []]
    texts += [("stderr", ln.strip()) for ln in (stderr_tail or "").splitlines() if "warn" in ln.lower()]
    found = warning_remedies(texts)
    patch = [r for r in found if r["patchable"]]
    if not patch:
        return _inv("warning_remedy", "silent", evidence={"remedies_not_patchable": found[:10]})
    r = patch[0]
    return _inv("warning_remedy", "fired", len(patch), severity="info", where=r["where"], unit="patchable remedies",
                threshold="a warning that names an argument and its value",
                message=f"a warning names its remedy: set {r['field']}={r['value']} ({r['text'][:120]})",
                evidence={"remedies": patch[:10]})


def remedy_check(stderr_tail: str) -> Invariant:
    """The ``warning_remedy`` check alone, on a run's stderr (a run that failed or hung before the harness
    judged its checks: its warnings are still in what it printed)."""
    return _remedy(None, stderr_tail)


def warned_values(invariants: list[Invariant] | None) -> dict[str, Any]:
    """``warned.<field>`` of detect conditions and ``warned_<field>`` of fix expressions: the value a warning
    of the run names for a ConfigDict field (the ``warning_remedy`` check's patchable remedies, the first per
    field), converted as the parser converts the field's value (config/fields.py ``PY_NAME_CONVERTERS``:
    ``"2"`` -> 2).  A remedy whose value does not convert, or whose field has no converter, is left out;
    {} when the check did not fire."""
    from goblin_assets.config.fields import PY_NAME_CONVERTERS
    from goblin_assets.config.mapping import convert

    inv = next((i for i in invariants or [] if i.id == "warning_remedy" and i.status == "fired"), None)
    out: dict[str, Any] = {}
    for r in (inv.evidence.get("remedies") or []) if inv is not None else []:
        field, conv = r.get("field"), PY_NAME_CONVERTERS.get(r.get("field") or "")
        if field in out or conv is None:
            continue
        try:
            value, _ = convert(conv, r.get("value"))
        except (KeyError, TypeError, ValueError):
            continue
        if value is not None:
            out[field] = value
    return out


def judge(result: Any, stderr_tail: str = "", cores: int | None = None,
          online_cpus: int | None = None) -> list[Invariant]:
    """Every check of :data:`CHECKS` on one child run (``result``: a HarnessResult with ``invariants``).

    ``cores``: the CPUs the job may use (host facts), ``online_cpus``: the node's.  Returns [] when the run
    recorded no invariants (a benchmark or sketch run).
    """
    raw = getattr(result, "invariants", None)
    if not raw:
        return []
    out = [_numerics(raw), *_grads(raw), *_updates(raw), _optimizer(raw),
           _loss(list(getattr(result, "losses", []) or []), list(raw.get("lrs") or [])), *_labels(raw),
           *_threads(raw, cores, online_cpus), _workers(raw), _shapes(raw), _remedy(result, stderr_tail)]
    return out


def invariant_values(invariants: list[Invariant] | None) -> dict[str, float]:
    """``invariants.<id>`` of detect conditions: each observed check's value (0 when silent); the
    not-observable and unrecorded ones are absent, so a condition on them does not hold."""
    return {i.id: float(i.value or 0.0) for i in invariants or [] if i.status != "not_observable"}
