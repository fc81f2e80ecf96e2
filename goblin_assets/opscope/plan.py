"""Actuation plan: per site, the exploit, the guard that keeps it safe, and a measured A/B.

For every mined finding that has a specialised kernel (table :data:`EXPLOITS`),
the plan gives

* the **exploit** (zero-skipping / sparse GEMM, int8 GEMM, prepacked weights,
  factored matmul, 2:4 sparse GEMM);
* a runtime **guard** predicate on a recorded statistic (``density < 0.5``,
  ``absmax <= calibrated absmax``, weights unchanged) and the guard's
  **stability** across steps: σ of the guarded statistic (stable if
  σ(density) < 0.02, issue 7; the prepack guard is stable only when the
  weight repeats exactly, see :func:`~goblin_assets.opscope.miner.stationarity`;
  other guards: coefficient of variation < 0.05, goblin's choice);
* an **estimated** speedup (1/density for zero-skipping; bytes saved for int8;
  FLOPs saved for a factored matmul);
* a **measured** speedup from an A/B micro-benchmark on this machine at the
  site's real GEMM shape (M, K, N from the sketch rows): the dense
  ``torch.mm`` against the specialised form, each timed with
  ``torch.utils.benchmark.Timer`` (median of repeated blocks, :func:`time_call`;
  sites with the same exploit, shape and parameter share one A/B), with the operand synthesised at the recorded density / value range.

Specialised forms measured (CPU and CUDA unless noted): CSR sparse matmul
(``Tensor.to_sparse_csr`` + ``@``, conversion included, since activations change
every step) and column compaction of all-zero channels when ``chan_maxabs``
shows dead channels; int8 ``torch._int_mm`` with dynamic per-tensor
quantisation of the activation and a pre-quantised weight (quantise, int8 GEMM,
rescale all included) and, on the CPU, torch.ao's dynamically quantised Linear; prepacked weights via oneDNN (``torch.utils.mkldnn``'s
``MkldnnLinear``, CPU) and a factored ``(M,K)@(K,r)@(r,N)`` matmul at the probe's rank for 10% error.  A form the
machine cannot run is reported with ``measured_speedup`` empty and the reason,
never with a made-up number.


The end-to-end A/B of each kept candidate in the real model is
:mod:`goblin_assets.opscope.plan_e2e`.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from goblin_assets.warehouse.tables import columns

#: σ(density) across steps below this: the sparsity guard is stable.  Source: issue 7.
DENSITY_SIGMA_STABLE = 0.02
#: Coefficient of variation below this: other guards (absmax, l1) are stable.  Source: goblin's choice.
CV_STABLE = 0.05
#: Timed blocks per A/B variant, and the shortest block.  Source: goblin's choice.
REPEATS = 7
BLOCK_S = 0.01
#: Intra-op threads of the CPU A/B.  One: on a shared machine both arms otherwise measure
#: OpenMP barrier waits, not the kernels (measured here: a 64x256x256 fp32 mm took 0.18 ms on
#: one thread and 16 ms on two with the load average at 6.8 on 2 cores).  Source: measured.
AB_THREADS = 1



@dataclass
class Timing:
    """Median seconds per call and the per-block times behind it."""

    median_s: float
    times_s: list[float]

    @property
    def repeats(self) -> int:
        return len(self.times_s)


def time_call(fn: Callable[[], object], repeats: int = REPEATS, block_s: float = BLOCK_S,
              threads: int = AB_THREADS) -> Timing:
    """Median time of ``fn()`` over ``repeats`` timed blocks, with ``torch.utils.benchmark.Timer``.

    The number of calls per block is grown (x10) until a block lasts at least
    ``block_s``; each of the ``repeats`` blocks then gives one per-call time
    and the median is reported.  Runs with ``threads`` intra-op threads
    (:data:`AB_THREADS`); CUDA work is synchronised by ``Timer``.

    Units
    -----
    seconds per call.  Source: measured.
    """
    from torch.utils.benchmark import Timer

    fn()
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    number = 1
    while number < 10**6:
        if timer.timeit(number).median * number >= block_s:
            break
        number *= 10
    times = [float(timer.timeit(number).median) for _ in range(repeats)]
    return Timing(float(np.median(times)), times)


def _operand(shape: tuple[int, int], density: float, seed: int, dead_cols: int = 0,
             device: str = "cpu") -> torch.Tensor:
    """A float32 operand with i.i.d. zeros at ``1 - density`` (after zeroing ``dead_cols`` whole columns)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if dead_cols:
        x[:, :dead_cols] = 0.0
        live = shape[1] - dead_cols
        p_keep = min(1.0, density * shape[1] / max(live, 1))
        x[:, dead_cols:] *= (torch.rand(shape[0], live, generator=g) < p_keep)
    else:
        x *= (torch.rand(shape, generator=g) < density)
    return x.to(device)


