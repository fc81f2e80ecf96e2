"""Graded findings of the trace analyses: every finding says how bad, by which threshold, from where.

A finding's ``severity`` is ``high`` at or past its high threshold,
``moderate`` at or past its moderate threshold, ``ok`` below both.  The
thresholds are the field's, cited in :data:`THRESHOLDS`: xprof grades an
input-bound step as moderately input bound at 5% of step time spent waiting
for input and highly at 20% (``tensorflow/profiler`` ``input_pipeline_analyzer``
"kModeratelyInputBoundThresholdInPercent" / "kHighlyInputBoundThresholdInPercent");
HTA flags launches whose CPU runtime call exceeds 50 µs and whose launch
delay exceeds 100 µs (``hta/trace_analysis.py`` ``get_cuda_kernel_launch_stats``
defaults ``runtime_cutoff=50``, ``launch_delay_cutoff=100``); TraceLens studies kernels shorter than 10 µs
(``TraceLens/TreePerf`` short-kernel study, ``short_kernel_threshold_us=10``);
the PyTorch Profiler TensorBoard plugin recommends on communication above
10% of step time (pytorch/kineto ``tb_plugin/torch_tb_profiler/profiler/data.py``
``RunProfileData.analyze``, docs/sources.md "Waste decomposition").
Shares that are ours are marked so in their source.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Severity = Literal["ok", "moderate", "high"]


class Threshold(BaseModel):
    """Moderate and high cut-offs of one measure (in ``unit``), and where they come from."""

    moderate: float
    high: float
    unit: str
    source: str

    def grade(self, value: float | None) -> Severity:
        """``high`` when ``value >= high``, ``moderate`` when ``>= moderate``, else ``ok`` (``None`` is ``ok``)."""
        if value is None:
            return "ok"
        if value >= self.high:
            return "high"
        if value >= self.moderate:
            return "moderate"
        return "ok"


#: Every threshold the trace analyses grade with, by measure name.
THRESHOLDS: dict[str, Threshold] = {
    "input_wait_pct": Threshold(moderate=5, high=20, unit="% of step", source=(
        "xprof input_pipeline_analyzer: moderately input bound at 5%, highly at 20%")),
    "idle_pct": Threshold(moderate=5, high=20, unit="% of device time", source=(
        "xprof's input-bound cut-offs applied to device idle time (our choice of the same grades)")),
    "launch_cpu_us": Threshold(moderate=50, high=100, unit="µs", source=(
        "HTA get_cuda_kernel_launch_stats runtime_cutoff=50 µs (moderate); high at twice that (ours)")),
    "launch_delay_us": Threshold(moderate=50, high=100, unit="µs", source=(
        "HTA get_cuda_kernel_launch_stats launch_delay_cutoff=100 µs (high); moderate at half that (ours)")),
    "short_kernel_pct": Threshold(moderate=10, high=30, unit="% of kernel time", source=(
        "TraceLens short-kernel study (< 10 µs kernels); the 10%/30% shares are ours")),
    "recompute_pct": Threshold(moderate=10, high=25, unit="% of step", source=(
        "ours: activation checkpointing re-runs the forward (≈ 1/3 of a step at most); 10%/25% of step")),
    "sync_pct": Threshold(moderate=5, high=20, unit="% of step", source=(
        "xprof's input-bound cut-offs applied to host-device syncs (our choice of the same grades)")),
    "comm_exposed_pct": Threshold(moderate=10, high=30, unit="% of step", source=(
        "PyTorch Profiler TensorBoard plugin (kineto tb_plugin data.py RunProfileData.analyze): communication "
        "recommendation above 10% of step time (moderate); high at 30%, KB rule collectives.exposed_allreduce's "
        "share (ours)")),
    "straggler_pct": Threshold(moderate=10, high=20, unit="% of step", source=(
        "TraceML's step-time share grades (10% warning, 20% critical) applied to a rank's excess own work")),
    "outlier_step_pct": Threshold(moderate=10, high=20, unit="% of run time", source=(
        "TraceML's share grades (10% warning, 20% critical) applied to the time lost in outlier steps, a step "
        "being an outlier past 1.5x the median step (TraceLens's trace-collection recipe)")),
    "graph_hidden_pct": Threshold(moderate=20, high=50, unit="% of device time", source=(
        "TraceLens inference report: any hipGraphLaunch without a graph capture limits the per-op analysis "
        "(generate_perf_report_pytorch_inference.py); the 20%/50% shares at which we mark per-op findings "
        "unreliable are ours")),
    "roofline_pct": Threshold(moderate=50, high=80, unit="% of peak lost", source=(
        "ours: share of the device's peak a GEMM/attention op leaves unused (TraceLens reports % of roofline)")),
}


class Finding(BaseModel):
    """One graded observation of a trace analysis.

    ``analysis`` is the module that made it (``temporal``, ``idle``,
    ``launch``, ``ops``, ``recompute``, ``critical_path``, ``health``, ``comm`` ...),
    ``kind`` a short stable identifier (``host_wait``, ``cpu_bound_step`` ...),
    ``value`` in ``unit``, ``severity`` from ``threshold`` (a key of
    :data:`THRESHOLDS`, empty when the finding is not graded by a number),
    ``status`` how the value was obtained (``measured`` from the trace's own
    timestamps, ``estimated`` when a model is involved, e.g. FLOPs from shapes
    against a peak table).
    """

    analysis: str
    kind: str
    message: str
    value: float | None = None
    unit: str = ""
    severity: Severity = "ok"
    threshold: str = ""
    threshold_source: str = ""
    status: Literal["measured", "estimated", "not_observable"] = "measured"
    evidence: dict = Field(default_factory=dict)


def graded(analysis: str, kind: str, measure: str, value: float | None, message: str,
           status: Literal["measured", "estimated", "not_observable"] = "measured", **evidence) -> Finding:
    """A :class:`Finding` graded by the :data:`THRESHOLDS` entry ``measure``.

    Raises
    ------
    KeyError
        ``measure`` is not a key of :data:`THRESHOLDS`.
    """
    t = THRESHOLDS[measure]
    return Finding(analysis=analysis, kind=kind, message=message, value=value, unit=t.unit,
                   severity=t.grade(value), threshold=measure, threshold_source=t.source, status=status,
                   evidence=evidence)
