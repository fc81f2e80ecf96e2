"""Host probes on dumped tensors: what the on-device sketches cannot see.

Sketches are one-pass reductions; some structure needs the whole tensor on the
host: whether magnitude 2:4 pruning keeps it, how many distinct values it
holds, its effective rank, and how few bits quantise it.  Tensors are dumped
with safetensors (:func:`save_tensor` / :func:`load_tensor`) so that a probe
can run later, elsewhere, or on tensors another program wrote.

Each probe is a function ``tensor -> dict`` (numbers with unit-suffixed keys);
:func:`probe_tensor` runs them all and :func:`probe_findings` turns the numbers
into findings with the thresholds below.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch

from goblin_assets.errors import GoblinError
from goblin_assets.warehouse.tables import columns

#: 2:4 feasibility: relative Frobenius error of magnitude top-2-of-4 pruning below this.
#: Source: issue 7 (harness threshold); NVIDIA's 2:4 recipe (Mishra et al. 2021,
#: "Accelerating Sparse Deep Neural Networks") prunes by magnitude, 2 of every 4.
TWO_FOUR_MAX_REL_ERR = 0.10
#: At most this many distinct values after snapping -> a lookup table (5-bit index).  Source: issue 7.
LUT_MAX_DISTINCT = 32
#: Snapping grid for cardinality: ``absmax * 2**-SNAP_BITS`` (values closer than
#: this are one value).  Source: goblin's choice (finer than any 8-bit grid).
SNAP_BITS = 12
#: Stable rank below this fraction of the column count -> factored matmul.  Source: issue 7.
LOW_RANK_FRACTION = 0.1
#: Bit widths probed, and the relative error a width must stay under to be usable.
#: Source: issue 7 (3/4/6/8 bits, 2% error).
QUANT_BITS = (3, 4, 6, 8)
QUANT_MAX_REL_ERR = 0.02
#: Intra-op threads of a probe.  One: on a shared 2-core machine the float64 SVD of a 949 x 1536
#: activation took 0.8 s on one thread and 7.9 s on two (OpenMP waiting on a busy core).  Source: measured.
PROBE_THREADS = 1


class ProbeError(GoblinError):
    """A tensor file is missing, unreadable, or a probe got a tensor it cannot handle."""


def save_tensor(path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> Path:
    """Dump named tensors to a safetensors file (contiguous CPU copies).

    Parameters
    ----------
    path : file to write (parents are created).
    tensors : name -> tensor; any device and dtype safetensors supports.
    metadata : optional string -> string header entries (e.g. the site and role).

    Returns
    -------
    Path
        The written file.

    Source
    ------
    safetensors (``safetensors.torch.save_file``).
    """
    from safetensors.torch import save_file

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(p),
              metadata=dict(metadata or {}))
    return p


def load_tensor(path: str | Path, name: str | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
    """Load one tensor (``name``) or all tensors of a safetensors file.

    Raises
    ------
    ProbeError
        The file is missing or not a safetensors file, or ``name`` is not in it
        (the message names the file and the tensors it holds).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    try:
        all_t = load_file(str(p))
    except (OSError, SafetensorError) as exc:
        raise ProbeError(f"{p}: cannot read safetensors file: {exc}") from None
    if name is None:
        return all_t
    if name not in all_t:
        raise ProbeError(f"{p}: no tensor {name!r} (has {sorted(all_t)})")
    return all_t[name]


def _as_matrix(t: torch.Tensor) -> torch.Tensor:
    """A float64 2-D view: leading axes folded into rows, the last axis is columns."""
    if t.dim() == 0:
        raise ProbeError("probe needs a tensor with at least one axis, got a scalar")
    x = t.detach().to("cpu", torch.float64)
    return x.reshape(1, -1) if x.dim() == 1 else x.reshape(-1, x.shape[-1])


