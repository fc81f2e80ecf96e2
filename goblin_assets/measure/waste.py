"""The waste budget: where one training step's time goes (DESIGN.md WasteBudget).

T_total = useful + data_wait + host_gap + comm_excess + precision_path +
kernel_shape, in seconds per step, each bucket with a status (measured,
estimated, not_observable) that drives the confidence score's evidence
coverage.  The split follows the TensorBoard profiler plugin's exclusive-
priority decomposition (Kernel > ... > DataLoader > CpuOp > Other; see
``docs/sources.md`` "Waste decomposition") adapted to what a CPU trace shows.
"""
from __future__ import annotations

import math

import numpy as np

from goblin_assets.contracts import WASTE_BUCKETS, WasteBucket
from goblin_assets.runners.trace import GemmCall, TraceSummary

#: GEMM tile edge of the shape model: MI300X MFMA / hipBLASLt macro tiles and
#: NVIDIA tensor-core tiles come in multiples of 64 (issue 4; the NVIDIA "Matrix
#: Multiplication Background User's Guide", section "Tile quantization").
GEMM_TILE = 64

#: Share of an fp32 GEMM's time that bf16 saves: "bf16 would halve" it (issue 4).
#: Conservative: MI300X matrix bf16 is 8x its fp32 peak (1307.4 vs 163.4 TFLOP/s,
#: ROCm docs "MI300X peak-performance capabilities", docs/sources.md "Peak throughput").
BF16_SAVING = 0.5


def tile_waste_fraction(m: int, n: int, k: int, tile: int = GEMM_TILE) -> float:
    """Share of a GEMM's work spent on tile padding: ``1 - MNK / (M'N'K')``.

    ``X' = ceil(X / tile) * tile``: a kernel that computes whole ``tile``-sized
    tiles does the padded product's work (tile quantization, NVIDIA "Matrix
    Multiplication Background User's Guide").  0 when every dimension is a
    multiple of ``tile``; dimensions are element counts (int > 0).
    """
    def up(x: int) -> int:
        return max(tile, math.ceil(x / tile) * tile)

    return 1.0 - (m * n * k) / (up(m) * up(n) * up(k))


def gemm_estimates(gemms: list[GemmCall], step_indices: list[int],
                   bf16_saves: bool) -> tuple[np.ndarray, np.ndarray, dict]:
    """Per step: (kernel_shape µs, precision_path µs) estimated from GEMM calls, and counts.

    ``kernel_shape`` = sum of ``time x tile_waste_fraction`` over GEMMs whose
    M, N or K is not a multiple of :data:`GEMM_TILE`; ``precision_path`` =
    :data:`BF16_SAVING` x the rest of the fp32 (``float``) GEMM time, when
    ``bf16_saves`` (else 0).  Both are carved out of useful time.
    """
    pos = {s: i for i, s in enumerate(step_indices)}
    shape = np.zeros(len(step_indices))
    prec = np.zeros(len(step_indices))
    n_gemms = n_misaligned = n_fp32 = 0
    for g in gemms:
        i = pos.get(g.step)
        if i is None:
            continue
        n_gemms += 1
        f = tile_waste_fraction(g.m, g.n, g.k)
        if f > 0:
            n_misaligned += 1
        shape[i] += g.time_us * f
        if g.dtype == "float":
            n_fp32 += 1
            if bf16_saves:
                prec[i] += BF16_SAVING * g.time_us * (1.0 - f)
    return shape, prec, {"gemms": n_gemms, "misaligned": n_misaligned, "fp32": n_fp32}


