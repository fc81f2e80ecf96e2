"""compare_runs: two profiles, the benchmark results and the patch in, the audit report model out.

:func:`compare_runs` is pure.  Throughput is in the workload's honest unit
(``RunMetrics.throughput``): samples/s, or for token workloads *real*
(non-padding) tokens/s, because a patch that removes padding processes fewer
positions per step while doing more useful work per second.

The measured speedup always comes with its interval
(:func:`goblin_assets.measure.benchmark.bench_interval`); one whose interval
contains 1.0 reads "no significant change".  The predicted range is the
waste-budget model's, scaled by the applied rules' measured record when the
caller passed one (:mod:`goblin_assets.measure.calibration`).  The report
also reconciles the profiled runs' implied speedup with the benchmarked one
(:func:`reconcile`).  The renderings are in :mod:`goblin_assets.report.markdown`
and :mod:`goblin_assets.report.html`.
"""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field

from goblin_assets.contracts import (
    WASTE_BUCKETS,
    AppliedRule,
    BenchmarkResult,
    ConfigDict,
    Invariant,
    Patch,
    RunMetrics,
    Signal,
)
from goblin_assets.measure.benchmark import SpeedupInterval, bench_interval
from goblin_assets.measure.calibration import Calibration, calibrate
from goblin_assets.measure.evidence import NonfiniteEvidence
from goblin_assets.measure.waste import shares
from goblin_assets.opscope.tensor_findings import TensorFindings
from goblin_assets.redact import redact
from goblin_assets.report.verdict import Verdict


class HazardNote(BaseModel):
    """A hazard or warning that fired: what it is, what to do, its source, and what it forbids (``blocks``)."""

    rule_id: str
    kind: str
    text: str
    action: str
    title: str
    url: str
    blocks: list[str] = Field(default_factory=list)
    evidence: str = ""


def hazard_notes(kb, matches) -> list[HazardNote]:
    """The fired rules of kind ``hazard`` or ``warning`` of ``matches`` (a KnowledgeBase's rules), hazards first."""
    out = []
    for m in matches:
        r = kb.by_id.get(m.rule_id) if m.fired else None
        if r is not None and r.kind in ("hazard", "warning"):
            out.append(HazardNote(rule_id=r.id, kind=r.kind, text=" ".join(r.symptom.split()),
                                  action=" ".join(r.expected_impact.split()), title=r.citation.title,
                                  url=r.citation.url, blocks=list(r.blocks),
                                  evidence="; ".join(str(v) for c, v in m.evidence.items()
                                                     if c.startswith("tensors."))))
    return sorted(out, key=lambda h: (h.kind != "hazard", h.rule_id))


class BucketChange(BaseModel):
    """One waste bucket before and after (seconds per step, share of the step)."""

    bucket: str
    before_s: float
    after_s: float
    before_share: float
    after_share: float
    before_status: str
    after_status: str


class MetricRow(BaseModel):
    """One row of the side-by-side table: a metric of the original and the patched profile."""

    metric: str
    before: float | str | None
    after: float | str | None
    unit: str = ""


