"""The waste budget: where one training step's time goes (DESIGN.md WasteBudget).

T_total = useful + data_wait + host_gap + comm_excess + precision_path +
kernel_shape, in seconds per step, each bucket with a status (measured,
estimated, not_observable) that drives the confidence score's evidence
coverage.  The split follows the TensorBoard profiler plugin's exclusive-
priority decomposition (Kernel > ... > DataLoader > CpuOp > Other; see
``shared/profiling_facts.md`` section 3) adapted to what a CPU trace shows.
"""
from __future__ import annotations

import numpy as np

from goblin_assets.contracts import WASTE_BUCKETS, WasteBucket
from goblin_assets.runners.trace import TraceSummary


def waste_budget(summary: TraceSummary, step_time_s: float) -> dict[str, WasteBucket]:
    """Split the median step time into waste buckets from a profiler trace.

    Shares are averaged over all profiled steps, then scaled to ``step_time_s``
    (the median step), so the buckets add up to the step time exactly.

    * CPU traces: ``data_wait`` = DataLoader ``__next__`` time; ``useful`` = time
      covered by op execution outside the loader; ``host_gap`` = the rest (Python
      and framework overhead between ops).
    * GPU traces: ``useful`` = device busy time; ``data_wait`` = loader time
      while the device is idle (bounded by the idle time); ``host_gap`` = the
      remaining device idle time.

    ``comm_excess`` is measured as 0 when the trace has no collectives; the
    ``precision_path`` and ``kernel_shape`` estimates need GPU kernels and are
    not observable on CPU traces.

    Units: seconds per step.  Raises ``ValueError`` for a trace with no steps.
    """
    if not summary.steps:
        raise ValueError("trace has no profiled steps")
    total = np.array([s.dur_us for s in summary.steps])
    data = np.array([s.data_wait_us for s in summary.steps])
    if summary.has_device:
        busy = np.array([s.device_busy_us for s in summary.steps])
        data = np.minimum(data, np.maximum(total - busy, 0))
        useful = busy
        useful_note = "device busy time (union of kernels, memcpy, memset)"
        gap_note = "device idle, not waiting on the data loader"
    else:
        useful = np.array([s.op_us for s in summary.steps])
        useful_note = "CPU time inside ops (forward, backward, optimizer), outside the data loader"
        gap_note = "step time not covered by op execution (Python, framework overhead)"
    gap = np.maximum(total - useful - data, 0)
    denom = float(total.sum())
    scale = step_time_s / denom if denom > 0 else 0.0

    def part(x: np.ndarray) -> float:
        return float(x.sum()) * scale

    buckets = {
        "useful": WasteBucket(seconds=part(useful), status="measured", note=useful_note),
        "data_wait": WasteBucket(seconds=part(data), status="measured",
                                 note="DataLoader __next__ (enumerate(DataLoader)#...) time"),
        "host_gap": WasteBucket(seconds=part(gap), status="measured", note=gap_note),
        "comm_excess": WasteBucket(seconds=0.0, status="measured",
                                   note="no collective ops in the trace (single process)"),
        "precision_path": WasteBucket(status="not_observable",
                                      note="needs GPU kernel times of fp32 GEMMs; not estimated on CPU traces"
                                      if not summary.has_device else "not estimated yet"),
        "kernel_shape": WasteBucket(status="not_observable",
                                    note="needs GPU GEMM kernel shapes; not estimated on CPU traces"
                                    if not summary.has_device else "not estimated yet"),
    }
    return {b: buckets[b] for b in WASTE_BUCKETS}


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
