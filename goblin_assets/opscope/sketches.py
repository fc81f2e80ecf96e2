"""Sketches: cheap on-device reductions of a matmul operand or output.

Every function takes a tensor on any device and returns tensors on the same
device (no host transfer, no ``.item()``): the caller concatenates a step's
sketches and reads them back once.  A tensor ``x`` of shape ``(..., C)`` is
viewed as ``R = numel / C`` rows of ``C`` channels (a 0-d or 1-d tensor is one
row).  The sketch set, in the order of :data:`STATS`:

============  ==========================  ======================================================
stat          shape (``idx`` column)      definition
============  ==========================  ======================================================
min           scalar (0)                  smallest element
max           scalar (0)                  largest element
mean          scalar (0)                  sum(x) / numel
l1            scalar (0)                  sum |x|
sumsq         scalar (0)                  sum x²
nnz           scalar (0)                  number of exactly non-zero elements (nnz/numel = density)
kurtosis      scalar (0)                  Pearson kurtosis m4 / m2² of the centred values (3 for a
                                          Gaussian); 0 for a constant tensor
chan_outlier  scalar (0)                  max(chan_maxabs) / mean(chan_maxabs); 0 if all-zero
hist          (32,) (bin 0..31)           share of elements per bin of x / (max|x| + 1e-12) over
                                          [-1, 1] (scale-normalised; the shares sum to 1)
chan_maxabs   (C,) (channel)              max |x| over all but the last axis
pos_sumsq     (R,) or (n,) (row)          x² summed over the last axis, per row
adj_sumsq     (R-1,) or (n,) (row r)      |x[r+1] - x[r]|² summed over the last axis, per pair of
                                          adjacent rows (r, r+1)
sample        (min(numel,16),) (element)  x.flatten() at 16 fixed, evenly spaced flat positions
============  ==========================  ======================================================

Row sampling (the lever for the costly sketches).  With ``row_sample=n`` and
a tensor of more than ``n`` rows, every statistic except the extremes (min,
max, chan_maxabs, chan_outlier, always exact over the whole tensor) is
computed on ``n`` fixed, evenly spaced rows ``r_i = i * (R // n)`` (a strided
view: nothing is copied): the totals (mean, l1, sumsq, nnz) are scaled by
``R / n`` to the whole tensor,
``pos_sumsq`` and ``adj_sumsq`` report the sampled rows (their ``idx`` is the
real row number), ``hist`` and ``kurtosis`` describe the sampled elements.
The rows are fixed, so a tensor repeated exactly gives identical sketches
(stationarity stays detectable).  Stated error (measured on the seven sweep
distributions at 4096 x 384, ``n = 256``; pinned in
``tests/test_opscope_sketches.py``): density within 0.01 absolute, l1 and
sumsq within 3 % relative, hist within 0.05 in L1 distance, kurtosis within
10 % (light- and moderate-tailed distributions; a heavy tail's kurtosis is
dominated by its largest values and has no useful sampled estimate).  With
``row_sample=None`` everything is exact.

Source: statistics chosen after torch.ao observers (min/max, histogram),
SmoothQuant and LLM.int8() (per-channel absmax, outlier channels), H2O
(attention mass, in :mod:`goblin_assets.opscope.inject`); row sampling and its
error: measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: Scalar statistics of :func:`scalar_sketch`, in output order.
SCALAR_STATS: tuple[str, ...] = ("min", "max", "mean", "l1", "sumsq", "nnz")

#: The full sketch set, in output order of :func:`sketch_vector`.
STATS: tuple[str, ...] = SCALAR_STATS + (
    "kurtosis", "chan_outlier", "hist", "chan_maxabs", "pos_sumsq", "adj_sumsq", "sample")

#: A compact set with a fixed number of values per tensor (no per-row or
#: per-channel vectors): what the dispatcher tap records by default.
FIXED_STATS: tuple[str, ...] = SCALAR_STATS + ("kurtosis", "chan_outlier", "hist", "sample")

HIST_BINS = 32          # bins of the scale-normalised histogram over [-1, 1]
SAMPLE_ELEMENTS = 16    # fixed flat positions in ``sample``
ROW_SAMPLE = 256        # rows kept by the row-sampled sketches (measured error: module docstring)
_EPS = 1e-12            # scale normalisation guard: x / (max|x| + 1e-12)

_EXTREMES = frozenset({"min", "max", "chan_maxabs", "chan_outlier"})


class SketchError(ValueError):
    """An unknown statistic was requested (the message names it and the known ones)."""


def _check(stats: tuple[str, ...]) -> None:
    bad = [s for s in stats if s not in STATS]
    if bad:
        raise SketchError(f"unknown sketch statistic(s) {bad}; known: {list(STATS)}")


def rows_channels(shape: tuple[int, ...] | torch.Size) -> tuple[int, int]:
    """``(R, C)``: the row/channel view of a tensor of ``shape`` (C = last axis, R = numel / C)."""
    shape = tuple(int(s) for s in shape)
    c = shape[-1] if shape else 1
    numel = int(np.prod(shape)) if shape else 1
    return (numel // c if c else 0), c


def row_stride(n_rows: int, row_sample: int | None) -> int:
    """Stride ``s = R // n`` of the sampled rows ``0, s, 2s, ... (n-1)s``; 1 when all rows are used."""
    if row_sample is None or n_rows <= row_sample:
        return 1
    return n_rows // row_sample