class AuditReport(BaseModel):
    """Everything the audit report shows; every number says how it was obtained.

    Units: throughputs in ``throughput_unit`` (samples/s, or real non-padding
    tokens/s for token workloads); step times in seconds; speedups are
    patched/original throughput ratios.  ``measured_speedup`` is
    ``measured_interval.point`` (the geometric mean of the paired ratios);
    ``predicted_low``/``predicted_high``/``confidence`` are the calibrated
    prediction (``calibration`` holds the model's own and how it was
    scaled); ``profiled_speedup`` is the profiled runs' throughput ratio and
    ``reconciliation`` says whether it agrees with the benchmark and why not.
    """

    workload: str
    model: str
    unit: str
    throughput_unit: str = ""
    device: str
    torch_version: str | None
    accelerator_version: str
    batch_shape: str
    baseline_throughput: float
    baseline_spread: float
    patched_throughput: float
    patched_spread: float
    baseline_throughputs: list[float] = Field(default_factory=list)
    patched_throughputs: list[float] = Field(default_factory=list)
    repeats: int
    steps: int
    measured_speedup: float
    measured_interval: SpeedupInterval | None = None
    bench_stop_reason: str = ""
    predicted_low: float
    predicted_high: float
    confidence: float
    calibration: Calibration | None = None
    profiled_speedup: float | None = None
    reconciliation: list[str] = Field(default_factory=list)
    evidence_coverage: float = 0.0
    rule_consistency: float = 1.0
    buckets: list[BucketChange]
    metrics: list[MetricRow] = Field(default_factory=list)
    before_step_time_s: float | None
    after_step_time_s: float | None
    applied: list[AppliedRule]
    dropped: list[str]
    consistency_notes: list[str] = Field(default_factory=list)
    diff: str
    target_file: str = ""
    env: dict[str, str]
    unset_env: list[str]
    provenance: str
    cache_hits: list[str]
    warnings: list[str]
    created_at: str
    nonfinite_markdown: list[str] = Field(default_factory=list)
    nonfinite_html: str = ""
    tensor_markdown: list[str] = Field(default_factory=list)
    tensor_html: str = ""
    #: The config as it ran: each field where the run's observed value disagrees with the file (issue 27).
    config_markdown: list[str] = Field(default_factory=list)
    trace_diff_markdown: list[str] = Field(default_factory=list)
    python: str | None = None
    packages: dict[str, str | None] = Field(default_factory=dict)
    hazards: list[HazardNote] = Field(default_factory=list)
    signals: list[Signal] = Field(default_factory=list)
    invariants: list[Invariant] = Field(default_factory=list)
    #: The original run's steps past 1.5x the median step (RunMetrics.step_outliers, measure/step_outliers.py).
    step_outliers: list[dict] = Field(default_factory=list)
    verdict: Verdict | None = None


def _accelerator(m: RunMetrics) -> str:
    p = m.provenance
    if p.hip_version:
        return f"ROCm/HIP {p.hip_version}"
    if p.cuda_version and p.device != "cpu":
        return f"CUDA {p.cuda_version}"
    return "none (CPU)"


def _headroom_cell(m: RunMetrics) -> int | str | None:
    if m.headroom_batch is not None:
        return m.headroom_batch
    why = m.not_observable.get("headroom_batch", "")
    return "memory is not the limit" if why.startswith("memory is not the limit") else None


def _side_by_side(before: RunMetrics, after: RunMetrics) -> list[MetricRow]:
    """One row per metric (each metric once: samples/s is the throughput row itself for a samples workload)."""
    rows = [
        MetricRow(metric="step time (median, profiled)", before=before.step_time_s, after=after.step_time_s, unit="s"),
        MetricRow(metric=before.throughput_unit + " (profiled steps)", before=before.throughput,
                  after=after.throughput, unit=before.throughput_unit),
    ]
    if before.unit == "tokens":
        rows.append(MetricRow(metric="samples/s (profiled steps)", before=before.samples_per_sec,
                              after=after.samples_per_sec, unit="samples/s"))
    rows.append(MetricRow(metric="samples per step", before=before.samples_per_step, after=after.samples_per_step))
    if before.unit == "tokens":
        rows += [
            MetricRow(metric="tokens/s, pad included", before=before.tokens_per_sec, after=after.tokens_per_sec,
                      unit="tokens/s"),
            MetricRow(metric="padding share", before=before.padding_share, after=after.padding_share),
        ]
    rows += [
        MetricRow(metric="MFU", before=before.mfu_pct, after=after.mfu_pct, unit="%"),
        MetricRow(metric="memory peak", before=before.mem_peak_gb, after=after.mem_peak_gb, unit="GB"),
        MetricRow(metric="memory headroom", before=before.memory_headroom_gb, after=after.memory_headroom_gb,
                  unit="GB"),
        MetricRow(metric="headroom batch (estimated)", before=_headroom_cell(before), after=_headroom_cell(after)),
        MetricRow(metric="utilisation", before=before.util_pct, after=after.util_pct, unit="%"),
        MetricRow(metric="fused attention kernel ran",
                  before=None if before.attention_kernel_loaded is None else str(before.attention_kernel_loaded),
                  after=None if after.attention_kernel_loaded is None else str(after.attention_kernel_loaded)),
    ]
    return rows


