"""Exposed communication: the share of the step that collectives run while no other work does.

Per profiled step, the collective time (NCCL/RCCL kernels on GPU traces,
gloo/c10d ops on CPU traces) and its *exposed* part, ``|C ∪ N| - |N|`` with C
the collective intervals and N the other device work (kernels, copies,
fills) or the other ops, come from the one trace reader
(:class:`~goblin_assets.runners.trace.StepIntervals` ``collective_us`` /
``comm_exposed_us``, the overlap HTA's ``get_comm_comp_overlap`` measures).
:func:`comm_findings` grades the exposed share of the step time,
``100 × Σ comm_exposed_us / Σ step duration`` over the profiled steps: the
same number as the waste budget's ``comm_excess`` share, which the KB rule
:data:`KB_RULE` (``waste.comm_excess.share > 0.3``) reads, so a ``high``
finding here is a fired rule in ``goblin audit --trace``.  The grades are
:data:`goblin_assets.trace.severity.THRESHOLDS` ``comm_exposed_pct``.
"""
from __future__ import annotations

from goblin_assets.runners.trace import TraceSummary, median_step_us
from goblin_assets.trace.severity import Finding, graded

#: The knowledge-base rule the exposed share feeds (kb/rocm_rules.yaml).
KB_RULE = "collectives.exposed_allreduce"


def comm_findings(summary: TraceSummary, stepped: bool = True) -> list[Finding]:
    """One ``exposed_communication`` finding (analysis ``comm``) when the profiled steps ran collectives.

    ``value``: the exposed collective time as % of the step time (measured);
    ``evidence`` (µs per step are shares of the summed step time scaled to
    the median step, as the waste budget's seconds are):
    ``exposed_us_per_step``, ``collective_us_per_step``, ``step_us`` (the
    median step), ``overlapped_pct`` (share of the
    collective time that other work overlapped, HTA's
    ``comp_comm_overlap_pctg``), ``collective_share_of_kernel_time_pct``
    (collective time over the summed time of every event category in the
    steps), ``collectives`` (events), ``steps``, ``kb_rule``.  Empty when
    the steps ran no collective, or when the trace cannot show them
    (:attr:`TraceSummary.comm_not_observable`: the waste budget says why).
    ``stepped`` is False for a summary of a trace without profiler steps
    (:func:`goblin_assets.trace.metrics.window_summary`: one window over
    its device events), and the message says "window".
    """
    if summary.collectives == 0 or summary.comm_not_observable or not summary.steps:
        return []
    n = len(summary.steps)
    step_us = sum(s.dur_us for s in summary.steps)
    if step_us <= 0:
        return []
    exposed = sum(s.comm_exposed_us for s in summary.steps)
    coll = sum(s.collective_us for s in summary.steps)
    summed = sum(v for s in summary.steps for v in s.category_us.values())
    coll_summed = sum(s.category_us.get("collective", 0.0) for s in summary.steps)
    share = 100.0 * exposed / step_us
    median = median_step_us(summary)
    per_step = median / step_us  # µs of the summed steps -> µs of the median step
    overlapped = 100.0 * (coll - exposed) / coll if coll > 0 else 0.0
    kernel_share = 100.0 * coll_summed / summed if summed > 0 else 0.0
    what, others = (("collective kernel", "compute, copy or fill kernel") if summary.has_device
                    else ("collective op", "other op"))
    span = (f"the step ({exposed * per_step / 1e3:.2f} ms of a {median / 1e3:.2f} ms median step)" if stepped else
            f"the window ({exposed * per_step / 1e3:.2f} ms of {median / 1e3:.2f} ms; the trace has no profiler steps)")
    message = (f"exposed communication: {share:.1f}% of {span} is {what} time that no {others} overlaps; "
               f"collectives take {kernel_share:.1f}% of the {'kernel' if summary.has_device else 'op'} time "
               f"({summary.collectives} {what}s in {n} {'steps' if stepped else 'window'}, "
               f"{coll * per_step / 1e3:.2f} ms {'per step' if stepped else 'in all'}, {overlapped:.0f}% of it "
               f"overlapped); feeds KB rule {KB_RULE}")
    return [graded("comm", "exposed_communication", "comm_exposed_pct", share, message,
                   exposed_us_per_step=exposed * per_step, collective_us_per_step=coll * per_step, step_us=median,
                   overlapped_pct=overlapped, collective_share_of_kernel_time_pct=kernel_share,
                   collectives=summary.collectives, steps=n, kb_rule=KB_RULE)]