def sampled_rows(n_rows: int, row_sample: int | None) -> np.ndarray:
    """The rows the row-sampled sketches read: ``i * (R // n)`` for ``i < n``, or all ``R`` rows.

    Shapes: ``(min(R, n),)`` int64.  A strided view, so sampling copies nothing.
    """
    s = row_stride(n_rows, row_sample)
    n = n_rows if s == 1 else row_sample
    return np.arange(n, dtype=np.int64) * s


def sample_positions(numel: int) -> np.ndarray:
    """Flat positions of the ``sample`` stat: evenly spaced, first and last included."""
    k = min(numel, SAMPLE_ELEMENTS)
    if k <= 1:
        return np.zeros(k, dtype=np.int64)
    return (np.arange(k, dtype=np.int64) * (numel - 1)) // (k - 1)


def sketch_layout(shape: tuple[int, ...] | torch.Size, stats: tuple[str, ...] = STATS,
                  row_sample: int | None = ROW_SAMPLE) -> list[tuple[str, np.ndarray]]:
    """``[(stat, idx), ...]`` in the order :func:`sketch_vector` emits values for ``shape``.

    ``idx`` (int64 array) is the ``idx`` column of each value: 0 for scalars,
    the bin, channel, row or flat element position for vectors (see the module
    table).  The layout depends on the shape only, so it is computed once per
    site on the host.

    Raises
    ------
    SketchError
        An unknown statistic name.
    """
    stats = tuple(stats)
    _check(stats)
    r, c = rows_channels(shape)
    numel = r * c
    rows = sampled_rows(r, row_sample)
    exact = row_stride(r, row_sample) == 1
    out = []
    for s in STATS:
        if s not in stats:
            continue
        if s in ("hist",):
            idx = np.arange(HIST_BINS, dtype=np.int64)
        elif s == "chan_maxabs":
            idx = np.arange(c if numel else 0, dtype=np.int64)
        elif s == "pos_sumsq":
            idx = rows
        elif s == "adj_sumsq":
            idx = rows[:-1] if exact else rows
        elif s == "sample":
            idx = sample_positions(numel)
        else:
            idx = np.zeros(1, dtype=np.int64)
        out.append((s, idx))
    return out


def sketch_length(shape: tuple[int, ...] | torch.Size, stats: tuple[str, ...] = STATS,
                  row_sample: int | None = ROW_SAMPLE) -> int:
    """Number of values :func:`sketch_vector` returns for a tensor of ``shape``."""
    return int(sum(len(i) for _, i in sketch_layout(shape, stats, row_sample)))