#: The profiled speedup agrees with the benchmark when it lies within the benchmark's interval widened by
#: this factor either way: the profiled window (a few steps of each run, not repeated) has a sampling error
#: of its own that the benchmark's interval does not include.
RECONCILE_TOLERANCE = 1.10


def _arm_note(label: str, m: RunMetrics, res: BenchmarkResult, unit: str) -> str | None:
    """Why one arm's profiled throughput differs from its timed repeats' median (None: within tolerance)."""
    f = (m.throughput or 0.0) / res.median
    seen = f"{m.throughput:,.1f} {unit} profiled vs {res.median:,.1f} timed"
    if f > RECONCILE_TOLERANCE:
        why = (f"The profiled {label} run went {f:.2f}x faster than its timed repeats ({seen}). The profiler only "
               "adds work, so its window was not steady state: ")
        k = m.prefetch_warmup_steps
        if k is None:
            return why + ("a DataLoader with workers fills a prefetch queue (workers x prefetch_factor batches) "
                          "during the warm-up, and the few profiled steps that follow consume it without waiting "
                          "for data; this run's harness did not report skipping that depth "
                          "(prefetch_warmup_steps).")
        if k > 0:
            return why + (f"the harness skipped {k} step(s) after the warm-up to drain the DataLoader's prefetch "
                          f"queue, so the queue is not the cause; the window's {m.steps} steps are few, and their "
                          "own variation (other load on the machine) remains.")
        return why + (f"the loader had no prefetch queue to drain (the harness skipped 0 steps), so the "
                      f"window's {m.steps} steps, few and not repeated, varied with other load on the machine.")
    if f < 1.0 / RECONCILE_TOLERANCE:
        return (f"The profiled {label} run went {1 / f:.2f}x slower than its timed repeats ({seen}): profiler "
                "overhead. torch.profiler records every op (shapes, FLOPs, memory events), a host cost per op, so "
                "a step of many small ops slows more than a step of few large ones and the runs' ratio shifts (or "
                "other load on the machine slowed the window's few steps).")
    return None


def reconcile(before: RunMetrics, after: RunMetrics, bench: dict[str, BenchmarkResult],
              interval: SpeedupInterval) -> tuple[float | None, list[str]]:
    """The profiled runs' implied speedup and sentences reconciling it with the benchmarked one (pure).

    The profiled speedup is ``after.throughput / before.throughput`` (a few
    steps of each run under torch.profiler).  It agrees with the benchmark
    when it lies in ``[low / T, high * T]`` with ``T`` =
    :data:`RECONCILE_TOLERANCE` (``point`` for a missing bound).  When it
    does not, each arm whose profiled throughput is more than ``T`` away
    from its timed median gets the likely cause: faster than timed means a
    window that was not steady state (the DataLoader's prefetch queue, read
    from ``RunMetrics.prefetch_warmup_steps`` when the harness reported it),
    slower means profiler overhead.

    Returns
    -------
    tuple
        ``(profiled speedup or None, sentences)``; ``(None, [])`` when a
        profiled or benchmarked throughput is missing.
    """
    b, p = bench["baseline"], bench["patched"]
    if not before.throughput or not after.throughput or not b.median or not p.median:
        return None, []
    prof = after.throughput / before.throughput
    lo = interval.low if interval.low is not None else interval.point
    hi = interval.high if interval.high is not None else interval.point
    head = (f"The profiled runs ({before.steps} and {after.steps} steps under torch.profiler) imply {prof:.2f}x; "
            f"the benchmark measured {interval.headline()}.")
    drained = [f"{lab} {m.prefetch_warmup_steps}" for lab, m in (("original", before), ("patched", after))
               if m.prefetch_warmup_steps]
    steady = (f" The harness skipped the DataLoader's prefetch depth after the warm-up (steps: "
              f"{', '.join(drained)}), so the profiled windows start in steady state.") if drained else ""
    if lo / RECONCILE_TOLERANCE <= prof <= hi * RECONCILE_TOLERANCE:
        return prof, [head + f" They agree (within the interval, ±{RECONCILE_TOLERANCE - 1:.0%})." + steady]
    notes = [head + f" They disagree (the profiled ratio lies {'above' if prof > hi else 'below'} the interval by "
             f"more than {RECONCILE_TOLERANCE - 1:.0%}): trust the benchmark (no profiler, alternating repeats); "
             "the profiled runs give the waste budget's per-step split."]
    unit = before.throughput_unit
    arms = [n for n in (_arm_note("original", before, b, unit), _arm_note("patched", after, p, unit)) if n]
    notes += arms or [f"Each profiled run is within {RECONCILE_TOLERANCE - 1:.0%} of its timed repeats; their "
                      "deviations in opposite directions add up in the ratio (profiler overhead on one run, a "
                      "window off steady state or other load on the other)."]
    return prof, notes


