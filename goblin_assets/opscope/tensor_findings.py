"""Tensor findings: what the sketched tensors say about precision, FP8, a frozen base and sparsity.

The audit records sketches of every forward matmul's operands (``sketches``
table, :mod:`goblin_assets.opscope.sketches`) and mines them (``patterns``
table, :mod:`goblin_assets.opscope.miner`).  This module grades what those
rows mean for the advice, one :class:`TensorFinding` each, with the site, the
recorded step, the numbers and the SQL that reproduces them from the
warehouse:

=================  ==========================================================  =========
finding            when                                                        scope
=================  ==========================================================  =========
fp16_overflow      a run holding fp16 operands has a tensor whose max |x|      training
                   reaches half the fp16 maximum, or holds NaN/inf: bf16
fp16_range_ok      a run holding fp16 operands stays below half the fp16 max   training
bf16_safe          an fp32 run, every value finite: the measured ranges fit     training
                   bf16's (fp32's exponent range) with the margin stated
fp8_scaling        (FP8 devices only) an operand needing per-channel scaling   training
                   (outlier channels) or current scaling (amax unstable)
fp8_ready          (FP8 devices only) how many operands fit per-tensor         training
                   delayed scaling
frozen_base        weights repeated exactly across optimizer steps while       training
                   others change (a frozen base under LoRA): int8/int4 error
                   and the memory a quantised base frees
sparse_activation  a matmul input with density < 0.5                           training
probe_structure    2:4 / low-rank findings of host probes, when present        inference
=================  ==========================================================  =========

Severity: ``high`` (the run is or is about to be wrong: overflow, NaN),
``medium`` (a change is recommended with measured support), ``info`` (a
measured statement, nothing to change).  Scope ``training`` means the finding
can change the audited fine-tuning run; ``inference`` that it can only change
a model served after training (a trainable weight's structure).

Steps: ``step`` is the recorded sketch step (0-based); ``train_step`` the
1-based training step of that forward pass (the sketch run's warm-up steps
first; :func:`goblin_assets.measure.evidence.train_step`).

What the sketches cannot say is said, not guessed: the histogram is linear
in ``x / max|x|`` (32 bins of width ``max|x| / 16``), so a share of values
below fp16's smallest normal (2**-14) or below half its smallest subnormal
(2**-25, the values that round to zero) is an interval (:func:`below_share`),
tight only when ``max|x| / 16`` is near those thresholds; 2:4 feasibility and
effective rank need the whole tensor (host probes, ``goblin opscope probes``).

Nothing here imports torch: findings render from warehouse rows.

Sources: IEEE 754-2008 binary16 (max 65504, smallest normal 2**-14, smallest
subnormal 2**-24); bfloat16 (8 exponent bits as fp32, 8 significant bits:
max (2 - 2**-7) * 2**127 ~ 3.39e38; PyTorch ``torch.finfo(torch.bfloat16)``);
Micikevicius et al., "FP8 Formats for Deep Learning" (arXiv 2209.05433, 2022):
E4M3 max 448, E5M2 max 57344; NVIDIA Transformer Engine docs, "Using FP8 with
Transformer Engine" (delayed scaling from an amax history, per-tensor
scales); Dettmers et al., "LLM.int8()" (NeurIPS 2022) and "QLoRA" (NeurIPS
2023): outlier features, a 4-bit frozen base under LoRA adapters; the uniform
quantisation noise model (Widrow & Kollar, "Quantization Noise", 2008, ch. 4:
error variance step**2 / 12).
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: Largest finite IEEE 754 binary16 value.
FP16_MAX = 65504.0
#: Smallest positive normal binary16 value (2**-14): below it values are subnormal (fewer significant bits).
FP16_MIN_NORMAL = 2.0 ** -14
#: Half the smallest binary16 subnormal (2**-24 / 2): a value of smaller magnitude rounds to zero (nearest-even).
FP16_FLUSH = 2.0 ** -25
#: Largest finite bfloat16 value, (2 - 2**-7) * 2**127 (``torch.finfo(torch.bfloat16).max``).
BF16_MAX = (2.0 - 2.0 ** -7) * 2.0 ** 127
#: Largest finite FP8 E4M3 (forward tensors) and E5M2 (gradients) values (Micikevicius et al. 2022, table 1).
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
#: max|x| / FP16_MAX at or above this: the tensor is within a factor of 2 (one binade) of overflowing fp16.
#: Source: goblin's choice; one doubling (a loss-scale growth step of torch.amp.GradScaler, growth_factor=2,
#: or one more step of a growing activation) overflows.
FP16_NEAR = 0.5
#: max/mean of per-channel max|x| above this: per-tensor scaling wastes the format on the other channels,
#: scale per channel.  Source: the miner's OUTLIER_RATIO (issue 7; LLM.int8() sec. 3.2's magnitude).
FP8_OUTLIER_RATIO = 6.0
#: amax over recorded steps, max/min above this: a scale taken from earlier steps' amax (delayed scaling)
#: would clip the next step; scale from the current step.  Source: goblin's choice (one binade, as FP16_NEAR).
FP8_AMAX_DRIFT = 2.0
#: Relative error under which a quantised base counts as usable.  Source: the host probes' QUANT_MAX_REL_ERR
#: (goblin_assets.opscope.probe, issue 7: 2 %).
QUANT_OK = 0.02
#: Density below this: sparse GEMM / zero skipping (the miner's SPARSE_DENSITY, issue 7).
SPARSE_DENSITY = 0.5
#: Bytes of one per-channel scale of a quantised weight (an fp16 scale per output channel).
SCALE_BYTES = 2
#: At most this many site rows per finding kind in the report table (the rest: counted; the SQL lists all).
REPORT_ROWS = 6
#: Unrecorded warm-up steps of a sketch run (record_sketches' default; the session's SKETCH_WARMUP).
SKETCH_WARMUP = 1

#: ``tensors.<group>.<key>`` names of detect conditions (goblin_assets/kb/rules.py), by group.
TENSOR_KEYS: dict[str, tuple[str, ...]] = {
    "fp16_range": ("fp16", "peak_ratio", "nonfinite_sites"),
    "bf16_range": ("peak_ratio", "safe"),
    "fp8": ("sites", "per_channel_sites", "current_scaling_sites"),
    "frozen_base": ("sites", "params", "int8_rel_err", "int4_rel_err", "freed_mb_int8", "freed_mb_int4"),
    "sparsity": ("min_density", "sparse_sites"),
}


@dataclass
class TensorFinding:
    """One graded finding.

    ``numbers`` holds the measured values (keys carry their unit: ``_mb`` =
    1e6 bytes, ``_ratio`` dimensionless, ``_share`` a fraction of elements);
    ``sql`` is a DuckDB query on the warehouse whose one result row has
    columns named as (a subset of) ``numbers`` and reproduces them.
    """

    finding: str
    severity: str
    scope: str
    site: str
    role: str
    step: int | None
    train_step: int | None
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)
    sql: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite numbers as strings ``"inf"``/``"nan"``: JSON has neither)."""
        d = asdict(self)
        d["numbers"] = {k: _jsonable(v) for k, v in self.numbers.items()}
        return d