@dataclass
class _Pass:
    """The shared intermediates of one tensor's sketches, each computed at most once."""

    x2: torch.Tensor            # (R, C) view
    n: int                      # sampled rows
    stride: int                 # row stride of the sample (1: exact)

    _chan: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def scale(self) -> float:
        """R / n: sampled totals are scaled by it to the whole tensor."""
        return self.x2.shape[0] / self.n
    _xs: torch.Tensor | None = None
    _pos: torch.Tensor | None = None

    def chan(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel (min, max), exact: two column reductions (``aminmax(dim=0)`` is slower on CPU)."""
        if self._chan is None:
            self._chan = (self.x2.amin(0), self.x2.amax(0))
        return self._chan

    def xs(self) -> torch.Tensor:
        """The sampled rows ``(n, C)`` (all rows when exact)."""
        if self._xs is None:
            self._xs = self.x2 if self.stride == 1 else self.x2[: self.n * self.stride: self.stride]
        return self._xs

    def pos(self) -> torch.Tensor:
        """x² summed over channels for each (sampled) row, float32 ``(n,)``."""
        if self._pos is None:
            xs = self.xs()
            self._pos = torch.linalg.vector_norm(xs, 2, dim=-1, dtype=torch.float32).square()
        return self._pos

    def chan_maxabs(self) -> torch.Tensor:
        mn, mx = self.chan()
        return torch.maximum(mx.abs(), mn.abs()).float()


def _stat(p: _Pass, s: str, numel: int) -> torch.Tensor:
    """One statistic as a 1-d float64 tensor (see the module table)."""
    f64 = torch.float64
    if s == "min":
        v = p.chan()[0].min()
    elif s == "max":
        v = p.chan()[1].max()
    elif s == "mean":
        v = p.xs().sum(dtype=torch.float32).to(f64) * p.scale / numel
    elif s == "l1":
        v = torch.linalg.vector_norm(p.xs(), 1, dtype=torch.float32).to(f64) * p.scale
    elif s == "sumsq":
        v = p.pos().sum(dtype=f64) * p.scale
    elif s == "nnz":
        v = torch.count_nonzero(p.xs()).to(f64) * p.scale
    elif s == "kurtosis":
        xs = p.xs().float()
        d2 = (xs - xs.mean()).square_()
        m2 = d2.mean(dtype=f64)
        m4 = torch.linalg.vector_norm(d2, 2, dtype=torch.float32).to(f64).square() / d2.numel()
        v = torch.where(m2 > 0, m4 / torch.where(m2 > 0, m2, 1.0).square(), 0.0)
    elif s == "chan_outlier":
        cm = p.chan_maxabs()
        mean = cm.mean()
        v = torch.where(mean > 0, cm.max() / torch.where(mean > 0, mean, 1.0), 0.0)
    elif s == "hist":
        # bin of y = x / (max|x| + eps) in [-1, 1]: floor((y + 1) * 16), y = 1 in the last bin (as histc)
        scale = (HIST_BINS / 2) / (p.chan_maxabs().max() + _EPS)
        b = (p.xs().float() * scale + HIST_BINS / 2).long().clamp_(0, HIST_BINS - 1)
        v = torch.bincount(b.reshape(-1), minlength=HIST_BINS).to(f64) / max(b.numel(), 1)
    elif s == "chan_maxabs":
        v = p.chan_maxabs()
    elif s == "pos_sumsq":
        v = p.pos()
    elif s == "adj_sumsq":
        if p.stride == 1:
            d = p.x2[1:] - p.x2[:-1]
        else:
            d = p.x2[1: p.n * p.stride: p.stride] - p.xs()
        v = torch.linalg.vector_norm(d, 2, dim=-1, dtype=torch.float32).square()
    elif s == "sample":
        flat = p.x2.reshape(-1)
        v = flat.index_select(0, torch.as_tensor(sample_positions(numel), device=flat.device))
    else:  # pragma: no cover - _check rejects unknown names first
        raise SketchError(s)
    return v.reshape(-1).to(f64)


def sketch_vector(x: torch.Tensor, stats: tuple[str, ...] = STATS,
                  row_sample: int | None = ROW_SAMPLE) -> torch.Tensor:
    """All requested sketches of ``x`` concatenated into one vector, on ``x.device``.

    Shapes
    ------
    ``x``: any shape ``(..., C)``, any floating dtype (others are cast to
    float32).  Returns float64 ``(L,)`` with ``L = sketch_length(x.shape,
    stats, row_sample)``, values in the order of :func:`sketch_layout`.

    Units
    -----
    Those of ``x`` (min, max, mean, l1, chan_maxabs, sample), squared
    (sumsq, pos_sumsq, adj_sumsq), counts (nnz), shares (hist) and ratios
    (kurtosis, chan_outlier).

    Raises
    ------
    SketchError
        An unknown statistic name.

    Source
    ------
    Definitions: module table; row-sampling error: measured (module docstring).
    """
    stats = tuple(stats)
    _check(stats)
    x = x.detach()
    if not (x.is_floating_point()):
        x = x.float()
    r, c = rows_channels(x.shape)
    numel = r * c
    if numel == 0:
        return torch.zeros(sketch_length(x.shape, stats, row_sample), dtype=torch.float64, device=x.device)
    stride = row_stride(r, row_sample)
    n = r if stride == 1 else int(row_sample)
    p = _Pass(x.reshape(r, c), n, stride)
    return torch.cat([_stat(p, s, numel) for s in STATS if s in stats])


def scalar_sketch(x: torch.Tensor) -> torch.Tensor:
    """Scalar sketch of ``x``: min, max, mean, l1 (sum |x|), sumsq (sum x²), nnz.

    Shapes: any ``x`` -> float32 tensor of shape ``(6,)`` on ``x.device``, in
    the order of :data:`SCALAR_STATS`; exact (no row sampling).  ``nnz`` counts
    exact non-zeros (``nnz / numel`` is the density).
    """
    return sketch_vector(x, SCALAR_STATS, row_sample=None).float()


# ----------------------------------------------------------------- inference taps

#: Statistics of a softmax output (role ``probs``), in output order of :func:`probs_vector`.
PROBS_STATS: tuple[str, ...] = ("peak_prob", "key_mass")

#: Statistics of a top-k routing decision (role ``route``), in output order of :func:`route_vector`.
ROUTE_STATS: tuple[str, ...] = ("expert_load",)


def probs_layout(shape: tuple[int, ...] | torch.Size, dim: int = -1) -> list[tuple[str, np.ndarray]]:
    """``[(stat, idx), ...]`` of :func:`probs_vector` for softmax probabilities of ``shape``.

    ``peak_prob`` has one value per query position (idx = query), ``key_mass``
    one per key position (idx = key).
    """
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    d = dim % nd if nd else 0
    keys = shape[d] if nd else 1
    rest = [s for i, s in enumerate(shape) if i != d]
    queries = rest[-1] if rest else 1
    return [("peak_prob", np.arange(queries, dtype=np.int64)), ("key_mass", np.arange(keys, dtype=np.int64))]


def probs_vector(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Attention-concentration sketches of softmax probabilities ``p`` (softmax over ``dim``).

    With ``p`` moved to ``(..., Q, K)`` (K = the softmax axis, Q = the axis
    before it, leading axes such as batch and heads averaged over):

    * ``peak_prob[q] = mean over leading axes of max_k p[..., q, k]``: how
      concentrated each query's attention is (1 = all mass on one key);
    * ``key_mass[k] = mean over leading axes of sum_q p[..., q, k]``: the
      attention mass each key receives (H2O's accumulated attention score;
      padded keys receive ~0, attention sinks receive a lot).

    Shapes: ``p`` of any shape with at least one axis -> float64 ``(Q + K,)``
    on ``p.device``, in the order of :func:`probs_layout`.

    Source: H2O (Zhang et al., 2023, "Heavy-Hitter Oracle"), accumulated
    attention scores; StreamingLLM (Xiao et al., 2023) attention sinks.
    """
    p = p.detach().float()
    if p.dim() == 0:
        p = p.reshape(1)
    p = p.movedim(dim, -1)
    if p.dim() == 1:
        p = p.unsqueeze(0)
    q, k = p.shape[-2], p.shape[-1]
    p = p.reshape(-1, q, k)
    peak = p.amax(-1).mean(0)
    mass = p.sum(-2).mean(0)
    return torch.cat((peak, mass)).to(torch.float64)


def route_layout(n_experts: int) -> list[tuple[str, np.ndarray]]:
    """``[("expert_load", idx)]`` of :func:`route_vector`: one value per expert (idx = expert)."""
    return [("expert_load", np.arange(n_experts, dtype=np.int64))]


def route_vector(topk_out: tuple[torch.Tensor, torch.Tensor] | torch.Tensor, n_experts: int) -> torch.Tensor:
    """Per-expert load of a top-k routing decision.

    ``topk_out`` is ``torch.topk``'s ``(values, indices)`` (or the indices
    alone); ``expert_load[e]`` is the share of all (token, choice) assignments
    that go to expert ``e`` (the shares sum to 1).

    Shapes: indices of any shape, values in ``[0, n_experts)`` -> float64
    ``(n_experts,)`` on the indices' device.

    Source: Switch Transformer (Fedus et al., 2021) load-balancing statistics.
    """
    idx = topk_out[1] if isinstance(topk_out, (tuple, list)) else topk_out
    idx = idx.detach().reshape(-1)
    counts = torch.bincount(idx, minlength=n_experts)[:n_experts].to(torch.float64)
    return counts / max(idx.numel(), 1)