def _shape(config: ConfigDict, before: RunMetrics) -> str:
    shape = f"batch_size={config.batch_size}"
    if config.seq_len:
        shape += f", seq_len={config.seq_len}"
    if config.padding:
        shape += f", padding={config.padding}"
    if before.samples_per_step:
        shape += f" (measured {before.samples_per_step:g} samples/step"
        if before.unit == "tokens" and before.tokens_per_sec and before.step_time_s:
            tokens = before.tokens_per_sec * sum(before.step_times_s) / max(1, before.steps) \
                if before.step_times_s else before.tokens_per_sec * before.step_time_s
            shape += f", {tokens:.0f} token positions/step"
        shape += ")"
    return shape


def config_markdown(config: ConfigDict) -> list[str]:
    """The report's section on the config as it ran (issue 27): every disagreement between the file and the
    run, with both values and where each came from, then one table row per observed field (the parsed
    value beside the observed one); empty when nothing was observed (a replay)."""
    if not config.parsed_provenance:
        return []
    n = len(config.parsed_provenance)
    out = ["## The config as it ran (observed)", ""]
    if not config.disagreements:
        out += [f"The run used what the file states for every field both give ({n} fields observed in the "
                "running program; rules and the waste budget read the observed values).", ""]
    else:
        out += [f"{len(config.disagreements)} of {n} observed fields differ from the file; rules and the waste "
                "budget read the value the run used, and no patch is written into a line that does not decide "
                "the value:", ""]
        for d in config.disagreements:
            out.append(f"- **{d.field}**: the file says `{d.file_value!r}` ({redact(d.file_where)}); the run used "
                       f"`{d.run_value!r}` ({redact(d.run_where)}). Why: {redact(d.cause)}." +
                       (" A patch of this field edits the line that sets the run's value." if d.patchable else
                        " No patch is written for this field."))
        out.append("")
    differ = {d.field for d in config.disagreements}
    out += ["| field | the file (parsed) | the run (observed) | agree |", "|---|---|---|---|"]
    for f, prov in config.parsed_provenance.items():
        run = config.provenance.get(f)
        said = _cell(prov.kind + (f": {prov.detail}" if prov.detail else ""))
        out.append(f"| {f} | `{config.parsed.get(f)!r}` ({said}) | `{getattr(config, f)!r}` "
                   f"({_cell(run.detail if run else '')}) | {'no' if f in differ else 'yes'} |")
    return out + [""]