def ab_sparse(m: int, k: int, n: int, density: float, role: str, dead_share: float = 0.0,
              repeats: int = REPEATS, device: str = "cpu") -> dict:
    """Dense ``mm`` vs CSR sparse matmul (and column compaction when channels are dead) at (M, K, N).

    ``role`` ``lhs``: the (M, K) operand is sparse (converted every call);
    ``rhs``: the (K, N) operand is sparse (converted once, weights).

    Returns
    -------
    dict
        ``dense``, ``special`` (the faster specialised form), ``form``, and each
        form's median seconds and repeat count.
    """
    with warnings.catch_warnings():  # torch warns that CSR support is beta on every conversion
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        if role == "lhs":
            dead = int(round(dead_share * k))
            a, b = _operand((m, k), density, 0, dead, device), torch.randn(k, n, device=device)
            dense = time_call(lambda: torch.mm(a, b), repeats)
            forms = {"csr_incl_conversion": time_call(lambda: a.to_sparse_csr() @ b, repeats)}
            if dead:
                keep = torch.arange(dead, k, device=device)
                bk = b[keep].contiguous()           # the weight rows of dead channels dropped once (prepacked)
                forms["dead_channel_compaction"] = time_call(lambda: torch.mm(a[:, dead:], bk), repeats)
        else:
            a, b = torch.randn(m, k, device=device), _operand((k, n), density, 1, device=device)
            bs = b.t().contiguous().to_sparse_csr()   # converted once: weights are stationary
            dense = time_call(lambda: torch.mm(a, b), repeats)
            forms = {"csr_weight": time_call(lambda: (bs @ a.t()).t(), repeats)}
    best = min(forms, key=lambda f: forms[f].median_s)
    return {"dense": dense, "special": forms[best], "form": best,
            "forms": {f: {"median_s": t.median_s, "repeats": t.repeats} for f, t in forms.items()}}


def quant_int8(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = amax.clamp_min(1e-12) / 127.0
    return torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8), scale