def two_four(t: torch.Tensor) -> dict:
    """2:4 structured-sparsity feasibility along the last axis (the GEMM reduction axis of a weight).

    Keeps the 2 largest magnitudes of every group of 4 consecutive elements and
    measures what is lost.

    Shapes
    ------
    any ``(..., C)``; a trailing group shorter than 4 is padded with zeros.

    Returns
    -------
    dict
        ``rel_err`` (‖x − prune(x)‖_F / ‖x‖_F), ``is_2_4`` (every group already
        has at most 2 non-zeros), ``feasible`` (``rel_err < 0.10``).
    """
    x = _as_matrix(t)
    pad = (-x.shape[1]) % 4
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    g = x.reshape(-1, 4)
    keep = torch.zeros_like(g, dtype=torch.bool)
    keep.scatter_(1, g.abs().topk(2, dim=1).indices, True)
    pruned = torch.where(keep, g, torch.zeros_like(g))
    norm = float(g.norm())
    rel = float((g - pruned).norm()) / norm if norm > 0 else 0.0
    return {"rel_err": rel, "is_2_4": bool(((g != 0).sum(1) <= 2).all()),
            "feasible": rel < TWO_FOUR_MAX_REL_ERR}


def cardinality(t: torch.Tensor, snap_bits: int = SNAP_BITS) -> dict:
    """Distinct values after snapping to a grid of ``absmax * 2**-snap_bits``.

    Returns
    -------
    dict
        ``distinct`` (count after snapping), ``distinct_exact`` (before),
        ``lut`` (``distinct <= 32``: a 5-bit lookup table represents it).
    """
    x = t.detach().to("cpu", torch.float64).reshape(-1)
    amax = float(x.abs().max()) if x.numel() else 0.0
    step = amax * 2.0**-snap_bits if amax > 0 else 1.0
    snapped = torch.round(x / step)
    distinct = int(torch.unique(snapped).numel())
    return {"distinct": distinct, "distinct_exact": int(torch.unique(x).numel()),
            "lut": distinct <= LUT_MAX_DISTINCT}


def effective_rank(t: torch.Tensor) -> dict:
    """Entropy effective rank, stable rank, and whether a factored matmul would pay.

    Shapes
    ------
    ``(..., C)`` is read as a matrix ``(rows, C)``.

    Returns
    -------
    dict
        ``erank`` = exp(H(p)), p_i = σ_i / Σσ (Roy & Vetterli 2007, "The
        effective rank"); ``stable_rank`` = ‖A‖_F² / ‖A‖_2² (Rudelson &
        Vershynin 2007); ``cols``; ``rank_10pct``: the smallest rank r whose
        best rank-r approximation (Eckart–Young) has ‖A − A_r‖_F / ‖A‖_F < 10%;
        ``factored_cost``: r·(rows + cols) / (rows·cols), the multiply-adds of
        ``(x @ U_r) @ V_r`` relative to ``x @ A``; ``low_rank``: stable rank
        < 0.1 · cols (issue 7) **and** ``factored_cost < 1``.  The stable rank
        alone also flags a full-rank matrix with one dominant direction (an
        outlier feature), which a factored matmul cannot replace.

    Source
    ------
    Roy & Vetterli, EUSIPCO 2007; Rudelson & Vershynin, J. ACM 54(4) 2007;
    the 10% error bound: goblin's choice (the 2:4 probe's bound).
    """
    a = _as_matrix(t)
    s = torch.linalg.svdvals(a)
    rows, cols = int(a.shape[0]), int(a.shape[1])
    if float(s.sum()) == 0.0:
        return {"erank": 0.0, "stable_rank": 0.0, "cols": cols, "rank_10pct": 0, "factored_cost": 0.0,
                "low_rank": True}
    p = s / s.sum()
    p = p[p > 0]
    erank = float(torch.exp(-(p * p.log()).sum()))
    e = s**2
    stable = float(e.sum() / e[0])
    tail = (e.sum() - torch.cumsum(e, 0)).clamp_min(0).sqrt() / e.sum().sqrt()   # error keeping the first i+1
    r10 = int((tail < TWO_FOUR_MAX_REL_ERR).nonzero()[0, 0]) + 1
    cost = r10 * (rows + cols) / (rows * cols)
    return {"erank": erank, "stable_rank": stable, "cols": cols, "rank_10pct": r10, "factored_cost": cost,
            "low_rank": stable < LOW_RANK_FRACTION * cols and cost < 1.0}