def _cell(text: str, limit: int = 90) -> str:
    """One table cell of free text: redacted, pipes escaped, cut at ``limit`` characters."""
    text = redact(text).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def compare_runs(before: RunMetrics, after: RunMetrics, bench: dict[str, BenchmarkResult], patch: Patch,
                 config: ConfigDict, model: str = "", calibration: Calibration | None = None,
                 nonfinite: NonfiniteEvidence | None = None, python: str | None = None,
                 packages: dict[str, str | None] | None = None,
                 hazards: list[HazardNote] | None = None, tensors: TensorFindings | None = None,
                 verdict: Verdict | None = None) -> AuditReport:
    """Build the report model from the original and patched runs (pure function).

    Parameters
    ----------
    before, after : RunMetrics
        The profiled original and patched runs (waste budget, side-by-side metrics).
    bench : dict
        ``"baseline"`` and ``"patched"`` BenchmarkResults: alternating repeats
        without a profiler (the throughput comparison).
    patch : Patch
        The applied rules, the diff and the predicted speedup range.
    config : ConfigDict
        The original config (batch/sequence shape for the footer).
    model : str
        A human-readable model name for the footer.
    nonfinite : NonfiniteEvidence, optional
        The "Non-finite values" section (measure/evidence.py), when the run's
        tensors or parameters held NaN or inf.
    python, packages : optional
        The job's interpreter and its library versions (the footer states them).
    hazards : list of HazardNote, optional
        The hazards and warnings that fired (:func:`hazard_notes`).
    tensors : TensorFindings, optional
        The "Tensor findings" section (opscope/tensor_findings.py), when tensors were sketched.
    verdict : Verdict, optional
        The audit's ranked verdict (:func:`goblin_assets.report.verdict.audit_verdict`), said first.
    calibration : Calibration, optional
        The patch's prediction scaled by its rules' record
        (:func:`goblin_assets.measure.calibration.calibrate`); default: the
        model's prediction unscaled.

    Returns
    -------
    AuditReport
        ``measured_speedup`` = the geometric mean of the paired
        patched/original throughput ratios, in the workload's honest unit
        (``RunMetrics.throughput_unit``), with its interval
        (:func:`goblin_assets.measure.benchmark.bench_interval`).

    Raises
    ------
    ValueError
        A benchmark throughput is not > 0.
    """
    b, p = bench["baseline"], bench["patched"]
    interval = bench_interval(bench)
    cal = calibration or calibrate(patch, None)
    profiled, notes = reconcile(before, after, bench, interval)
    headroom = ([f"headroom batch: {before.not_observable['headroom_batch']}"]
                if before.headroom_batch is None and "headroom_batch" in before.not_observable else [])
    sb, sa = shares(before.waste_budget), shares(after.waste_budget)
    buckets = [
        BucketChange(bucket=k, before_s=before.waste_budget[k].seconds, after_s=after.waste_budget[k].seconds,
                     before_share=sb[k], after_share=sa[k], before_status=before.waste_budget[k].status,
                     after_status=after.waste_budget[k].status)
        for k in WASTE_BUCKETS if k in before.waste_budget and k in after.waste_budget
    ]
    prov = before.provenance
    return AuditReport(
        workload=before.workload, model=model, unit=before.unit, throughput_unit=before.throughput_unit,
        device=prov.device, torch_version=prov.torch_version, accelerator_version=_accelerator(before),
        batch_shape=_shape(config, before),
        baseline_throughput=b.median, baseline_spread=b.spread, patched_throughput=p.median,
        patched_spread=p.spread, baseline_throughputs=list(b.throughputs), patched_throughputs=list(p.throughputs),
        repeats=len(b.throughputs), steps=b.metrics.steps,
        measured_speedup=interval.point, measured_interval=interval, bench_stop_reason=b.stop_reason,
        predicted_low=cal.low, predicted_high=cal.high, confidence=cal.confidence, calibration=cal,
        profiled_speedup=profiled, reconciliation=notes,
        evidence_coverage=patch.evidence_coverage, rule_consistency=patch.rule_consistency, buckets=buckets,
        metrics=_side_by_side(before, after),
        before_step_time_s=before.step_time_s, after_step_time_s=after.step_time_s,
        applied=patch.applied, dropped=patch.dropped, consistency_notes=patch.consistency_notes, diff=redact(patch.diff),
        target_file=Path(patch.target_file).name if patch.target_file else "", env=patch.env,
        unset_env=patch.unset_env,
        provenance=f"{prov.kind} on {prov.device} (host {prov.host}, {prov.cpu_count} cores), "
                   f"{prov.profiler or 'torch.profiler'} for the waste budget, harness clock for throughput",
        cache_hits=[lab for lab, r in bench.items() if r.cache_hit],
        warnings=[*before.warnings, *headroom], created_at=time.strftime("%Y-%m-%d %H:%M:%S"),
        nonfinite_markdown=nonfinite.markdown if nonfinite else [], nonfinite_html=nonfinite.html if nonfinite else "",
        tensor_markdown=tensors.markdown() if tensors is not None else [],
        config_markdown=config_markdown(config),
        tensor_html=tensors.html() if tensors is not None else "",
        python=python, packages=dict(packages or {}), hazards=list(hazards or []), signals=list(before.signals or []),
        invariants=list(before.invariants or []), step_outliers=list(before.step_outliers or []), verdict=verdict,
    )
