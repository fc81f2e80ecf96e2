"""Sketches: cheap on-device reductions of a matmul operand or output.

Every function takes a tensor on any device and returns tensors on the same
device (no host transfer, no ``.item()``, index tensors built on the device):
the caller concatenates a step's sketches and reads them back once.  A tensor
``x`` of shape ``(..., C)`` is viewed as ``R = numel / C`` rows of ``C``
channels (a 0-d or 1-d tensor is one row).  The sketch set, in the order of
:data:`STATS`:

============  ===========================  =====================================================
stat          shape (``idx`` column)       definition
============  ===========================  =====================================================
min           scalar (0)                   smallest element
max           scalar (0)                   largest element
mean          scalar (0)                   sum(x) / numel
l1            scalar (0)                   sum |x|
sumsq         scalar (0)                   sum x²
nnz           scalar (0)                   number of non-zero elements (nnz/numel = density)
kurtosis      scalar (0)                   Pearson kurtosis m4 / m2² of the centred values (3 for
                                           a Gaussian); 0 for a constant tensor
chan_outlier  scalar (0)                   max(chan_maxabs) / mean(chan_maxabs); 0 if all-zero
hist          (32,) (bin 0..31)            share of elements per bin of x / (max|x| + 1e-12) over
                                           [-1, 1] (scale-normalised; the shares sum to 1)
chan_maxabs   (C,) (channel)               max |x| over all but the last axis
pos_sumsq     (R,) or (n,) (row r)         x² summed over the last axis, per row
adj_sumsq     (R-1,) or (n,) (row r)       |x[r+1] - x[r]|² summed over the last axis, for the
                                           pair of adjacent rows (r, r+1)
far_sumsq     scalar (0)                   mean of |x[r+h] - x[r]|² over the pairs of rows h = R // 2
                                           apart: what adj_sumsq would be if row order did not
                                           matter (0 when R < 2)
sample        (min(numel, 16),) (element)  x.flatten() at 16 fixed, evenly spaced flat positions
nonfinite     (3,) (0 NaN, 1 +inf, 2 -inf)  number of NaN, +inf and -inf elements; exact
============  ===========================  =====================================================

Non-finite values are data (an fp16 overflow, a diverged run).  ``nonfinite``
counts them exactly over the whole tensor, and every other statistic keeps
its IEEE meaning over all elements, as torch computes it (both paths give the
same): ``min``, ``max``, ``chan_maxabs`` (per channel) and ``chan_outlier``
are NaN when a NaN is among their elements, else ``±inf`` when an inf is
(``chan_outlier`` is then inf/inf = NaN); sums (``mean``, ``sumsq``, ``l1``,
``pos_sumsq``, ``adj_sumsq``, ``far_sumsq``) follow float arithmetic (NaN
from a NaN or from +inf meeting -inf, else ``±inf``); ``nnz`` counts NaN and
inf as non-zero; ``kurtosis`` is NaN when the shape sample holds a non-finite
value; ``hist`` is NaN in every bin when ``max|x|`` is not finite (the scale
normalisation is undefined); ``sample`` holds the raw elements.  A non-finite
value outside the shape sample does not reach the sampled ``l1``, ``nnz``
and ``kurtosis`` (they then estimate the finite elements); ``hist`` is NaN
all the same, since ``max|x|`` is exact.  Finite values whose squares
overflow float32 give ``sumsq = inf`` with ``nonfinite`` all zero.  Cost: on
the CPU the counts are read off the exact tier (a tensor whose float32 sum is
finite holds no NaN or inf: zero extra passes) and counted by one more pass
only when it is not; on an accelerator, where branching on a device value
would synchronise, they are three more read-only reductions per tensor (not
measured: no accelerator here).

Exact and sampled.  With ``row_sample=None`` every statistic is exact.  With
``row_sample=n`` (default :data:`ROW_SAMPLE`) only read-only reductions touch
the whole tensor, and the costly sketches are computed at fixed positions
(so a tensor repeated exactly still gives identical sketches and
stationarity stays detectable):

* exact, over the whole tensor: ``min``, ``max``, ``chan_maxabs`` and
  ``chan_outlier`` (per-channel min and max), ``mean`` (a sum), ``sumsq`` and
  the per-row energies.  On the CPU (float32, float16, bfloat16) these come
  from one read of the tensor by the fused kernel
  (:mod:`goblin_assets.opscope.ckernel`, ``_sketch.c``), which also computes
  every sampled sketch below, so a sketch is one call instead of about a
  hundred small ops.  A dense permutation (attention's per-head views and
  ``K^T``) is read in place, in memory order; other strided tensors are
  copied contiguous first.  Elsewhere (CUDA, ROCm, float64, the kernel not
  built) the torch path below gives the same statistics with four read-only
  reductions and no temporary the size of the tensor; a tensor of at least 16 MiB is reduced in ~1 MiB chunks of rows
  (CPU, one intra-op thread); a wide view (C >= 512) takes its per-channel
  min/max in blocks of 16 rows; a strided last axis is copied contiguous
  (:func:`_row_chunks`, :func:`_chan_minmax`).  The two paths agree to
  float32 summation order (``tests/test_opscope_ckernel.py``).
  ``pos_sumsq`` reports the exact energies of ``n`` fixed rows
  ``r_i = i * (R // n)`` when ``R > n`` (``idx`` is the real row),
  ``adj_sumsq`` the exact differences of the pairs ``(r_i, r_i + 1)`` and
  ``far_sumsq`` the mean difference of the pairs ``(r_i, r_i + R // 2)``
  with ``r_i < R - R // 2`` (strided views of a contiguous tensor: nothing is
  copied);
* the shape sample, at most :data:`SHAPE_SAMPLE` elements, every ``s``-th
  flat element with ``s >= numel / SHAPE_SAMPLE`` coprime with ``C`` (every
  channel is visited, rows are covered evenly): ``hist``, ``kurtosis``, and
  ``l1`` and ``nnz`` scaled by ``numel / count``.

Why: on the CPU a temporary the size of an activation (``abs``, a comparison)
costs more than a reduction (fresh pages), and ``count_nonzero`` is ~20x
slower than a sum on sparse data (measured), so the exact tier is what
read-only reductions give; and each read of an activation that no longer
fits in cache costs a trip to DRAM, hence one fused read on the CPU.  A
per-channel max over sampled rows was tried and rejected: on Student-t data
it doubled ``chan_outlier`` past the miner's threshold of 6 (a false outlier
finding).  Stated error of the
sampled sketches (measured on the seven sweep distributions at 4096 x 384;
pinned in ``tests/test_opscope_sketches.py``): density (nnz/numel) within 0.01
absolute, l1 within 3 %, far_sumsq within 10 % of its mean over all row pairs
(measured at most 6.4 %, on low-rank data), hist within 0.05 in L1 distance, kurtosis within 10 % when
it is below 10 (light and moderate tails; a heavy tail's kurtosis, e.g.
Student-t or a few outlier channels, is dominated by its few largest values
and has no useful sampled estimate: read ``max`` and ``chan_outlier``, which
are exact).

Source: statistics after torch.ao observers (min/max, histogram),
SmoothQuant and LLM.int8() (per-channel absmax, outlier channels), H2O and
StreamingLLM (attention mass, :func:`probs_vector`); sampling and its error:
measured.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from goblin_assets.opscope import ckernel

#: Scalar statistics of :func:`scalar_sketch`, in output order.
SCALAR_STATS: tuple[str, ...] = ("min", "max", "mean", "l1", "sumsq", "nnz")

#: The full sketch set, in output order of :func:`sketch_vector`.
STATS: tuple[str, ...] = SCALAR_STATS + (
    "kurtosis", "chan_outlier", "hist", "chan_maxabs", "pos_sumsq", "adj_sumsq", "far_sumsq", "sample", "nonfinite")

#: A compact set with a fixed number of values per tensor (no per-row or
#: per-channel vectors): what the dispatcher tap records by default.
FIXED_STATS: tuple[str, ...] = SCALAR_STATS + ("kurtosis", "chan_outlier", "hist", "sample", "nonfinite")

#: ``idx`` of the ``nonfinite`` counts, in output order.
NONFINITE_KINDS: tuple[str, ...] = ("nan", "posinf", "neginf")

HIST_BINS = 32          # bins of the scale-normalised histogram over [-1, 1]
SAMPLE_ELEMENTS = 16    # fixed flat positions in ``sample``
ROW_SAMPLE = 256        # rows reported by pos_sumsq / adj_sumsq (measured error: module docstring)
SHAPE_SAMPLE = 16384    # elements behind hist / kurtosis (binomial s.e. of a bin share <= 0.004)
_EPS = 1e-12            # scale normalisation guard: x / (max|x| + 1e-12)
_TINY64 = torch.finfo(torch.float64).tiny   # kurtosis denominator guard (0 / tiny = 0 for a constant tensor)
_BLOCK = 16             # rows per block of the blocked per-channel min/max (:func:`_chan_minmax`)
_BLOCK_MIN_C = 512      # channel count from which the blocked reduction is faster (measured)
_CHUNK_BYTES = 1 << 20  # rows of a large tensor are reduced in chunks of about 1 MiB (:func:`_row_chunks`)
_CHUNK_MIN_BYTES = 16 << 20   # from this size (measured)
_COPY_MIN_NUMEL = 65536  # strided last axis: copied from this size (K^T 1.5 M: 6.5 -> 5.5 ms; not tuned)


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
    numel = math.prod(shape)
    return (numel // c if c else 0), c


def sampled_rows(n_rows: int, row_sample: int | None) -> np.ndarray:
    """Rows reported by ``pos_sumsq``: ``i * (R // n)`` for ``i < n`` when ``R > n``, else all rows.

    Shapes: ``(min(R, n),)`` int64.
    """
    if row_sample is None or n_rows <= row_sample:
        return np.arange(n_rows, dtype=np.int64)
    return np.arange(row_sample, dtype=np.int64) * (n_rows // row_sample)


def shape_sample(numel: int, channels: int, row_sample: int | None) -> tuple[int, int]:
    """``(stride, count)`` of the flat elements behind ``hist`` and ``kurtosis``.

    All elements when ``row_sample`` is None or ``numel <= SHAPE_SAMPLE``;
    else the smallest stride ``s >= numel / SHAPE_SAMPLE`` coprime with the
    channel count (no channel is skipped by aliasing), ``count = numel // s``
    capped at :data:`SHAPE_SAMPLE`.
    """
    if row_sample is None or numel <= SHAPE_SAMPLE:
        return 1, numel
    s = -(-numel // SHAPE_SAMPLE)
    while math.gcd(s, max(channels, 1)) != 1:
        s += 1
    return s, min(numel // s, SHAPE_SAMPLE)


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
    rows = sampled_rows(r, row_sample) if numel else np.zeros(0, dtype=np.int64)
    out = []
    for s in STATS:
        if s not in stats:
            continue
        if s == "hist":
            idx = np.arange(HIST_BINS, dtype=np.int64)
        elif s == "chan_maxabs":
            idx = np.arange(c if numel else 0, dtype=np.int64)
        elif s == "pos_sumsq":
            idx = rows
        elif s == "adj_sumsq":
            idx = paired_rows(r, 1, row_sample)
        elif s == "sample":
            idx = sample_positions(numel)
        elif s == "nonfinite":
            idx = np.arange(len(NONFINITE_KINDS), dtype=np.int64)
        else:
            idx = np.zeros(1, dtype=np.int64)
        out.append((s, idx))
    return out


def sketch_length(shape: tuple[int, ...] | torch.Size, stats: tuple[str, ...] = STATS,
                  row_sample: int | None = ROW_SAMPLE) -> int:
    """Number of values :func:`sketch_vector` returns for a tensor of ``shape`` (cached per shape)."""
    return _length(tuple(int(s) for s in shape), tuple(stats), row_sample)


@functools.lru_cache(maxsize=4096)
def _length(shape: tuple[int, ...], stats: tuple[str, ...], row_sample: int | None) -> int:
    return int(sum(len(i) for _, i in sketch_layout(shape, stats, row_sample)))


def paired_rows(n_rows: int, lag: int, row_sample: int | None) -> np.ndarray:
    """First rows ``r`` of the row pairs ``(r, r + lag)`` behind ``adj_sumsq`` (lag 1) and ``far_sumsq``.

    The reported rows (:func:`sampled_rows`) with ``r + lag < R``.  Shapes: ``(k,)`` int64, ``k <= min(R, n)``.
    """
    rows = sampled_rows(n_rows, row_sample)
    return rows[rows + lag < n_rows]


def far_lag(n_rows: int) -> int:
    """Row distance of the ``far_sumsq`` pairs: ``R // 2`` (rows of unrelated samples or sequences), at least 1."""
    return max(n_rows // 2, 1)


@functools.lru_cache(maxsize=4096)
def _indices(shape: tuple[int, ...], device: torch.device, row_sample: int | None):
    """Device index tensors of one shape, each None when every row/element is used.

    ``(rows, pairs, shape_sample, sample_positions)``: flat reported rows;
    ``pairs`` maps each lag (1 and :func:`far_lag`) to the multi-indices
    (``torch.unravel_index``, so gathering works on any strides without
    copying the tensor) of the sampled pair rows ``r`` and ``r + lag``; then
    the multi-indices of the shape-sample elements and of the ``sample``
    positions.  Cached: built once per (shape, device, row_sample).
    """
    r, c = rows_channels(shape)
    lead = shape[:-1] if len(shape) > 1 else (1,)
    full = shape if shape else (1,)
    rows = pairs = shp = None
    if row_sample is not None and r > row_sample:
        rows = torch.as_tensor(sampled_rows(r, row_sample), device=device)
        pairs = {}
        for lag in (1, far_lag(r)):
            first = torch.as_tensor(paired_rows(r, lag, row_sample), device=device)
            pairs[lag] = (torch.unravel_index(first, lead), torch.unravel_index(first + lag, lead))
    stride, count = shape_sample(r * c, c, row_sample)
    if stride > 1:
        shp = torch.unravel_index(torch.arange(count, device=device) * stride, full)
    pos = torch.unravel_index(torch.as_tensor(sample_positions(r * c), device=device), full)
    return rows, pairs, shp, pos


def _row_pairs(x: torch.Tensor, x2: torch.Tensor | None, lag: int, row_sample: int | None, pairs):
    """``(a, b)``: rows ``r`` and ``r + lag`` of :func:`paired_rows`, each ``(k, C)``.

    Strided views of the ``(R, C)`` view ``x2`` when ``x`` is contiguous (nothing
    copied), gathered with the cached multi-indices otherwise.
    """
    r, c = rows_channels(x.shape)
    if pairs is None:                                 # every row is reported
        xr = x2 if x2 is not None else x.reshape(r, c)
        return xr[:r - lag], xr[lag:]
    if x2 is not None:
        k = len(paired_rows(r, lag, row_sample))
        st = r // row_sample
        return x2[: k * st: st], x2[lag: lag + k * st: st]
    first, second = pairs[lag]
    return x[first], x[second]


def sketch_vector(x: torch.Tensor, stats: tuple[str, ...] = STATS,
                  row_sample: int | None = ROW_SAMPLE, out: torch.Tensor | None = None) -> torch.Tensor:
    """All requested sketches of ``x`` concatenated into one vector, on ``x.device``.

    Shapes
    ------
    ``x``: any shape ``(..., C)``, any strides, any floating dtype (others are
    cast to float32).  Returns float64 ``(L,)`` with ``L = sketch_length(
    x.shape, stats, row_sample)``, values in the order of :func:`sketch_layout`;
    with ``out`` (float64 ``(L,)`` on ``x.device``, e.g. a slice of a step's
    packed vector) the values are written there and ``out`` is returned.

    Units
    -----
    Those of ``x`` (min, max, mean, l1, chan_maxabs, sample), squared
    (sumsq, pos_sumsq, adj_sumsq), counts (nnz, nonfinite), shares (hist)
    and ratios (kurtosis, chan_outlier).  A tensor holding NaN or inf: the
    module docstring says what each statistic is then.

    Raises
    ------
    SketchError
        An unknown statistic name, or ``out`` of the wrong length.

    Source
    ------
    Definitions: module table; sampling error: measured (module docstring).
    """
    stats = tuple(stats)
    _check(stats)
    x = x.detach()
    if not x.is_floating_point():
        x = x.float()
    r, c = rows_channels(x.shape)
    numel = r * c
    f32, f64 = torch.float32, torch.float64
    if numel == 0:
        return _into(torch.zeros(sketch_length(x.shape, stats, row_sample), dtype=f64, device=x.device), out)
    if out is not None and out.numel() != sketch_length(x.shape, stats, row_sample):
        raise SketchError(f"out has {out.numel()} values; the sketches of shape {tuple(x.shape)} have "
                          f"{sketch_length(x.shape, stats, row_sample)}")
    fused = _sketch_c(x, stats, row_sample, out)
    if fused is not None:
        return fused
    want = set(stats)
    if x.dim() >= 2 and x.stride(-1) != 1 and numel > _COPY_MIN_NUMEL and x.device.type == "cpu":
        x = x.contiguous()          # a strided last axis (K^T of attention): one copy, then fast reductions
    rows_i, pair_i, shape_i, pos_i = _indices(tuple(x.shape), x.device, row_sample)
    flat = x.reshape(-1) if x.is_contiguous() or shape_i is None else None
    x2 = x.view(r, c) if x.is_contiguous() else None              # the (R, C) view, when it is free
    xn = x2 if x2 is not None else (x if x.dim() >= 2 else x.reshape(1, -1))   # strided: reduce in place
    vals: dict[str, torch.Tensor] = {}

    # exact, over the whole tensor: read-only reductions, no temporary the size of x
    # (a large tensor in cache-sized chunks of rows: the four reductions re-read a chunk from L2, not DRAM)
    chan = None
    want_chan = bool(want & {"min", "max", "hist", "chan_maxabs", "chan_outlier"})
    want_rows = bool(want & {"sumsq", "pos_sumsq"})
    mins, maxs, sums, norms = [], [], [], []
    for part in _row_chunks(xn):
        if want_chan:
            mn, mx = _chan_minmax(part)
            mins.append(mn)
            maxs.append(mx)
        if "mean" in want:
            sums.append(part.sum(dtype=f32))
        if want_rows:
            norms.append(torch.linalg.vector_norm(part, 2, dim=-1, dtype=f32).reshape(-1))
    if want_chan:
        cmin, cmax = (mins[0], maxs[0]) if len(mins) == 1 else (torch.stack(mins).amin(0), torch.stack(maxs).amax(0))
        vals["min"], vals["max"] = cmin.min(), cmax.max()
        chan = torch.maximum(cmax, cmin.neg())        # max(|cmax|, |cmin|), since cmin <= cmax
        vals["chan_maxabs"] = chan
        # max / mean; 0 when all-zero (0 / tiny)
        vals["chan_outlier"] = chan.max() / chan.mean().clamp_min(_EPS)
    total = (sums[0] if len(sums) == 1 else torch.stack(sums).sum()) if sums else None
    if "mean" in want:
        vals["mean"] = total / numel
    if "nonfinite" in want:
        vals["nonfinite"] = _nonfinite_counts(x, xn, total)
    if want_rows:
        pos = (norms[0] if len(norms) == 1 else torch.cat(norms)).square_()
        vals["sumsq"] = pos.sum(dtype=f64)
        vals["pos_sumsq"] = pos if rows_i is None else pos[rows_i]

    # the row sample: rows r_i and r_i + lag (strided views of a contiguous x; gathered otherwise)
    for stat, lag in (("adj_sumsq", 1), ("far_sumsq", far_lag(r))):
        if stat in want:
            a, b = _row_pairs(x, x2, lag, row_sample, pair_i)
            d = torch.linalg.vector_norm(b.float() - a.float(), 2, dim=-1).square_()
            vals[stat] = d if stat == "adj_sumsq" else (d.mean() if d.numel() else torch.zeros((), device=x.device))

    # the shape sample: every s-th flat element (s coprime with C), totals scaled by numel / count
    if want & {"l1", "nnz", "hist", "kurtosis"}:
        if shape_i is None:
            ys = x.reshape(-1)
        elif flat is not None:
            st, cnt = shape_sample(numel, c, row_sample)
            ys = flat[: cnt * st: st]
        else:
            ys = x[shape_i]
        ys = ys.to(f64)
        scale = numel / ys.numel()
        a = ys.abs()
        vals["l1"] = a.sum() * scale
        vals["nnz"] = (ys != 0).sum(dtype=f64) * scale      # NaN is not zero (as in the kernel)
        if "kurtosis" in want:
            d = ys - ys.mean()
            d2 = d.mul_(d)                            # mul, not pow: pow(2) is ~2x slower on the CPU
            m2 = d2.mean()
            # m4 / m2^2; 0 for a constant tensor (m4 = 0 / tiny)
            vals["kurtosis"] = d2.mul_(d2).mean() / (m2 * m2).clamp_min(_TINY64)
        if "hist" in want:
            # bin of y = x / (max|x| + eps) in [-1, 1]: floor((y + 1) * 16); y = 1 goes to the last bin (as histc)
            absmax = chan.max().to(f64)
            b = (ys * ((HIST_BINS / 2) / (absmax + _EPS)) + HIST_BINS / 2).to(torch.int64).clamp_(0, HIST_BINS - 1)
            # scatter_add, not bincount: a fixed output size, so no device-to-host sync on CUDA
            ones = torch.full_like(ys, 1.0 / max(b.numel(), 1))
            hist = torch.zeros(HIST_BINS, dtype=f64, device=x.device).scatter_add_(0, b, ones)
            # no scale when max|x| is NaN or inf: every bin NaN (no host sync: a device-side select)
            vals["hist"] = torch.where(torch.isfinite(absmax), hist, torch.full_like(hist, math.nan))
    if "sample" in want:
        vals["sample"] = (x.reshape(1) if x.dim() == 0 else x)[pos_i]
    return _into(torch.cat([vals[s].reshape(-1).to(f64) for s in STATS if s in want]), out)


def _nonfinite_counts(x: torch.Tensor, xn: torch.Tensor, total: torch.Tensor | None) -> torch.Tensor:
    """``nonfinite`` of ``x``: float64 ``(3,)`` on ``x.device``, the numbers of NaN, +inf and -inf elements.

    On the CPU a finite float32 sum of the tensor (``total``: the mean's sum
    when it was computed; else one more read-only reduction of the ``(R, C)``
    view ``xn``) proves every element finite, so the counts are zero without
    a pass that compares elements; only a non-finite sum (or a sum of finite
    values that overflowed) pays for the three comparisons.  On an
    accelerator the comparisons always run: deciding on the sum would read it
    back to the host and synchronise the stream.
    """
    if x.device.type == "cpu":
        total = total if total is not None else xn.sum(dtype=torch.float32)
        if bool(torch.isfinite(total)):
            return torch.zeros(len(NONFINITE_KINDS), dtype=torch.float64)
    return torch.stack([x.isnan().sum(), (x == math.inf).sum(), (x == -math.inf).sum()]).to(torch.float64)


def _into(v: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``v``, or ``out`` holding a copy of it."""
    if out is None:
        return v
    return out.copy_(v)


def _dense_block(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """``N`` when a tensor is a permutation of a dense block that memory holds as ``(A, C, N)``, else None.

    ``C`` is the tensor's last (channel) axis, at stride ``N`` in memory: 1 for
    a contiguous tensor or a per-head view of one (``q.view(B, S, H, D).transpose(1, 2)``),
    ``H * D`` for attention's ``K^T``.  Dense: the strides, sorted, are the
    running products of the sizes (no gaps, no broadcast axes).
    """
    expect = 1
    for st, sz in sorted((st, sz) for sz, st in zip(shape, strides) if sz != 1):
        if st != expect:
            return None
        expect *= sz
    return strides[-1] if shape and shape[-1] != 1 else 1


def _offsets(index: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """Element offsets (int64) of the row-major flat indices ``index`` of a tensor of ``shape`` and ``strides``."""
    if not shape:
        return np.zeros(len(index), dtype=np.int64)
    multi = np.unravel_index(np.asarray(index, dtype=np.int64), shape)
    return np.sum([m.astype(np.int64) * st for m, st in zip(multi, strides)], axis=0, dtype=np.int64).reshape(-1)


@functools.lru_cache(maxsize=1024)
def _c_plan(shape: tuple[int, ...], strides: tuple[int, ...], stats: tuple[str, ...],
            row_sample: int | None) -> tuple | None:
    """Arguments of the fused kernel for one shape and layout (cached), or None when the layout is not dense.

    Row order is the tensor's (row-major over all but the last axis), memory
    may be any dense permutation (:func:`_dense_block`): each reported row and
    row pair is passed as element offsets, each row's energy as its index in
    the kernel's memory-order row sums.
    """
    n = _dense_block(shape, strides)
    if n is None:
        return None
    r, c = rows_channels(shape)
    numel = r * c
    lead, lead_st = shape[:-1], strides[:-1]
    contiguous = strides == tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))

    def starts(rows: np.ndarray) -> np.ndarray:
        return _offsets(rows, lead, lead_st) if lead else np.zeros(len(rows), dtype=np.int64)

    def i64(a) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a, dtype=np.int64))

    rep = starts(sampled_rows(r, row_sample))
    rep = (rep // (c * n)) * n + rep % n                   # memory-order row of each reported row
    lag = far_lag(r)
    adj, far = paired_rows(r, 1, row_sample), paired_rows(r, lag, row_sample)
    st, cnt = shape_sample(numel, c, row_sample)
    ss_off = None if contiguous else i64(_offsets(np.arange(cnt, dtype=np.int64) * st, shape, strides))
    want = sum(1 << i for i, s in enumerate(STATS) if s in stats)
    return (r, c, n, i64(rep), i64(starts(adj)), i64(starts(adj + 1)), i64(starts(far)), i64(starts(far + lag)),
            ss_off, st, cnt, i64(_offsets(sample_positions(numel), shape, strides)), want,
            sketch_length(shape, stats, row_sample))


def _sketch_c(x: torch.Tensor, stats: tuple[str, ...], row_sample: int | None,
              out: torch.Tensor | None = None) -> torch.Tensor | None:
    """:func:`sketch_vector` by the fused CPU kernel (:mod:`goblin_assets.opscope.ckernel`), else None.

    Used for a non-empty CPU tensor of float32 (float16/bfloat16 are widened
    first; float64 keeps the torch path and its precision) when the kernel is
    built.  A dense permutation (attention's per-head views and ``K^T``) is
    read in place, in memory order; any other strided tensor is copied
    contiguous first.  A tensor holding NaN or inf is sketched here too (one
    more pass counts them; module docstring).  Writes into ``out`` (a float64
    vector of the right length) when given.
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    cdll = ckernel.lib()
    if cdll is None:
        return None
    x = x.to(torch.float32)
    if x.dim() == 0:
        x = x.reshape(1)
    plan = _c_plan(tuple(x.shape), tuple(x.stride()), stats, row_sample)
    if plan is None:
        x = x.contiguous()
        plan = _c_plan(tuple(x.shape), tuple(x.stride()), stats, row_sample)
    r, c, n, rep, adj, adj2, far, far2, ss_off, st, cnt, pos, want, length = plan
    lo, hi, rsum, rsq = ckernel.rows(cdll, x, r // n, c, n)
    direct = out is not None and out.device.type == "cpu" and out.dtype == torch.float64 and out.is_contiguous()
    dst = out if direct else torch.empty(length, dtype=torch.float64)
    got = cdll.goblin_finish_f32(
        x.data_ptr(), r, c, n, lo, hi, rsum, rsq,
        rep.data_ptr(), rep.numel(), adj.data_ptr(), adj2.data_ptr(), adj.numel(), far.data_ptr(), far2.data_ptr(),
        far.numel(), None if ss_off is None else ss_off.data_ptr(), st, cnt, pos.data_ptr(), pos.numel(), want,
        ckernel.scratch(max(cnt, 1), torch.float64, "sample").data_ptr(), dst.data_ptr())
    if got < 0:         # refused by the kernel (not expected): the torch path gives the same values
        return None
    if got != length:   # the kernel and sketch_layout disagree: a bug, never silently misplaced values
        raise RuntimeError(f"fused sketch kernel wrote {got} values for shape {tuple(x.shape)}, layout has {length}")
    return dst if out is None or direct else out.copy_(dst)


def _row_chunks(xn: torch.Tensor) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
    """``xn`` split along its first axis into chunks of about :data:`_CHUNK_BYTES` (views, nothing copied).

    Only a tensor of at least :data:`_CHUNK_MIN_BYTES` is split (a smaller one
    stays in the last-level cache between passes); chunks of a 2-D view hold a
    multiple of :data:`_BLOCK` rows.  Measured (one thread, 4096 x 1536 and
    49152 x 128 float32, 24 MiB): the four whole-tensor reductions take
    ~1.3-1.6x less time over 1 MiB chunks than over the whole tensor; a 6 MiB
    tensor is ~1.5x slower chunked (op overhead), hence the threshold.
    CPU and one intra-op thread only: with more threads every chunk's
    reduction opens a parallel region, and with two threads on a shared
    2-core machine one benchmark run gave 11-23 s injected forwards against
    1.3-4.6 s plain (neighbours' load not isolated, so not a clean figure);
    on an accelerator it would only add kernel launches (not measured).
    """
    nbytes = xn.numel() * xn.element_size()
    if (nbytes < _CHUNK_MIN_BYTES or xn.dim() < 2 or xn.shape[0] < 2 or xn.device.type != "cpu"
            or torch.get_num_threads() != 1):
        return [xn]
    per = max(1, _CHUNK_BYTES // max(nbytes // xn.shape[0], 1))
    if xn.dim() == 2:
        per = max(_BLOCK, per // _BLOCK * _BLOCK)
    return xn.split(per)


def _chan_minmax(xn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel ``(min, max)`` of ``xn`` over all but its last axis, float32 ``(C,)`` each; exact.

    A wide contiguous ``(R, C)`` view (``C >= 512``, ``R`` a multiple of
    :data:`_BLOCK`) is reduced in blocks of rows, ``amax(1)`` over each block
    then ``amax(0)`` over the block maxima: the same values (max and min are
    order-free) at about half the time of ``amax(0)`` over ``R`` rows, which
    strides a whole wide row per step (measured at 4096 x 1536, one thread:
    7.6 ms -> 3.4 ms for both; no gain at C <= 384, so those keep ``amax(0)``).
    CPU only (measured there).
    """
    if (xn.dim() == 2 and xn.is_contiguous() and xn.shape[1] >= _BLOCK_MIN_C and xn.shape[0] % _BLOCK == 0
            and xn.device.type == "cpu"):
        xb = xn.view(-1, _BLOCK, xn.shape[1])
        return xb.amin(1).amin(0).float(), xb.amax(1).amax(0).float()
    lead = tuple(range(xn.dim() - 1))
    return xn.amin(lead).float(), xn.amax(lead).float()       # two column passes (aminmax(dim=0) is slower)


def scalar_sketch(x: torch.Tensor) -> torch.Tensor:
    """Scalar sketch of ``x``: min, max, mean, l1 (sum |x|), sumsq (sum x²), nnz.

    Shapes: any ``x`` -> float32 tensor of shape ``(6,)`` on ``x.device``, in
    the order of :data:`SCALAR_STATS`; exact.  ``nnz`` counts exact non-zeros
    (``nnz / numel`` is the density).
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
    cdll = ckernel.lib() if p.device.type == "cpu" and p.numel() else None
    if cdll is not None:      # the fused kernel: one pass (same values up to float32 summation order)
        pc = p.reshape(-1, q, k).contiguous()
        out = torch.empty(q + k, dtype=torch.float64)
        work = ckernel.scratch(k)
        if cdll.goblin_probs_f32(pc.data_ptr(), pc.shape[0], q, k, work.data_ptr(), out.data_ptr()) >= 0:
            return out
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
    ones = torch.ones(idx.shape, dtype=torch.float64, device=idx.device)
    counts = torch.zeros(n_experts, dtype=torch.float64, device=idx.device).scatter_add_(0, idx, ones)
    return counts / max(idx.numel(), 1)