def quant_error(t: torch.Tensor, bits: int, per_channel: bool, channel_axis: int = 0) -> float:
    """Relative Frobenius error of symmetric uniform quantisation at ``bits`` bits.

    Scale = absmax / (2**(bits-1) − 1) over the whole tensor (``per_channel=False``)
    or per slice along ``channel_axis`` (a weight's output rows: axis 0; an
    activation's features: axis -1, as SmoothQuant and LLM.int8() index them).

    Units
    -----
    dimensionless: ‖x − dequant(quant(x))‖_F / ‖x‖_F.

    Source
    ------
    symmetric per-tensor / per-channel quantisation as in torch.ao observers
    (``MinMaxObserver`` / ``PerChannelMinMaxObserver`` with ``qscheme`` symmetric).
    """
    x = t.detach().to("cpu", torch.float64)
    if x.dim() == 0:
        raise ProbeError("quant_error needs a tensor with at least one axis")
    qmax = 2 ** (bits - 1) - 1
    if per_channel and x.dim() >= 2:
        ax = channel_axis % x.dim()
        dims = tuple(d for d in range(x.dim()) if d != ax)
        amax = x.abs().amax(dim=dims, keepdim=True)
    else:
        amax = x.abs().max()
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = torch.clamp(torch.round(x / scale), -qmax, qmax) * scale
    norm = float(x.norm())
    return float((x - q).norm()) / norm if norm > 0 else 0.0


def quant_profile(t: torch.Tensor, channel_axis: int = 0) -> dict:
    """Quantisation error at 3/4/6/8 bits, per tensor and per channel, and the smallest usable width.

    Returns
    -------
    dict
        ``err_{tensor|channel}_{bits}b`` for each width, and
        ``min_bits_tensor`` / ``min_bits_channel``: the smallest width whose
        error is under 2% (``None`` when even 8 bits is not).
    """
    out: dict = {}
    for gran, pc in (("tensor", False), ("channel", True)):
        best = None
        for b in QUANT_BITS:
            e = quant_error(t, b, pc, channel_axis)
            out[f"err_{gran}_{b}b"] = e
            if best is None and e < QUANT_MAX_REL_ERR:
                best = b
        out[f"min_bits_{gran}"] = best
    return out


def probe_tensor(t: torch.Tensor, channel_axis: int = 0, threads: int | None = PROBE_THREADS) -> dict:
    """All probes on one tensor: :func:`two_four`, :func:`cardinality`, :func:`effective_rank`, :func:`quant_profile`.

    Runs with ``threads`` intra-op threads (restored afterwards; ``None``
    keeps the process setting).

    Returns
    -------
    dict
        ``shape``, ``dtype`` and the probes' numbers under ``two_four``,
        ``cardinality``, ``rank`` and ``quant``.
    """
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                "two_four": two_four(t), "cardinality": cardinality(t), "rank": effective_rank(t),
                "quant": quant_profile(t, channel_axis)}
    finally:
        torch.set_num_threads(old)