@dataclass
class TensorFindings:
    """Every finding of one audit's sketches, the per-(site, role) table and the detect-context values.

    ``sites``: one row per (run_id, site, role) (columns: :func:`site_table`).
    ``context``: ``{group: {key: value}}`` (:data:`TENSOR_KEYS`); a group is
    absent when not observable (no FP8 device, no frozen weight, ...).
    ``where``: ``{group: text}`` naming the site and training step behind it.
    ``notes``: what was not stated and why.
    """

    findings: list[TensorFinding]
    sites: pd.DataFrame
    run_format: str
    context: dict[str, dict[str, Any]] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.findings)

    def value(self, group: str, key: str) -> tuple[bool, Any, str]:
        """``(known, value, where)`` of ``tensors.<group>.<key>``; unknown when the group was not observable."""
        g = self.context.get(group)
        if g is None or key not in g:
            return False, None, ""
        return True, g[key], self.where.get(group, "")

    def to_json(self) -> list[dict[str, Any]]:
        """The findings as JSON-ready dicts (``goblin audit --json`` key ``tensor_findings``)."""
        return [f.to_json() for f in self.findings]

    def markdown(self) -> list[str]:
        """The report's "Tensor findings" section as markdown lines ([] when nothing was sketched)."""
        return _markdown(self)

    def html(self) -> str:
        """The same section as one HTML ``<section>`` ('' when nothing was sketched)."""
        return _html(self)


# ----------------------------------------------------------------------------- numbers per (site, role, step)

def _jsonable(v: Any) -> Any:
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def below_share(hist: np.ndarray, absmax: float, density: float, t: float) -> tuple[float, float]:
    """Bounds on the share of elements with ``0 < |x| < t``, from the scale-normalised 32-bin histogram.

    Parameters
    ----------
    hist : float array ``(32,)``
        Shares of ``x / (max|x| + 1e-12)`` per bin of width 1/16 over [-1, 1]
        (bin ``b`` holds ``[(b - 16) / 16, (b - 15) / 16)``; sums to 1).
    absmax : float
        ``max|x|`` of the same tensor (exact), > 0 and finite.
    density : float
        ``nnz / numel``: the exact zeros (share ``1 - density``) sit in bin 16
        and are not counted (zero is exact in every format).
    t : float
        The magnitude threshold (e.g. :data:`FP16_MIN_NORMAL`).

    Returns
    -------
    (low, high) : floats in [0, 1], shares of all elements
        ``low`` counts the bins lying wholly below ``t``, ``high`` every bin
        that starts below ``t`` (the two central bins, zeros removed, as soon
        as ``t > 0``).  The histogram is sampled for tensors over 16,384
        elements (stated error: within 0.05 in L1 distance,
        :mod:`goblin_assets.opscope.sketches`).
    """
    h = np.nan_to_num(np.asarray(hist, dtype=float), nan=0.0)
    if len(h) != 32 or not math.isfinite(absmax) or absmax <= 0 or h.sum() <= 0:
        return 0.0, 1.0
    h = h / h.sum()
    h[16] = max(h[16] - (1.0 - density), 0.0)
    w = absmax / 16.0
    k = np.abs(np.arange(32) - 15.5) - 0.5          # |x| of a bin spans [k * w, (k + 1) * w)
    low = float(h[(k + 1) * w <= t].sum())
    high = float(h[k * w < t].sum())
    return low, high


def _scalars(sk: pd.DataFrame) -> pd.DataFrame:
    """Per (run_id, site, role, step): absmax, density, sumsq, chan_outlier, nonfinite counts, numel."""
    s = sk[sk["idx"].eq(0) & sk["stat"].isin(["min", "max", "nnz", "sumsq", "chan_outlier"])]
    wide = s.pivot_table(index=["run_id", "site", "role", "step"], columns="stat", values="value",
                         aggfunc="first", dropna=False)
    numel = s.groupby(["run_id", "site", "role", "step"])["numel"].first()
    out = pd.DataFrame(index=wide.index)
    out["numel"] = numel
    mn = wide["min"] if "min" in wide else np.nan
    mx = wide["max"] if "max" in wide else np.nan
    # NaN min/max (stored as NULL in the warehouse) are skipped, as SQL's max() skips NULL
    out["absmax"] = np.fmax(np.abs(mx), np.abs(mn))
    out["density"] = (wide["nnz"] / out["numel"]) if "nnz" in wide else np.nan
    out["sumsq"] = wide["sumsq"] if "sumsq" in wide else np.nan
    out["chan_outlier"] = wide["chan_outlier"] if "chan_outlier" in wide else np.nan
    nf = sk[sk["stat"].eq("nonfinite")].pivot_table(index=["run_id", "site", "role", "step"], columns="idx",
                                                     values="value", aggfunc="first")
    for i, name in enumerate(("nan", "posinf", "neginf")):
        out[name] = nf[i].reindex(out.index).fillna(0.0) if i in nf.columns else 0.0
    return out.reset_index()