def ab_int8(m: int, k: int, n: int, absmax: float = 1.0, repeats: int = REPEATS, device: str = "cpu") -> dict:
    """fp32 ``mm`` vs int8 GEMM at (M, K, N), quantising the activation on every call.

    Forms: ``int8_int_mm_dynamic`` — ``torch._int_mm`` with the weight
    quantised once per output column (it is stationary), the activation per
    tensor on every call, the int32 result rescaled to fp32; and, on the CPU,
    ``int8_dynamic_quantized_linear`` — torch.ao's dynamically quantised
    ``Linear`` (fbgemm/x86 kernels, per-channel weight, prepacked once).  The
    faster form is the plan's ``special``; each form's relative error against
    the fp32 product is reported.

    Raises
    ------
    RuntimeError
        ``torch._int_mm`` does not support this device/shape (the caller records the reason).
    """
    g = torch.Generator().manual_seed(2)
    a = (torch.randn(m, k, generator=g) * (absmax / 4.0)).to(device)
    b = torch.randn(k, n, generator=g).to(device)
    ref = a @ b
    bq, bscale = quant_int8(b, 0)

    def int_mm_path():
        aq, ascale = quant_int8(a, None)
        return torch._int_mm(aq, bq).float() * (ascale * bscale)

    paths: dict[str, Callable[[], torch.Tensor]] = {"int8_int_mm_dynamic": int_mm_path}
    if device == "cpu":
        with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao (not installed)
            warnings.simplefilter("ignore")
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            lin = torch.nn.Linear(k, n, bias=False)
            with torch.no_grad():
                lin.weight.copy_(b.t())
            qlin = quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear: per_channel_dynamic_qconfig})
        paths["int8_dynamic_quantized_linear"] = lambda: qlin(a)
    dense = time_call(lambda: torch.mm(a, b), repeats)
    forms, errs = {}, {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in paths.items():
            errs[name] = float((fn() - ref).norm() / ref.norm())
            forms[name] = time_call(fn, repeats)
    best = min(forms, key=lambda f: forms[f].median_s)
    return {"dense": dense, "special": forms[best], "form": best,
            "forms": {f: {"median_s": t.median_s, "repeats": t.repeats, "rel_err": errs[f]} for f, t in forms.items()},
            "rel_err": errs[best]}


def ab_prepack(m: int, k: int, n: int, repeats: int = REPEATS) -> dict:
    """``F.linear`` vs a linear whose weight is prepacked once: oneDNN blocked layout, or pre-transposed.

    Both forms are timed; the faster is the plan's ``special`` form.

    Raises
    ------
    RuntimeError
        oneDNN (mkldnn) is not available in this torch build.
    """
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("oneDNN (mkldnn) is not available in this torch build")
    lin = torch.nn.Linear(k, n).eval()
    with warnings.catch_warnings():  # MkldnnLinear is a ScriptModule; torch 2.13 warns that script_method is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.utils.mkldnn import to_mkldnn

        packed = to_mkldnn(torch.nn.Sequential(lin))
    wt, bias = lin.weight.detach().t().contiguous(), lin.bias.detach()
    x = torch.randn(m, k)
    with torch.no_grad():
        dense = time_call(lambda: lin(x), repeats)
        forms = {"onednn_prepacked_linear": time_call(lambda: packed(x), repeats),
                 "pretransposed_addmm": time_call(lambda: torch.addmm(bias, x, wt), repeats)}
    best = min(forms, key=lambda f: forms[f].median_s)
    return {"dense": dense, "special": forms[best], "form": best,
            "forms": {f: {"median_s": t.median_s, "repeats": t.repeats} for f, t in forms.items()}}


def ab_factored(m: int, k: int, n: int, rank: int, repeats: int = REPEATS, device: str = "cpu") -> dict:
    """Dense ``(M,K)@(K,N)`` vs factored ``(M,K)@(K,r)@(r,N)`` at the probed stable rank."""
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
    u, v = torch.randn(k, rank, device=device), torch.randn(rank, n, device=device)
    dense = time_call(lambda: torch.mm(a, b), repeats)
    special = time_call(lambda: torch.mm(torch.mm(a, u), v), repeats)
    return {"dense": dense, "special": special, "form": f"factored_rank{rank}",
            "forms": {f"factored_rank{rank}": {"median_s": special.median_s, "repeats": special.repeats}}}


# finding -> (exploit, guard template, guarded stat)
EXPLOITS: dict[str, tuple[str, str, str]] = {
    "sparse_gemm": ("zero_skipping_sparse_gemm", "density < 0.5", "density"),
    "int_quant": ("int8_gemm_per_channel", "absmax <= {absmax:.4g} (calibrated; no clipping)", "absmax"),
    "quantize_lut": ("int8_gemm_lut", "absmax <= {absmax:.4g} (calibrated; no clipping)", "absmax"),
    "stationary": ("prepack", "weights unchanged: every scalar sketch repeats exactly across steps", "l1"),
    "low_rank": ("factored_matmul", "stable_rank < 0.1 * cols and rank_10pct * (rows + cols) < rows * cols (probe)",
                 "stable_rank"),
    "two_four": ("sparse_2_4_gemm", "2:4 magnitude pruning rel. error < 0.10 (probe)", "rel_err"),
}


def _per_step(g: pd.DataFrame, stat: str) -> np.ndarray:
    if stat == "density":
        s = g[(g["stat"] == "nnz") & (g["idx"] == 0)]
        return (s["value"] / s["numel"].clip(lower=1)).to_numpy(dtype=float)
    if stat == "absmax":
        mn = g[(g["stat"] == "min") & (g["idx"] == 0)].groupby("step")["value"].first()
        mx = g[(g["stat"] == "max") & (g["idx"] == 0)].groupby("step")["value"].first()
        return np.maximum(mn.abs(), mx.abs()).to_numpy(dtype=float)
    s = g[(g["stat"] == stat) & (g["idx"] == 0)]
    return s.groupby("step")["value"].first().to_numpy(dtype=float)


def _guard_stability(stat: str, values: np.ndarray) -> tuple[float | None, float | None, bool | None]:
    if len(values) == 0:
        return None, None, None
    mean, sigma = float(values.mean()), float(values.std())
    if len(values) < 2:
        return mean, sigma, None
    stable = sigma < DENSITY_SIGMA_STABLE if stat == "density" else sigma / (abs(mean) + 1e-30) < CV_STABLE
    return mean, sigma, bool(stable)


def plan(patterns: pd.DataFrame, sketches: pd.DataFrame, measure: bool = True,
         repeats: int = REPEATS, device: str = "cpu") -> pd.DataFrame:
    """The actuation plan (``plan`` table rows) for the findings of ``patterns`` on ``sketches``.

    Parameters
    ----------
    patterns : ``patterns`` rows (:func:`~goblin_assets.opscope.miner.mine_patterns`,
        and probe findings ``low_rank`` / ``two_four`` if present).
    sketches : the sketch rows the patterns were mined from (shapes and per-step guard statistics).
    measure : run the A/B micro-benchmarks (False: estimates only, ``provenance`` ``estimated``).
    repeats : timed blocks per variant (the median is reported).
    device : where the A/B runs (``cpu``; ``cuda`` runs the forms torch supports there).

    Returns
    -------
    DataFrame
        ``plan`` rows, one per (site, role, finding) with an exploit.  Speedups
        are dense time / specialised time (> 1 is faster).

    Units
    -----
    ``dense_median_s`` / ``special_median_s``: seconds per call (median).
    """
    rows = []
    sk = sketches if "dist" in sketches.columns else sketches.assign(dist="")
    groups = {key: g for key, g in sk.groupby(["run_id", "site", "role"], sort=False)}
    empty = sk.iloc[0:0]
    memo: dict[tuple, tuple[dict, str]] = {}   # one A/B per (exploit, role, shape, parameter): shared by same-shape sites

    def measured(key: tuple, site: str, fn: Callable[[], dict]) -> tuple[dict, str | None]:
        if key not in memo:
            memo[key] = (fn(), site)
            return memo[key][0], None
        return memo[key]

    for p in patterns.itertuples():
        if p.finding not in EXPLOITS:
            continue
        exploit, guard_t, gstat = EXPLOITS[p.finding]
        ev = json.loads(p.evidence_json)
        base_site = p.site.split("@")[0]
        g = groups.get((p.run_id, base_site, p.role), empty)
        if "@" in p.site:
            g = g[g["dist"] == p.site.split("@", 1)[1]]
        shared = None
        if g.empty and p.finding not in ("low_rank", "two_four"):
            continue
        m, k, n = (int(g["M"].iloc[0]), int(g["K"].iloc[0]), int(g["N"].iloc[0])) if not g.empty else (0, 0, 0)
        vals = _per_step(g, gstat) if not g.empty else np.array([])
        gmean, gsigma, stable = _guard_stability(gstat, vals)
        absmax = float(ev.get("absmax") or (vals.max() if gstat == "absmax" and len(vals) else 1.0))
        guard = guard_t.format(absmax=absmax)
        est, bench, reason = None, None, None
        try:
            if p.finding == "sparse_gemm":
                d = float(ev.get("density", gmean or 1.0))
                est = 1.0 / max(d, 1e-6)
                if p.role == "out":
                    reason = "an output's sparsity is exploited at its consumer's lhs"
                elif measure:
                    dead = _dead_share(g)
                    bench, shared = measured((exploit, p.role, m, k, n, round(d, 2), round(dead, 2)), p.site,
                                             lambda: ab_sparse(m, k, n, d, p.role, dead, repeats, device))
            elif p.finding in ("int_quant", "quantize_lut"):
                est = 4.0  # fp32 operands -> int8: 4x fewer bytes (sketch rows carry no dtype; fp32 assumed)
                if measure:
                    bench, shared = measured(("int8", m, k, n), p.site,
                                             lambda: ab_int8(m, k, n, absmax, repeats, device))
            elif p.finding == "stationary":
                if p.role != "rhs":
                    continue  # a stationary activation is an input that does not change: precompute, not prepack
                if "exact_repeat" in ev:
                    stable = bool(ev["exact_repeat"])   # the guard is bitwise: a nearly constant l1 is not enough
                if measure:
                    if device == "cpu":
                        bench, shared = measured((exploit, m, k, n), p.site, lambda: ab_prepack(m, k, n, repeats))
                    else:
                        reason = "prepack A/B is implemented for the CPU (oneDNN) only"
            elif p.finding == "low_rank":
                r = max(1, int(ev["rank"]["rank_10pct"]))
                shape = ev.get("shape", [0, 0])
                n_out, k_in = int(shape[0]), int(shape[-1])
                m = m or 128
                k, n = k_in, n_out
                est = (k * n) / (r * (k + n))
                if measure:
                    bench, shared = measured((exploit, m, k, n, r), p.site,
                                             lambda: ab_factored(m, k, n, r, repeats, device))
            elif p.finding == "two_four":
                est = 2.0  # half the multiply-adds on 2:4 sparse tensor cores (NVIDIA Ampere+ / AMD CDNA3)
                reason = "no 2:4 sparse kernel on this device (torch semi-structured sparsity needs CUDA)" \
                    if not torch.cuda.is_available() else "2:4 A/B not implemented"
        except RuntimeError as exc:
            reason = f"{exploit} cannot run here: {exc}"
            bench = None
        meas = dense_s = spec_s = None
        n_rep = 0
        extra: dict = {"finding_evidence": ev}
        if bench is not None:
            dense_s, spec_s = bench["dense"].median_s, bench["special"].median_s
            meas = dense_s / spec_s
            n_rep = min(bench["dense"].repeats, bench["special"].repeats)
            extra.update({"form": bench["form"], "forms": bench["forms"], "dense_repeats": bench["dense"].repeats,
                          "special_repeats": bench["special"].repeats, "dense_times_s": bench["dense"].times_s,
                          "special_times_s": bench["special"].times_s})
            if "rel_err" in bench:
                extra["int8_rel_err"] = bench["rel_err"]
        if reason:
            extra["not_measured"] = reason
        if shared:
            extra["timing_shared_with"] = shared   # the same A/B (exploit, shape, parameter) measured once
        rows.append({"run_id": p.run_id, "workload": p.workload, "site": p.site, "role": p.role,
                     "finding": p.finding, "exploit": exploit, "guard": guard, "guard_stat": gstat,
                     "guard_mean": gmean, "guard_sigma": gsigma, "guard_stable": stable, "est_speedup": est,
                     "measured_speedup": meas, "dense_median_s": dense_s, "special_median_s": spec_s,
                     "repeats": n_rep, "M": m, "K": k, "N": n, "device": _device_name(device),
                     "provenance": "measured" if meas is not None else "estimated",
                     "evidence_json": json.dumps(extra, default=float)})
    df = pd.DataFrame(rows, columns=columns("plan")).astype({"guard_stable": "object"})
    return df


def _dead_share(g: pd.DataFrame) -> float:
    """Share of lhs channels whose max |x| is 0 at every step (from ``chan_maxabs``; 0 when not recorded)."""
    c = g[g["stat"] == "chan_maxabs"]
    if c.empty:
        return 0.0
    per = c.groupby("idx")["value"].max()
    return float((per == 0).mean())


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    import platform

    return f"cpu:{platform.processor() or platform.machine()}:{AB_THREADS}t"


def plan_findings(plan_df: pd.DataFrame) -> pd.DataFrame:
    """``patterns``-style rows of a plan (finding ``prepack`` for prepack items, else the exploit name).

    The score is the measured speedup (or the estimate when nothing was
    measured); evidence carries the guard, its stability and the timings.
    """
    def num(v):
        return None if v is None or pd.isna(v) else float(v)

    rows = []
    for r in plan_df.itertuples():
        meas, est = num(r.measured_speedup), num(r.est_speedup)
        score = meas if meas is not None else (est if est is not None else 0.0)
        ev = {"exploit": r.exploit, "guard": r.guard, "guard_stat": r.guard_stat, "guard_mean": num(r.guard_mean),
              "guard_sigma": num(r.guard_sigma),
              "guard_stable": None if r.guard_stable is None or pd.isna(r.guard_stable) else bool(r.guard_stable),
              "est_speedup": est, "measured_speedup": meas, "dense_median_s": num(r.dense_median_s),
              "special_median_s": num(r.special_median_s), "repeats": int(r.repeats),
              "shape": [int(r.M), int(r.K), int(r.N)], "provenance": r.provenance, **json.loads(r.evidence_json)}
        rows.append({"run_id": r.run_id, "workload": r.workload, "site": r.site, "role": r.role,
                     "finding": "prepack" if r.exploit == "prepack" else r.exploit, "score": float(score),
                     "evidence_json": json.dumps(ev, default=float)})
    return pd.DataFrame(rows, columns=columns("patterns"))