def waste_budget(summary: TraceSummary, step_time_s: float,
                 bf16_matmul: bool | None = None) -> dict[str, WasteBucket]:
    """Split the median step time into waste buckets from a profiler trace.

    Shares are averaged over all profiled steps, then scaled to ``step_time_s``
    (the median step), so the buckets add up to the step time exactly.

    * CPU traces: ``data_wait`` = DataLoader ``__next__`` time; ``useful`` = time
      covered by op execution (the ops' own time) outside the loader and
      outside collectives; ``comm_excess`` = collective time (gloo/c10d ops)
      no op overlaps; ``host_gap`` = the rest (Python and framework overhead
      between ops).
    * GPU traces: ``useful`` = device busy time not spent in exposed
      collectives; ``comm_excess`` = collective-kernel (NCCL/RCCL) time no
      other device work overlaps; ``data_wait`` = loader time while the device
      is idle (bounded by the idle time); ``host_gap`` = the remaining device
      idle time.

    ``comm_excess`` is measured (:class:`~goblin_assets.runners.trace.StepIntervals`
    ``comm_exposed_us``), 0 when the trace could show collectives and had
    none, and ``not_observable`` with the reason when it cannot show them
    (:attr:`TraceSummary.comm_not_observable`; their time then stays in
    ``useful``).  ``precision_path`` and ``kernel_shape`` are *estimated* from
    the GEMM calls the trace records with their shapes (:func:`gemm_estimates`)
    and carved out of ``useful``: on GPU traces both (bf16 matrix units
    assumed, as on MI200/MI300 and A100/H100); on CPU traces
    ``precision_path`` only, and only when ``bf16_matmul`` says whether the
    CPU has bf16 matrix instructions (``amx_bf16``/``avx512_bf16``, the host
    facts' :attr:`~goblin_assets.host.HostFacts.cpu_bf16_matmul`; without them
    bf16 saves nothing, estimated 0).  ``kernel_shape`` is not observable on
    CPU: the 64-multiple tile model describes GPU matrix-core tiles, not CPU
    BLAS register blocking.

    Units: seconds per step.  Raises ``ValueError`` for a trace with no steps.
    """
    if not summary.steps:
        raise ValueError("trace has no profiled steps")
    total = np.array([s.dur_us for s in summary.steps])
    data = np.array([s.data_wait_us for s in summary.steps])
    comm = np.array([s.comm_exposed_us for s in summary.steps])
    # Not observable (e.g. the c10d enqueue ops of an NCCL job on a CPU-only trace): that CPU time
    # counts as op time again, |C u N| = |N| + exposed, and no comm_excess is claimed.
    host_coll, comm = (comm, np.zeros_like(comm)) if summary.comm_not_observable else (np.zeros_like(comm), comm)
    if summary.has_device:
        busy = np.array([s.device_busy_us for s in summary.steps])
        data = np.minimum(data, np.maximum(total - busy, 0))
        useful = busy - comm
        useful_note = "device busy time (union of kernels, memcpy, memset) outside exposed collectives"
        gap_note = "device idle, not waiting on the data loader"
    else:
        useful = np.array([s.op_us for s in summary.steps]) + host_coll
        useful_note = "CPU time inside ops (forward, backward, optimizer), outside the data loader and collectives"
        gap_note = "step time not covered by op execution (Python, framework overhead)"
    gap = np.maximum(total - useful - comm - data, 0)
    step_ids = [s.index for s in summary.steps]
    bf16_saves = bool(bf16_matmul) if not summary.has_device else True
    shape, prec, n = gemm_estimates(summary.gemms, step_ids, bf16_saves)
    if not summary.has_device:
        shape = np.zeros_like(shape)
    shape = np.minimum(shape, useful)
    prec = np.minimum(prec, useful - shape)
    useful = useful - shape - prec
    denom = float(total.sum())
    scale = step_time_s / denom if denom > 0 else 0.0

    def part(x: np.ndarray) -> float:
        return float(x.sum()) * scale

    buckets = {
        "useful": WasteBucket(seconds=part(useful), status="measured", note=useful_note),
        "data_wait": WasteBucket(seconds=part(data), status="measured",
                                 note="DataLoader __next__ (enumerate(DataLoader)#...) time"),
        "host_gap": WasteBucket(seconds=part(gap), status="measured", note=gap_note),
        "comm_excess": _comm_bucket(summary, part(comm)),
        "precision_path": _precision_bucket(summary, part(prec), n, bf16_matmul),
        "kernel_shape": _shape_bucket(summary, part(shape), n),
    }
    return {b: buckets[b] for b in WASTE_BUCKETS}