def _vectors(sk: pd.DataFrame, stat: str) -> dict[tuple, np.ndarray]:
    """Per (run_id, site, role, step), the vector of ``stat`` ordered by idx."""
    v = sk[sk["stat"].eq(stat)].sort_values(["run_id", "site", "role", "step", "idx"])
    return {k: g["value"].to_numpy(dtype=float) for k, g in v.groupby(["run_id", "site", "role", "step"], sort=False)}


def _formats(sk: pd.DataFrame) -> dict[tuple, str]:
    """Per (run_id, site, role): the floating format its ``sample`` elements are exact in (the miner's rule)."""
    from goblin_assets.opscope.miner import _fp_format  # numpy only; the package imports torch, present with sketches

    smp = sk[sk["stat"].eq("sample")]
    return {k: _fp_format(g["value"].to_numpy(dtype=float)) for k, g in smp.groupby(["run_id", "site", "role"])}


def site_table(sketches: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, site, role) of sketch rows: the numbers every finding reads.

    Columns: ``run_id, site, role, steps, numel, absmax`` (max over steps of
    max|x|, exact; NaN steps skipped), ``peak_step`` (its recorded step),
    ``fp16_ratio`` (absmax / 65504), ``bf16_ratio`` (absmax / BF16_MAX),
    ``amax_min`` (smallest per-step max|x|), ``amax_drift_ratio`` (absmax /
    amax_min: how much the per-tensor amax moves across steps), ``density``
    (mean over steps of nnz/numel), ``chan_outlier`` (mean over steps),
    ``nonfinite`` (NaN + inf elements summed over steps), ``posinf``,
    ``neginf``, ``nan``, ``first_nonfinite_step`` (or NaN), ``format``
    (``fp16``, ``bf16``, ``fp16 or bf16``, ``fp32 or wider``, ``unknown``),
    ``fp16_subnormal_share_low/high`` and ``fp16_flush_share_low/high``
    (bounds on the share of elements, at the peak step, below 2**-14 and
    below 2**-25: :func:`below_share`), ``fp16_flushed_channels`` (channels
    whose max|x| is below 2**-25 but not zero: all their values round to zero
    in fp16; exact, from ``chan_maxabs``).

    Roles ``probs`` and ``route`` are left out (not matmul operands).
    """
    sk = sketches[sketches["role"].isin(["lhs", "rhs", "out"])]
    if sk.empty:
        return pd.DataFrame()
    sc = _scalars(sk)
    hist, chans = _vectors(sk, "hist"), _vectors(sk, "chan_maxabs")
    fmts = _formats(sk)
    rows = []
    for (run, site, role), g in sc.groupby(["run_id", "site", "role"], sort=False):
        g = g.sort_values("step")
        am = g["absmax"].to_numpy(dtype=float)
        finite_am = am[np.isfinite(am)]
        if np.isfinite(am).any() or np.isinf(am).any():
            i = int(np.nanargmax(np.where(np.isnan(am), -1.0, am)))
        else:
            i = 0
        peak = float(am[i]) if len(am) else math.nan
        step = int(g["step"].iloc[i])
        bad = g[(g["nan"] + g["posinf"] + g["neginf"]) > 0]
        dens = float(g.loc[g["density"].notna(), "density"].mean()) if g["density"].notna().any() else math.nan
        key = (run, site, role, step)
        d_at = float(g["density"].iloc[i]) if pd.notna(g["density"].iloc[i]) else 1.0
        sub = below_share(hist.get(key, np.zeros(0)), peak, d_at, FP16_MIN_NORMAL)
        flush = below_share(hist.get(key, np.zeros(0)), peak, d_at, FP16_FLUSH)
        ch = chans.get(key)
        amin = float(finite_am.min()) if len(finite_am) else math.nan
        rows.append({
            "run_id": run, "site": site, "role": role, "steps": int(len(g)), "numel": int(g["numel"].iloc[0]),
            "absmax": peak, "peak_step": step, "fp16_ratio": peak / FP16_MAX, "bf16_ratio": peak / BF16_MAX,
            "amax_min": amin, "amax_drift_ratio": (float(finite_am.max()) / amin) if amin and amin > 0 else math.nan,
            "density": dens, "chan_outlier": float(g["chan_outlier"].mean()) if g["chan_outlier"].notna().any()
            else math.nan,
            "nan": int(g["nan"].sum()), "posinf": int(g["posinf"].sum()), "neginf": int(g["neginf"].sum()),
            "nonfinite": int((g["nan"] + g["posinf"] + g["neginf"]).sum()),
            "first_nonfinite_step": int(bad["step"].min()) if len(bad) else math.nan,
            "format": fmts.get((run, site, role), "unknown"),
            "fp16_subnormal_share_low": sub[0], "fp16_subnormal_share_high": sub[1],
            "fp16_flush_share_low": flush[0], "fp16_flush_share_high": flush[1],
            "fp16_flushed_channels": int(((ch > 0) & (ch < FP16_FLUSH)).sum()) if ch is not None else 0,
        })
    return pd.DataFrame(rows)


def run_format(table: pd.DataFrame, precision: str | None = None) -> str:
    """The run's matmul number format: ``fp16``, ``bf16`` or ``fp32``.

    By the operands (roles lhs and rhs) whose 16 ``sample`` elements decide
    (:func:`goblin_assets.opscope.miner._fp_format`): ``fp16`` when more of them
    need fp16 (exact in fp16, not in bf16) than are exact in neither 16-bit
    format; when more are exact in both 16-bit formats than in neither, the
    parsed config's ``precision`` if it is fp16 or bf16, else ``bf16``; when
    operands are exact in neither, ``fp32`` (the measurement wins over the
    config); with no operand format known, the config's fp16/bf16, else fp32.  A count, not "any": 16 values of one fp32 tensor
    can be exact in fp16 by chance (measured: one of 148 MiniLM LoRA operands, a
    small adapter weight).  Autocast's fp16 operands read fp16 (the tap sits
    below autocast in the dispatcher).
    """
    ops = table[table["role"].isin(["lhs", "rhs"])]["format"] if len(table) else pd.Series(dtype=str)
    n16, n32 = int((ops == "fp16").sum()), int((ops == "fp32 or wider").sum())
    if n16 > n32:
        return "fp16"
    if int(ops.isin(["fp16 or bf16", "bf16"]).sum()) > n32:
        return precision if precision in ("fp16", "bf16") else "bf16"
    if n32 or precision not in ("fp16", "bf16"):
        return "fp32"
    return precision


# ----------------------------------------------------------------------------- SQL

def _q(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _where(run: str, site: str, role: str) -> str:
    """The ``sketches`` rows of one (run, site, role)."""
    return f"run_id = {_q(run)} AND site = {_q(site)} AND role = {_q(role)}"


def _sql_range(run: str, site: str, role: str) -> str:
    """max|x| over steps of one (site, role), with the fp16/bf16 ratios and the non-finite element count."""
    w = _where(run, site, role)
    return (f"SELECT max(abs(value)) FILTER (WHERE stat IN ('min', 'max')) AS absmax,\n"
            f"       max(abs(value)) FILTER (WHERE stat IN ('min', 'max')) / {FP16_MAX!r} AS fp16_ratio,\n"
            f"       max(abs(value)) FILTER (WHERE stat IN ('min', 'max')) / {BF16_MAX!r} AS bf16_ratio,\n"
            f"       coalesce(sum(value) FILTER (WHERE stat = 'nonfinite'), 0) AS nonfinite\n"
            f"FROM sketches WHERE {w}")


def _sql_fp8(run: str, site: str, role: str) -> str:
    """Per-step amax of one operand, its drift over steps, its outlier ratio."""
    w = _where(run, site, role)
    return (f"WITH a AS (SELECT step, max(abs(value)) AS amax FROM sketches\n"
            f"           WHERE {w} AND stat IN ('min', 'max') GROUP BY step)\n"
            f"SELECT max(amax) AS absmax, min(amax) AS amax_min, max(amax) / min(amax) AS amax_drift_ratio,\n"
            f"       (SELECT avg(value) FROM sketches WHERE {w} AND stat = 'chan_outlier') AS chan_outlier\n"
            f"FROM a")


def _sql_density(run: str, site: str, role: str) -> str:
    w = _where(run, site, role)
    return f"SELECT avg(value / numel) AS density FROM sketches WHERE {w} AND stat = 'nnz'"


def _sql_frozen(run: str, site: str, step: int) -> str:
    """int8/int4 per-channel error estimates of one frozen weight (``rhs``) from chan_maxabs and sumsq."""
    w = f"run_id = {_q(run)} AND site = {_q(site)} AND role = 'rhs' AND step = {int(step)}"
    return (f"WITH c AS (SELECT value AS cmax, numel FROM sketches WHERE {w} AND stat = 'chan_maxabs'),\n"
            f"     s AS (SELECT value AS sumsq FROM sketches WHERE {w} AND stat = 'sumsq'),\n"
            f"     p AS (SELECT (SELECT any_value(numel) FROM c) AS numel, count(*) AS channels,\n"
            f"                  sum(cmax * cmax) AS cmax2 FROM c)\n"
            f"SELECT p.numel AS params, p.channels,\n"
            f"       sqrt(p.numel / p.channels * p.cmax2 / (127.0 * 127.0) / 12 / s.sumsq) AS int8_rel_err,\n"
            f"       sqrt(p.numel / p.channels * p.cmax2 / (7.0 * 7.0) / 12 / s.sumsq) AS int4_rel_err\n"
            f"FROM p, s")


def _sql_stationary(run: str) -> str:
    """The frozen weights (rhs repeated exactly across steps, each module once) and their parameter count."""
    return (f"SELECT count(*) AS sites, sum(n) AS params FROM (\n"
            f"  SELECT p.site, any_value(s.numel) AS n FROM patterns p\n"
            f"  JOIN sketches s ON s.run_id = p.run_id AND s.site = p.site AND s.role = 'rhs' AND s.stat = 'sumsq'\n"
            f"  WHERE p.run_id = {_q(run)} AND p.role = 'rhs' AND p.finding = 'stationary'\n"
            f"    AND json_extract(p.evidence_json, '$.exact_repeat')::BOOLEAN AND p.site NOT LIKE '%#%'\n"
            f"  GROUP BY p.site)")


# ----------------------------------------------------------------------------- the findings

def quant_rel_err(chan_maxabs: np.ndarray, numel: int, sumsq: float, bits: int) -> float:
    """Relative Frobenius error of symmetric per-channel ``bits``-bit quantisation, from sketches alone.

    The uniform noise model: each element's rounding error is uniform on
    ``[-step/2, step/2]`` with ``step_c = chan_maxabs_c / (2**(bits-1) - 1)``,
    so the error energy is ``(numel / C) * sum_c step_c**2 / 12`` and the
    relative error its square root over ``sqrt(sumsq)``.

    Parameters
    ----------
    chan_maxabs : float array ``(C,)``
        max|w| per output channel (the ``rhs`` operand ``W.T`` of a linear
        layer: its last axis is the weight's output rows, as
        ``goblin_assets.opscope.probe.quant_error(channel_axis=0)`` scales them).
    numel, sumsq : the tensor's element count and sum of squares (exact sketches).
    bits : quantisation width (8 or 4 here).

    Returns
    -------
    float
        Dimensionless; NaN when ``sumsq`` is not positive.  It over-estimates
        when many values lie within half a step of zero (their error is smaller
        than the model's): measured against the exact error on the same
        weights in tests/test_tensor_findings.py.
    """
    c = np.asarray(chan_maxabs, dtype=float)
    if not len(c) or not sumsq or sumsq <= 0:
        return math.nan
    q = 2 ** (bits - 1) - 1
    return float(math.sqrt(numel / len(c) * float(np.sum((c / q) ** 2)) / 12.0 / sumsq))


def _step_pair(step: Any, warmup: int) -> tuple[int | None, int | None]:
    if step is None or (isinstance(step, float) and math.isnan(step)):
        return None, None
    return int(step), warmup + int(step) + 1


def _fmt(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x)).lower()
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    if isinstance(x, (float, np.floating)):
        if not math.isfinite(x):
            return str(x)
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def _mask_only(r: pd.Series) -> bool:
    return r["nonfinite"] > 0 and r["nan"] == 0 and r["posinf"] == 0 and r["role"] == "out"


def _nonfinite_ranks(patterns: pd.DataFrame | None) -> dict[tuple, int]:
    """(run_id, site, role) -> the miner's rank of its non-finite finding (0: where NaN/inf appear first)."""
    if patterns is None or not len(patterns):
        return {}
    nf = patterns[patterns["finding"].eq("nonfinite")]
    return {(r.run_id, r.site, r.role): int(json.loads(r.evidence_json or "{}").get("rank", 1 << 30))
            for r in nf.itertuples(index=False)}


def _precision_findings(t: pd.DataFrame, fmt: str, warmup: int, ranks: dict[tuple, int]
                        ) -> tuple[list[TensorFinding], dict, dict]:
    out: list[TensorFinding] = []
    ctx: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    if not len(t):
        return out, ctx, where
    real_bad = t[(t["nonfinite"] > 0) & ~t.apply(_mask_only, axis=1)]
    ratio = t["fp16_ratio"].where(~t.index.isin(real_bad.index), math.inf)
    # the event's step: the first non-finite step, else the step of the largest |x|; among equals the miner's
    # non-finite rank (0: where NaN/inf appear first, an overflow before what it propagates to), then the ratio
    event = t["first_nonfinite_step"].where(t["nonfinite"] > 0, t["peak_step"])
    order = t.assign(_r=ratio, _e=event, _k=[ranks.get((r, s, o), 1 << 30) for r, s, o in
                                             zip(t["run_id"], t["site"], t["role"])])
    order = order.sort_values(["_e", "_k", "_r"], ascending=[True, True, False])
    near = order[order["_r"] >= FP16_NEAR]
    peak = near.iloc[0] if len(near) else t.loc[ratio.idxmax()]
    st, ts = _step_pair(peak["first_nonfinite_step"] if peak["nonfinite"] > 0 else peak["peak_step"], warmup)
    at = f"`{peak['site']}` ({peak['role']}), training step {ts} (recorded step {st})"
    if fmt in ("fp16",):
        ctx["fp16_range"] = {"fp16": True, "peak_ratio": float(ratio.max()), "nonfinite_sites": int(len(real_bad))}
        where["fp16_range"] = at
        for _, r in near.iterrows():
            s, tr = _step_pair(r["first_nonfinite_step"] if r["nonfinite"] > 0 else r["peak_step"], warmup)
            what = (f"{r['nonfinite']:,} NaN/inf elements (first at recorded step {s})" if r["nonfinite"] > 0
                    else f"max |x| = {r['absmax']:,.5g}, {r['fp16_ratio']:.0%} of fp16's largest value 65,504")
            out.append(TensorFinding(
                "fp16_overflow", "high", "training", r["site"], r["role"], s, tr,
                f"fp16 range exceeded or nearly: {what}. Train in bf16 (fp32's exponent range, max ~3.39e38; no "
                f"loss scaling) where the device has bf16 units, else keep this layer in fp32.",
                {k: r[k] for k in ("absmax", "fp16_ratio", "bf16_ratio", "nonfinite")},
                _sql_range(r["run_id"], r["site"], r["role"])))
        if near.empty:
            out.append(TensorFinding(
                "fp16_range_ok", "info", "training", peak["site"], peak["role"], st, ts,
                f"fp16 range holds: the largest |x| is {peak['absmax']:,.5g} at {at}, "
                f"{math.log2(FP16_MAX / peak['absmax']) if peak['absmax'] > 0 else math.inf:.1f} binades below "
                f"65,504.", {k: peak[k] for k in ("absmax", "fp16_ratio", "bf16_ratio", "nonfinite")},
                _sql_range(peak["run_id"], peak["site"], peak["role"])))
    elif fmt == "fp32":
        safe = len(real_bad) == 0 and bool(np.isfinite(t["absmax"]).all())
        ctx["bf16_range"] = {"peak_ratio": float(t["bf16_ratio"].max()), "safe": safe}
        where["bf16_range"] = at
        if safe:
            margin = math.log2(BF16_MAX / peak["absmax"]) if peak["absmax"] > 0 else math.inf
            sub = t["fp16_subnormal_share_high"].max()
            fp16 = ("fp16 would also hold the range" if peak["fp16_ratio"] < FP16_NEAR else
                    f"fp16 would not (max |x| is {peak['fp16_ratio']:.0%} of 65,504)")
            out.append(TensorFinding(
                "bf16_safe", "info", "training", peak["site"], peak["role"], st, ts,
                f"bf16 is safe for the range here (measured): every recorded value is finite and the largest "
                f"|x|, {peak['absmax']:,.5g} at {at}, is {margin:.0f} binades below bf16's maximum; bf16 keeps "
                f"fp32's exponent range, so what changes is precision (8 significant bits, relative rounding "
                f"error <= 2**-9), not range. {fp16}; fp16 subnormals (|x| < 2**-14) hold at most "
                f"{sub:.0%} of a tensor's elements by the sketches' histogram.",
                {"absmax": peak["absmax"], "bf16_ratio": peak["bf16_ratio"], "fp16_ratio": peak["fp16_ratio"],
                 "nonfinite": int(t["nonfinite"].sum()), "fp16_subnormal_share_high": float(sub)},
                _sql_range(peak["run_id"], peak["site"], peak["role"])))
    return out, ctx, where


def _fp8_findings(t: pd.DataFrame, device: dict | None, warmup: int, notes: list[str]
                  ) -> tuple[list[TensorFinding], dict]:
    name = (device or {}).get("name") or "unknown"
    if not device or not device.get("fp8"):
        notes.append(f"FP8 readiness: not stated (device {name} has no FP8 matrix units; "
                     "goblin_assets/runners/devices.py).")
        return [], {}
    ops = t[t["role"].isin(["lhs", "rhs"]) & np.isfinite(t["absmax"]) & (t["absmax"] > 0)]
    out: list[TensorFinding] = []
    per_ch = ops[ops["chan_outlier"] > FP8_OUTLIER_RATIO]
    drift = ops[ops["amax_drift_ratio"] > FP8_AMAX_DRIFT]
    for _, r in ops[ops.index.isin(per_ch.index) | ops.index.isin(drift.index)].iterrows():
        needs = []
        if r["chan_outlier"] > FP8_OUTLIER_RATIO:
            needs.append(f"per-channel scaling (outlier channels: max/mean of per-channel max |x| = "
                         f"{r['chan_outlier']:.1f} > {FP8_OUTLIER_RATIO:g})")
        if r["amax_drift_ratio"] > FP8_AMAX_DRIFT:
            needs.append(f"current (just-in-time) scaling, not delayed scaling from an amax history (amax moves "
                         f"{r['amax_drift_ratio']:.2f}x across steps > {FP8_AMAX_DRIFT:g}x)")
        s, tr = _step_pair(r["peak_step"], warmup)
        out.append(TensorFinding(
            "fp8_scaling", "medium", "training", r["site"], r["role"], s, tr,
            f"FP8 on {name} (recommendation only, nothing patched): this operand needs " + "; ".join(needs) +
            f". E4M3 scale at the peak: 448 / {r['absmax']:.4g} = {E4M3_MAX / r['absmax']:.4g}.",
            {"absmax": r["absmax"], "amax_min": r["amax_min"], "amax_drift_ratio": r["amax_drift_ratio"],
             "chan_outlier": r["chan_outlier"]}, _sql_fp8(r["run_id"], r["site"], r["role"])))
    ok = len(ops) - len(out)
    if len(ops):
        worst = ops.loc[ops["absmax"].idxmax()]
        s, tr = _step_pair(worst["peak_step"], warmup)
        out.append(TensorFinding(
            "fp8_ready", "info", "training", worst["site"], worst["role"], s, tr,
            f"FP8 on {name}: {ok} of {len(ops)} matmul operands fit per-tensor delayed scaling (E4M3 for "
            f"forward tensors, max 448; E5M2 for gradients, max 57,344); the largest amax is "
            f"{worst['absmax']:.4g} at `{worst['site']}` ({worst['role']}). A recommendation, never a patch.",
            {"absmax": worst["absmax"], "amax_drift_ratio": worst["amax_drift_ratio"],
             "chan_outlier": worst["chan_outlier"]}, _sql_fp8(worst["run_id"], worst["site"], worst["role"])))
    return out, {"sites": int(len(ops)), "per_channel_sites": int(len(per_ch)),
                 "current_scaling_sites": int(len(drift))}


def _frozen_findings(sk: pd.DataFrame, patterns: pd.DataFrame | None, fmt: str, warmup: int,
                     notes: list[str]) -> tuple[list[TensorFinding], dict]:
    """Frozen weights and their quantisation: error estimates (:func:`quant_rel_err`) and memory freed.

    Storage bytes per parameter are the run's matmul format's (fp32: 4; a
    16-bit run: 2), not measured: the sketches do not see a parameter's dtype
    (under autocast the stored fp32 weights free twice what is stated).  A
    per-channel fp16 scale (:data:`SCALE_BYTES`) per output channel is counted.
    """
    if patterns is None or not len(patterns):
        return [], {}
    p = patterns[patterns["role"].eq("rhs") & patterns["finding"].isin(["stationary", "drifting"])]
    exact = [(r.run_id, r.site) for r in p.itertuples(index=False)
             if r.finding == "stationary" and json.loads(r.evidence_json or "{}").get("exact_repeat")]
    drifting = bool((p["finding"] == "drifting").any())
    if not exact:
        return [], {}
    if not drifting:
        notes.append("Frozen base: every weight repeats exactly across the recorded steps (no optimizer update "
                     "reached any of them, e.g. an evaluation loop); not read as a frozen base under adapters.")
        return [], {}
    rows = []
    for run, site in exact:
        if "#" in site:          # a second call of the same module in a step: the same weight, counted once
            continue
        g = sk[(sk["run_id"] == run) & (sk["site"] == site) & (sk["role"] == "rhs")]
        step = int(g["step"].min())
        g = g[g["step"] == step]
        ch = g[g["stat"] == "chan_maxabs"].sort_values("idx")["value"].to_numpy(dtype=float)
        ss = g.loc[g["stat"] == "sumsq", "value"]
        if not len(ch) or not len(ss):
            continue
        numel = int(g["numel"].iloc[0])
        src = 2 if fmt in ("fp16", "bf16") else 4
        rows.append({"run_id": run, "site": site, "step": step, "params": numel, "channels": len(ch),
                     "bytes_per_param": src,
                     "int8_rel_err": quant_rel_err(ch, numel, float(ss.iloc[0]), 8),
                     "int4_rel_err": quant_rel_err(ch, numel, float(ss.iloc[0]), 4)})
    if not rows:
        return [], {}
    f = pd.DataFrame(rows)
    f["freed_mb_int8"] = (f["params"] * (f["bytes_per_param"] - 1.0) - f["channels"] * SCALE_BYTES) / 1e6
    f["freed_mb_int4"] = (f["params"] * (f["bytes_per_param"] - 0.5) - f["channels"] * SCALE_BYTES) / 1e6
    out = []
    for _, r in f.sort_values("params", ascending=False).iterrows():
        s, tr = _step_pair(r["step"], warmup)
        sev = "medium" if r["int8_rel_err"] < QUANT_OK else "info"
        out.append(TensorFinding(
            "frozen_base", sev, "training", r["site"], "rhs", s, tr,
            f"Frozen weight ({r['params']:,} parameters, identical at every recorded step while other weights "
            f"train): per-channel int8 would add {r['int8_rel_err']:.2%} relative error, int4 {r['int4_rel_err']:.2%}"
            f" (uniform-noise estimate from the sketches); a quantised copy frees {r['freed_mb_int8']:.2f} MB "
            f"(int8) or {r['freed_mb_int4']:.2f} MB (int4).",
            {k: r[k] for k in ("params", "channels", "int8_rel_err", "int4_rel_err", "freed_mb_int8",
                               "freed_mb_int4")}, _sql_frozen(r["run_id"], r["site"], int(r["step"]))))
    total = {"sites": int(len(f)), "params": int(f["params"].sum()), "int8_rel_err": float(f["int8_rel_err"].max()),
             "int4_rel_err": float(f["int4_rel_err"].max()), "freed_mb_int8": float(f["freed_mb_int8"].sum()),
             "freed_mb_int4": float(f["freed_mb_int4"].sum())}
    worst = f.loc[f["int4_rel_err"].idxmax()]
    s, tr = _step_pair(worst["step"], warmup)
    out.insert(0, TensorFinding(
        "frozen_base", "medium" if total["int8_rel_err"] < QUANT_OK else "info", "training", "all", "rhs", s, tr,
        f"Frozen base: {total['sites']} weights ({total['params']:,} parameters) never change while others train "
        f"(a base under LoRA adapters). Quantised per output channel, the worst int8 error is "
        f"{total['int8_rel_err']:.2%} and the worst int4 error {total['int4_rel_err']:.2%} (at `{worst['site']}`); "
        f"a quantised base frees {total['freed_mb_int8']:.1f} MB (int8) or {total['freed_mb_int4']:.1f} MB (int4) "
        f"of weight memory: the QLoRA decision, from these weights"
        f"{' (int8 within 2 %)' if total['int8_rel_err'] < QUANT_OK else ''}.",
        total, _sql_stationary(str(f["run_id"].iloc[0]))))
    return out, total


def _sparsity_findings(t: pd.DataFrame, patterns: pd.DataFrame | None, warmup: int
                       ) -> tuple[list[TensorFinding], dict]:
    lhs = t[t["role"].eq("lhs") & t["density"].notna()]
    out = []
    sparse = lhs[lhs["density"] < SPARSE_DENSITY].sort_values("density")
    for _, r in sparse.iterrows():
        s, tr = _step_pair(r["peak_step"], warmup)
        out.append(TensorFinding(
            "sparse_activation", "info", "training", r["site"], "lhs", s, tr,
            f"Input density {r['density']:.1%} (mean over {r['steps']} steps): zero-skipping or a sparse GEMM on "
            f"this matmul's input; vendor sparse GEMMs need far fewer non-zeros than 50 % to beat a dense one, and "
            f"the zeros move every step (the format is rebuilt per step). 2:4 semi-structured sparsity needs at "
            f"most 2 non-zeros in every group of 4: not observable from sketches (goblin opscope probes).",
            {"density": r["density"]}, _sql_density(r["run_id"], r["site"], "lhs")))
    if patterns is not None and len(patterns):
        for r in patterns[patterns["finding"].isin(["two_four", "low_rank"])].itertuples(index=False):
            out.append(TensorFinding(
                "probe_structure", "info", "inference", str(r.site), str(r.role), None, None,
                f"Host probe: {r.finding.replace('_', ' ')} (score {r.score:.2f}) on `{r.site}`: a structured "
                f"(2:4) or factored kernel for a model served after training.", {"score": float(r.score)},
                f"SELECT score FROM patterns WHERE run_id = {_q(r.run_id)} AND site = {_q(r.site)} "
                f"AND finding = {_q(r.finding)}"))
    ctx = ({"min_density": float(lhs["density"].min()), "sparse_sites": int(len(sparse))} if len(lhs) else {})
    return out, ctx


def tensor_findings(sketches: pd.DataFrame | None, patterns: pd.DataFrame | None = None, *,
                    precision: str | None = None, device: dict[str, Any] | None = None,
                    sketch_warmup: int = SKETCH_WARMUP) -> TensorFindings:
    """Graded findings from one audit's sketch rows and mined patterns.

    Parameters
    ----------
    sketches
        Rows of the ``sketches`` table (run_id, site, role, step, stat, idx,
        value, numel, ...); None or empty for a replay (no findings).
    patterns
        Rows of the ``patterns`` table of the same run (stationary/drifting
        evidence for the frozen base; probe findings ``two_four``/``low_rank``).
    precision
        The parsed config's precision (``fp16``/``bf16``/``fp32``/None), used
        when the operands' sampled values do not decide (:func:`run_format`).
    device
        ``device.*`` facts (:func:`goblin_assets.runners.devices.device_facts`):
        FP8 readiness is stated only when ``device["fp8"]`` is true.
    sketch_warmup
        Unrecorded warm-up steps before the first recorded step (training steps).

    Returns
    -------
    TensorFindings
        Empty (falsy) when there are no sketches.
    """
    if sketches is None or not len(sketches):
        return TensorFindings([], pd.DataFrame(), "unknown", notes=["No tensors were sketched (a replay records none)."])
    t = site_table(sketches)
    if t.empty:
        return TensorFindings([], t, "unknown", notes=["No matmul operand was sketched."])
    fmt = run_format(t, precision)
    notes: list[str] = []
    findings, ctx, where = _precision_findings(t, fmt, sketch_warmup, _nonfinite_ranks(patterns))
    if fmt == "bf16":
        notes.append("bf16 run: its range is fp32's; see the fp16 column of the SQL for what fp16 would hold.")
    fp8, fctx = _fp8_findings(t, device, sketch_warmup, notes)
    frozen, zctx = _frozen_findings(sketches, patterns, fmt, sketch_warmup, notes)
    sparse, sctx = _sparsity_findings(t, patterns, sketch_warmup)
    for group, c, f in (("fp8", fctx, fp8), ("frozen_base", zctx, frozen), ("sparsity", sctx, sparse)):
        if c:
            ctx[group] = c
            if f:
                where[group] = f"`{f[0].site}` ({f[0].role})" + (
                    f", training step {f[0].train_step}" if f[0].train_step is not None else "")
    notes.append("Shares of values below fp16's smallest normal (2**-14) or rounding to zero (< 2**-25) are "
                 "bounds from the 32-bin histogram of x / max|x| (bins max|x|/16 wide): the sketches hold no "
                 "log-magnitude histogram. 2:4 feasibility and effective rank need host probes.")
    return TensorFindings(findings + fp8 + frozen + sparse, t, fmt, ctx, where, notes)


# ----------------------------------------------------------------------------- rendering

_ORDER = {"high": 0, "medium": 1, "info": 2}


def _rows(tf: TensorFindings) -> list[TensorFinding]:
    """Findings in report order (severity, then kind), at most REPORT_ROWS site rows per kind."""
    seen: dict[str, int] = {}
    out = []
    for f in sorted(tf.findings, key=lambda f: (_ORDER.get(f.severity, 3), f.finding)):
        seen[f.finding] = seen.get(f.finding, 0) + 1
        if seen[f.finding] <= REPORT_ROWS:
            out.append(f)
    return out


def _numbers(f: TensorFinding) -> str:
    return ", ".join(f"{k} {_fmt(v)}" for k, v in f.numbers.items())


def _markdown(tf: TensorFindings) -> list[str]:
    if not tf.findings and not len(tf.sites):
        return []
    out = ["## Tensor findings", "",
           f"From the sketches of every forward matmul's operands ({len(tf.sites)} site/operand pairs; run format: "
           f"{tf.run_format}). Each number is reproduced by the SQL under it, on the warehouse's `sketches` and "
           f"`patterns` tables.", ""]
    shown = _rows(tf)
    if shown:
        out += ["| severity | finding | site | step | for | numbers |", "|---|---|---|---|---|---|"]
        for f in shown:
            step = "" if f.train_step is None else f"{f.train_step} (rec. {f.step})"
            out.append(f"| {f.severity} | {f.finding} | `{f.site}` ({f.role}) | {step} | {f.scope} | "
                       f"{_numbers(f)} |")
        hidden = len(tf.findings) - len(shown)
        if hidden:
            out.append(f"| | | | | | {hidden} more (in `goblin audit --json`, key tensor_findings) |")
        out.append("")
        for f in shown:
            out += [f"- **{f.finding}** at `{f.site}` ({f.role}): {f.text}", "", "  ```sql",
                    *["  " + ln for ln in f.sql.splitlines()], "  ```"]
        out.append("")
    out += [f"- {n}" for n in tf.notes] + [""]
    return out


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _html(tf: TensorFindings) -> str:
    if not tf.findings and not len(tf.sites):
        return ""
    parts = ['<section class="tensor-findings">', "<h2>Tensor findings</h2>",
             f"<p>From the sketches of every forward matmul's operands ({len(tf.sites)} site/operand pairs; run "
             f"format: {_e(tf.run_format)}). Each number is reproduced by the SQL under it.</p>"]
    shown = _rows(tf)
    if shown:
        parts.append("<table><tr><th>severity</th><th>finding</th><th>site</th><th>step</th><th>for</th>"
                     "<th>numbers</th></tr>")
        for f in shown:
            step = "" if f.train_step is None else f"{f.train_step} (rec. {f.step})"
            parts.append(f"<tr><td>{_e(f.severity)}</td><td>{_e(f.finding)}</td><td><code>{_e(f.site)}</code> "
                         f"({_e(f.role)})</td><td>{_e(step)}</td><td>{_e(f.scope)}</td><td>{_e(_numbers(f))}</td></tr>")
        parts.append("</table>")
        for f in shown:
            parts.append(f"<p><b>{_e(f.finding)}</b> at <code>{_e(f.site)}</code>: {_e(f.text.replace('`', ''))}</p>"
                         f'<pre class="diff">{_e(f.sql)}</pre>')
    parts += ["<ul>", *[f'<li class="muted">{_e(n)}</li>' for n in tf.notes], "</ul>", "</section>"]
    return "\n".join(parts)