def probe_findings(results: Mapping[str, dict], run_id: str = "probe", workload: str = "probe",
                   roles: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Findings (``patterns`` rows) from :func:`probe_tensor` results keyed by tensor name.

    One row per tensor and probe that fires: ``two_four`` (feasible 2:4, score
    1 − rel_err/0.10), ``quantize_lut`` (≤ 32 distinct values), ``low_rank``
    (score 1 − factored_cost), ``int_quant`` (smallest width under 2%,
    score (8 − bits)/8 ... the fewer bits the higher); a tensor where nothing
    fires gets ``dense_full_rank`` with its numbers, so silence is never ambiguous.
    """
    roles = roles or {}
    rows = []
    for name, r in results.items():
        role = roles.get(name, "rhs" if name.endswith("weight") else "lhs")
        ev = json.dumps(r, default=float)
        hit = False
        if r["two_four"]["feasible"]:
            rows.append((name, role, "two_four", 1 - r["two_four"]["rel_err"] / TWO_FOUR_MAX_REL_ERR, ev))
            hit = True
        if r["cardinality"]["lut"]:
            rows.append((name, role, "quantize_lut", 1 - r["cardinality"]["distinct"] / (LUT_MAX_DISTINCT + 1), ev))
            hit = True
        if r["rank"]["low_rank"]:
            rows.append((name, role, "low_rank", 1 - r["rank"]["factored_cost"], ev))
            hit = True
        bits = [b for b in (r["quant"]["min_bits_channel"], r["quant"]["min_bits_tensor"]) if b is not None]
        if bits:
            rows.append((name, role, "int_quant", (8 - min(bits) + 1) / 8, ev))
            hit = True
        if not hit:
            rows.append((name, role, "dense_full_rank", 0.0, ev))
    return pd.DataFrame([{"run_id": run_id, "workload": workload, "site": s, "role": ro, "finding": f,
                          "score": float(max(0.0, min(1.0, sc))), "evidence_json": e} for s, ro, f, sc, e in rows],
                        columns=columns("patterns"))


def probe_frame(results: Mapping[str, dict], run_id: str = "probe") -> pd.DataFrame:
    """Long ``probes`` rows (run_id, tensor, probe, metric, value) of :func:`probe_tensor` results."""
    rows = []
    for name, r in results.items():
        for probe in ("two_four", "cardinality", "rank", "quant"):
            for metric, v in r[probe].items():
                if v is None or isinstance(v, (list, str)):
                    continue
                val = float(v)
                if math.isfinite(val):
                    rows.append({"run_id": run_id, "tensor": name, "shape": "x".join(map(str, r["shape"])),
                                 "dtype": r["dtype"], "probe": probe, "metric": metric, "value": val})
    return pd.DataFrame(rows, columns=columns("probes"))


def minilm_tensors(texts: list[str] | None = None, layers: tuple[int, ...] = (0, 5),
                   max_length: int = 64) -> dict[str, torch.Tensor]:
    """Real tensors of the packaged all-MiniLM-L6-v2: chosen weights and the activations entering them.

    Weights are the query and FFN weights of ``layers``; activations are the
    inputs of the FFN's first linear (``intermediate.dense``) and second linear
    (``output.dense``, post-GELU) on ``texts`` (default: standard-library
    docstrings, real English shipped with Python).

    Shapes
    ------
    weights ``(out, in)``; activations ``(tokens, features)`` (padding removed).
    """
    from goblin_assets.opscope.infer import load_minilm, stdlib_texts

    model, tok = load_minilm()
    texts = texts or stdlib_texts(16)
    enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    keep = enc["attention_mask"].reshape(-1).bool()
    out: dict[str, torch.Tensor] = {}
    hooks = []
    for li in layers:
        layer = model.encoder.layer[li]
        for key, mod in ((f"encoder.layer.{li}.intermediate.dense.input", layer.intermediate.dense),
                         (f"encoder.layer.{li}.output.dense.input", layer.output.dense)):
            hooks.append(mod.register_forward_pre_hook(
                lambda m, a, key=key: out.__setitem__(key, a[0].detach().reshape(-1, a[0].shape[-1])[keep])))
        for pname in ("attention.self.query.weight", "intermediate.dense.weight", "output.dense.weight"):
            out[f"encoder.layer.{li}.{pname}"] = layer.get_parameter(pname).detach().clone()
    try:
        with torch.no_grad():
            model(**enc)
    finally:
        for h in hooks:
            h.remove()
    return out


def probe_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict]:
    """:func:`probe_tensor` on every named tensor: weights per output row (axis 0), activations per feature.

    A name ending ``.input`` is an activation (probed along axis −1, its
    features); any other is a weight (axis 0, its output rows).
    """
    return {n: probe_tensor(t, channel_axis=-1 if n.endswith(".input") else 0) for n, t in tensors.items()}


def probe_file(path: str | Path) -> dict[str, dict]:
    """:func:`probe_tensors` on every tensor of a safetensors file.  Raises ProbeError (unreadable file)."""
    return probe_tensors(load_tensor(path))