def _comm_bucket(summary: TraceSummary, seconds: float) -> WasteBucket:
    """``comm_excess``: exposed collective time (measured), or why the trace cannot show it."""
    reason = summary.comm_not_observable
    if reason:
        return WasteBucket(status="not_observable", note=reason)
    what, others = (("collective kernels (NCCL/RCCL)", "device kernels, copies and fills") if summary.has_device
                    else ("collective ops (c10d/gloo)", "CPU ops"))
    if summary.collectives == 0:
        single = " (single process)" if not summary.world_size or summary.world_size <= 1 else ""
        return WasteBucket(seconds=0.0, status="measured",
                           note=f"no {what} among the {summary.others} {others} of the profiled steps{single}: "
                                "the trace records them when they run, so none was exposed")
    n = len(summary.steps)
    coll_ms = sum(s.collective_us for s in summary.steps) / n / 1e3
    exposed_ms = sum(s.comm_exposed_us for s in summary.steps) / n / 1e3
    return WasteBucket(seconds=seconds, status="measured",
                       note=f"{summary.collectives} {what} in {n} profiled steps ({coll_ms:.3g} ms per step); "
                            f"{exposed_ms:.3g} ms per step ran while none of the {summary.others} other {others} "
                            "did (exposed communication)")


def _precision_bucket(summary: TraceSummary, seconds: float, n: dict, bf16_matmul: bool | None) -> WasteBucket:
    if not summary.gemms:
        return WasteBucket(status="not_observable",
                           note="no GEMM ops with shapes in the trace (needs record_shapes=True)")
    where = "device kernel" if summary.has_device else "CPU op"
    if not summary.has_device and bf16_matmul is None:
        return WasteBucket(status="not_observable",
                           note="unknown whether this CPU has bf16 matrix instructions (amx_bf16/avx512_bf16)")
    if not summary.has_device and not bf16_matmul:
        return WasteBucket(seconds=0.0, status="estimated",
                           note=f"{n['fp32']} of {n['gemms']} GEMM calls are fp32, but this CPU has no bf16 "
                                "matrix instructions (amx_bf16/avx512_bf16): bf16 would not run them faster")
    return WasteBucket(seconds=seconds, status="estimated",
                       note=f"half the {where} time of {n['fp32']} fp32 GEMM calls (of {n['gemms']}): "
                            "what bf16 matrix units would save (estimated from their share)")


def _shape_bucket(summary: TraceSummary, seconds: float, n: dict) -> WasteBucket:
    if not summary.has_device:
        return WasteBucket(status="not_observable",
                           note="the 64-multiple tile model describes GPU matrix-core tiles; CPU BLAS blocks "
                                "by register width, so CPU GEMM shapes are not estimated")
    if not summary.gemms:
        return WasteBucket(status="not_observable",
                           note="no GEMM kernels linked to shaped ops in the trace (needs record_shapes=True)")
    return WasteBucket(seconds=seconds, status="estimated",
                       note=f"{n['misaligned']} of {n['gemms']} GEMM calls have M, N or K not a multiple of "
                            f"{GEMM_TILE}: kernel time x tile-padding share 1 - MNK/(M'N'K')")


def shares(budget: dict[str, WasteBucket]) -> dict[str, float]:
    """Each bucket's share of the budget's total (0..1)."""
    tot = sum(b.seconds for b in budget.values())
    return {k: (v.seconds / tot if tot > 0 else 0.0) for k, v in budget.items()}


def evidence_coverage(budget: dict[str, WasteBucket]) -> float:
    """Share of buckets actually measured (estimated counts half), 0..1."""
    if not budget:
        return 0.0
    w = {"measured": 1.0, "estimated": 0.5, "not_observable": 0.0}
    return sum(w[b.status] for b in budget.values()) / len(budget)
