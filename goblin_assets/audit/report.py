"""compare_runs and the audit report (markdown, a PNG, a self-contained HTML page).

:func:`compare_runs` is pure: two profiles, the benchmark results and the
patch in, the report model out.  :func:`render_markdown` renders it for
Dagster's metadata view; :func:`render_html` as one HTML file with the waste
budget (before vs after, stacked by bucket) and the throughput chart embedded
as base64 PNGs, the applied rules with their citations, the diff and the
footer stating the exact tuple the recommendation holds for.

Throughput is in the workload's honest unit (``RunMetrics.throughput``):
samples/s, or for token workloads *real* (non-padding) tokens/s, because a
patch that removes padding processes fewer positions per step while doing
more useful work per second.

The measured speedup always comes with its interval
(:func:`goblin_assets.audit.benchmark.bench_interval`); one whose interval
contains 1.0 reads "no significant change".  The predicted range is the
waste-budget model's, scaled by the applied rules' measured record when the
caller passed one (:mod:`goblin_assets.audit.calibration`).  The report
also reconciles the profiled runs' implied speedup with the benchmarked one
(:func:`reconcile`).
"""
from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path

from pydantic import BaseModel, Field

from goblin_assets.redact import redact
from goblin_assets.audit.benchmark import SpeedupInterval, bench_interval
from goblin_assets.audit.calibration import Calibration, calibrate
from goblin_assets.audit.evidence import NonfiniteEvidence
from goblin_assets.audit.tensor_findings import TensorFindings
from goblin_assets.audit.waste import shares
from goblin_assets.contracts import (
    WASTE_BUCKETS, AppliedRule, BenchmarkResult, ConfigDict, Patch, RunMetrics, Signal,
)

#: Bucket colours shared by the PNG and the HTML legend.
BUCKET_COLORS = {"useful": "#4c9a2a", "data_wait": "#d9534f", "host_gap": "#f0ad4e", "comm_excess": "#5bc0de",
                 "precision_path": "#9b59b6", "kernel_shape": "#7f8c8d"}


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
    trace_diff_markdown: list[str] = Field(default_factory=list)
    python: str | None = None
    packages: dict[str, str | None] = Field(default_factory=dict)
    hazards: list[HazardNote] = Field(default_factory=list)
    signals: list[Signal] = Field(default_factory=list)


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


def compare_runs(before: RunMetrics, after: RunMetrics, bench: dict[str, BenchmarkResult], patch: Patch,
                 config: ConfigDict, model: str = "", calibration: Calibration | None = None,
                 nonfinite: NonfiniteEvidence | None = None, python: str | None = None,
                 packages: dict[str, str | None] | None = None,
                 hazards: list[HazardNote] | None = None, tensors: TensorFindings | None = None) -> AuditReport:
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
        The "Non-finite values" section (audit/evidence.py), when the run's
        tensors or parameters held NaN or inf.
    python, packages : optional
        The job's interpreter and its library versions (the footer states them).
    hazards : list of HazardNote, optional
        The hazards and warnings that fired (:func:`hazard_notes`).
    tensors : TensorFindings, optional
        The "Tensor findings" section (audit/tensor_findings.py), when tensors were sketched.
    calibration : Calibration, optional
        The patch's prediction scaled by its rules' record
        (:func:`goblin_assets.audit.calibration.calibrate`); default: the
        model's prediction unscaled.

    Returns
    -------
    AuditReport
        ``measured_speedup`` = the geometric mean of the paired
        patched/original throughput ratios, in the workload's honest unit
        (``RunMetrics.throughput_unit``), with its interval
        (:func:`goblin_assets.audit.benchmark.bench_interval`).

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
        tensor_html=tensors.html() if tensors is not None else "",
        python=python, packages=dict(packages or {}), hazards=list(hazards or []), signals=list(before.signals or []),
    )


# --------------------------------------------------------------------------- charts

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _waste_axes(ax, rep: AuditReport) -> None:
    bottoms = [0.0, 0.0]
    for bc in rep.buckets:
        vals = [bc.before_s * 1e3, bc.after_s * 1e3]
        label = bc.bucket + ("" if bc.before_status == "measured" else f" ({bc.before_status})")
        ax.bar(["original", "patched"], vals, bottom=bottoms, label=label, color=BUCKET_COLORS.get(bc.bucket))
        bottoms = [bottoms[0] + vals[0], bottoms[1] + vals[1]]
    ax.set_ylabel("ms per step (measured, profiled)")
    ax.set_title("Waste budget per step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _throughput_axes(ax, rep: AuditReport) -> None:
    medians = [rep.baseline_throughput, rep.patched_throughput]
    runs = [rep.baseline_throughputs or [medians[0]], rep.patched_throughputs or [medians[1]]]
    # error bars span the repeats (min..max around the median), never below zero
    err = [[m - min(r) for m, r in zip(medians, runs)], [max(r) - m for m, r in zip(medians, runs)]]
    ax.bar(["original", "patched"], medians, yerr=err, color=["#999999", "#4c9a2a"], capsize=6)
    for i, vals in enumerate((rep.baseline_throughputs, rep.patched_throughputs)):
        ax.scatter([i] * len(vals), vals, color="black", s=12, zorder=3)
    lo, hi = rep.baseline_throughput * rep.predicted_low, rep.baseline_throughput * rep.predicted_high
    ax.hlines([lo, hi], 0.55, 1.45, colors="#1f4f0f", linestyles="dashed",
              label=f"predicted range {rep.predicted_low:.2f}x-{rep.predicted_high:.2f}x")
    ax.set_ylabel(f"{rep.throughput_unit or rep.unit + '/s'} (median of {rep.repeats}, measured)")
    iv = rep.measured_interval
    if iv is None or iv.low is None or iv.high is None:
        title = f"Throughput: {rep.measured_speedup:.2f}x measured (no interval)"
    elif iv.verdict == "no significant change":
        title = f"Throughput: no significant change\n({iv.level:.0%} interval {iv.low:.2f}x–{iv.high:.2f}x)"
    else:
        title = f"Throughput: {iv.point:.2f}x measured\n({iv.level:.0%} interval {iv.low:.2f}x–{iv.high:.2f}x)"
    ax.set_title(title)
    top = max([hi, *runs[0], *runs[1]])
    ax.set_ylim(0, top * 1.18)          # room for the legend above the predicted range
    ax.legend(fontsize=8, loc="upper left")


def _png(draw, rep: AuditReport, size: tuple[float, float]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=size)
    draw(ax, rep)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def plot_report(rep: AuditReport, path: Path) -> Path:
    """PNG: waste budget before/after (stacked, ms per step) and measured throughput, side by side."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    _waste_axes(ax1, rep)
    _throughput_axes(ax2, rep)
    fig.suptitle(f"{rep.workload} on {rep.device}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- markdown

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


def _no_rule_text(applied: list, dropped: list[str]) -> str:
    unapplied = [d for d in dropped if "already has the values" not in d]
    if unapplied:
        return (f"No rule was applied: {len(unapplied)} fired and could not be applied (see \"Not applied\"); "
                "the file is unchanged.")
    if dropped:
        return "No change needed: the rules that fired find the config already as they would set it."
    return "No tuning rule fired: nothing to patch."


def signals_markdown(signals) -> list[str]:
    """The run's own signals (deduplicated warnings, stderr lines, loss and gradient records) as markdown lines."""
    if not signals:
        return []
    out = ["## The run's own signals", "", "| signal | times | first | where | step |", "|---|---|---|---|---|"]
    out += [f"| {s.id} | {s.count} | {s.message[:120].replace('|', '/')} | {s.where} | "
            f"{s.step if s.step is not None else ''} |" for s in signals]
    out += ["", *[f"- **{s.id}**: {s.meaning}" for s in signals if s.meaning], ""]
    return out


def rules_markdown(applied: list, dropped: list[str], env: dict[str, str], unset_env: list[str],
                   hazards: list[HazardNote], consistency_notes: list[str] = ()) -> list[str]:
    """The report's rule sections as markdown lines: hazards and warnings, every applied rule with each change
    and its value (environment variables included), how rules were combined, every dropped rule with its reason,
    and the environment of the patched run.  Shared by measured and replayed reports."""
    out: list[str] = []
    if hazards:
        out += ["## Hazards and warnings", ""]
        for h in hazards:
            blocks = f" Blocks: {', '.join(f'`{b}`' for b in h.blocks)}." if h.blocks else ""
            seen = f" Evidence: {h.evidence}." if h.evidence else ""
            out += [f"- **{h.kind}: {h.rule_id}**: {h.text} {h.action}{blocks}{seen} Source: [{h.title}]({h.url})."]
        out.append("")
    out += ["## Applied rules", ""]
    if not applied:
        out.append(_no_rule_text(applied, dropped))
    for a in applied:
        changes = ", ".join(f"`{k}` {_fmt_change(v)}" for k, v in a.changes.items())
        out += [f"- **{a.rule_id}** ({a.category}, targets `{a.targets_bucket}`, predicted "
                f"{a.predicted_recovery:.0%} of the step): {changes}.",
                f"  {a.rationale}",
                f"  Source: [{a.citation.title}]({a.citation.url}), {a.citation.section}."]
    if consistency_notes:
        out += ["", "How the rules were combined:", *[f"- {n}" for n in consistency_notes]]
    if dropped:
        out += ["", "Not applied:", *[f"- {d}" for d in dropped]]
    if env or unset_env:
        out += ["", "Environment changes for the patched run:", "", "```sh",
                *[f"export {k}={v}" for k, v in env.items()], *[f"unset {k}" for k in unset_env], "```"]
    return out


def _fmt_change(v: dict) -> str:
    frm = v.get("from", "unset")
    return f"{'unset' if frm is None else frm} → {'unset' if v.get('to') is None else v.get('to')}"


def _num(v, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    if unit == "%":
        return f"{v:.1f} %"
    if unit == "s":
        return f"{v * 1e3:.1f} ms"
    text = f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{text} {unit}".strip() if unit in ("GB",) else text


def _unit(rep: AuditReport) -> str:
    return rep.throughput_unit or f"{rep.unit}/s"


def environment_text(rep: AuditReport) -> str:
    """The job's interpreter and the versions of its libraries the audit read, e.g. ``python /venv/bin/python;
    transformers 5.24.0, peft 0.21.2, bitsandbytes not installed`` ('' when unknown)."""
    if not rep.python and not rep.packages:
        return ""
    pkgs = ", ".join(f"{k} {v or 'not installed'}" for k, v in sorted(rep.packages.items()))
    return f"python {rep.python or '(goblin’s own)'}" + (f"; {pkgs}" if pkgs else "")


def _footer(rep: AuditReport) -> str:
    env = environment_text(rep)
    return (f"This recommendation holds for: workload `{rep.workload}`, model {rep.model or 'unknown'}, "
            f"device {rep.device}, accelerator stack {rep.accelerator_version}, torch {rep.torch_version}, "
            f"{rep.batch_shape}" + (f", environment: {env}" if env else "") +
            f". Numbers: {rep.provenance}. Generated {rep.created_at}.")


def speedup_text(rep: AuditReport) -> str:
    """The measured speedup with its interval; "no significant change" first when the interval contains 1.0."""
    return rep.measured_interval.headline() if rep.measured_interval else f"{rep.measured_speedup:.2f}x (no interval)"


def _stop_text(rep: AuditReport) -> str:
    return f"; repeats stopped: {rep.bench_stop_reason}" if rep.bench_stop_reason else ""


def _predicted_text(rep: AuditReport) -> str:
    """The predicted range and confidence, and where they came from (the model, scaled by history or not)."""
    cal = rep.calibration
    src = "modelled from the waste budget"
    if cal is not None and cal.applied:
        src += f", scaled by the record of {cal.audits} measured audit{'s' if cal.audits != 1 else ''}"
    text = (f"Predicted {rep.predicted_low:.2f}x–{rep.predicted_high:.2f}x ({src}), confidence {rep.confidence:.2f} "
            f"(evidence coverage {rep.evidence_coverage:.2f} × rule consistency {rep.rule_consistency:.2f}"
            f"{'' if cal is None or not cal.applied else f' × record {cal.confidence_factor:.2f}'}).")
    return text + (f" {cal.note()}" if cal is not None else "")


def render_markdown(rep: AuditReport, chart_name: str | None = None) -> str:
    """The report as GitHub-flavoured markdown (renders in Dagster's metadata view)."""
    u = _unit(rep)
    out = [f"# Goblin audit: {rep.workload}", ""]
    out += [f"**Measured speedup: {speedup_text(rep)}** ({rep.baseline_throughput:.1f} → "
            f"{rep.patched_throughput:.1f} {u}, medians of {rep.repeats} alternating repeats of "
            f"{rep.steps} steps each, no profiler on timed steps{_stop_text(rep)}). {_predicted_text(rep)}", ""]
    if rep.measured_interval is not None:
        out += [f"How the speedup was measured: {rep.measured_interval.method}.", ""]
    if rep.unit == "tokens":
        out += ["Throughput counts real (non-padding) tokens: a patch that removes padding computes fewer "
                "positions per step, so tokens/s with the pad included would understate its gain.", ""]
    if chart_name:
        out += [f"![waste budget and throughput]({chart_name})", ""]
    out += rep.nonfinite_markdown
    out += rep.tensor_markdown
    out += rep.trace_diff_markdown
    out += ["## Throughput (measured)", "", f"| run | {u} (median) | spread (max−min) | step time (profiled) |",
            "|---|---|---|---|",
            f"| original | {rep.baseline_throughput:.1f} | {rep.baseline_spread:.1f} | "
            f"{(rep.before_step_time_s or 0) * 1e3:.1f} ms |",
            f"| patched | {rep.patched_throughput:.1f} | {rep.patched_spread:.1f} | "
            f"{(rep.after_step_time_s or 0) * 1e3:.1f} ms |", ""]
    if rep.cache_hits:
        out += [f"Replayed from the benchmark cache (measured earlier, same config, script, image tag and runner "
                f"code): {', '.join(rep.cache_hits)}.", ""]
    if rep.reconciliation:
        out += ["## Profiled vs benchmarked", "", *[f"- {n}" for n in rep.reconciliation], ""]
    if rep.metrics:
        out += ["## Side by side (profiled runs)", "", "| metric | original | patched |", "|---|---|---|"]
        out += [f"| {r.metric} | {_num(r.before, r.unit)} | {_num(r.after, r.unit)} |" for r in rep.metrics]
        out.append("")
    out += ["## Waste budget per step (measured with the profiler)", "",
            "| bucket | original | share | patched | share | status |", "|---|---|---|---|---|---|"]
    for bc in rep.buckets:
        status = bc.before_status if bc.before_status == bc.after_status else f"{bc.before_status} / {bc.after_status}"
        out.append(f"| {bc.bucket} | {bc.before_s * 1e3:.2f} ms | {bc.before_share:.0%} | {bc.after_s * 1e3:.2f} ms | "
                   f"{bc.after_share:.0%} | {status} |")
    out += ["", *signals_markdown(rep.signals), *rules_markdown(rep.applied, rep.dropped, rep.env, rep.unset_env,
                                                                rep.hazards, rep.consistency_notes)]
    out += ["", "## Patch to your file", "", "```diff", rep.diff.rstrip() or "(no change)", "```", "",
            "Secrets and personal paths in it are redacted here; `patch.diff` beside this report is the exact "
            "diff: apply it in the workload folder with `git apply` or `patch -p1`.", ""]
    if rep.warnings:
        out += ["## Notes", "", *[f"- {w}" for w in rep.warnings], ""]
    out += ["---", _footer(rep)]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:1.6em}
.headline{font-size:1.15em;background:#f3f8ef;border-left:4px solid #4c9a2a;padding:.6em 1em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:right}
th{background:#f6f6f6}td:first-child,th:first-child{text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:1em}.charts figure{margin:0}.charts img{max-width:100%;
border:1px solid #eee}
pre.diff{background:#fafafa;border:1px solid #ddd;padding:.6em;overflow-x:auto;font-size:.85em}
pre.diff .add{color:#1a7f37;background:#e6ffec;display:block}pre.diff .del{color:#cf222e;background:#ffebe9;
display:block}pre.diff .hunk{color:#8250df;display:block}
.rule{border:1px solid #e3e3e3;border-radius:4px;padding:.5em .8em;margin:.6em 0}.rule .id{font-weight:600}
.muted{color:#666;font-size:.9em}footer{margin-top:2em;border-top:1px solid #ddd;padding-top:.6em}
footer table td{text-align:left}code{background:#f3f3f3;padding:0 .2em}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _diff_html(diff: str) -> str:
    if not diff.strip():
        return '<p class="muted">No change to the file.</p>'
    lines = []
    for ln in diff.rstrip("\n").split("\n"):
        cls = ("hunk" if ln.startswith("@@") else "add" if ln.startswith("+") and not ln.startswith("+++")
               else "del" if ln.startswith("-") and not ln.startswith("---") else "")
        lines.append(f'<span class="{cls}">{_e(ln)}</span>' if cls else _e(ln))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def render_html(rep: AuditReport) -> str:
    """The report as one self-contained HTML page (charts embedded as base64 PNG, no external assets).

    Sections: the headline (measured vs predicted speedup, confidence), the
    waste-budget chart (before vs after, stacked by bucket) and the
    throughput chart, the side-by-side metrics, the waste budget table, each
    applied rule with its citation, rules not applied and why, how rules on
    the same bucket were combined, the diff of the user's file, notes, and
    the footer tuple (workload, model, device, ROCm/CUDA version, torch
    version, batch/sequence shape).
    """
    u = _unit(rep)
    waste_png = _png(_waste_axes, rep, (7.5, 4))
    tput_png = _png(_throughput_axes, rep, (5, 4))
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Goblin audit: {_e(rep.workload)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Goblin audit: {_e(rep.workload)}</h1>",
        f'<p class="muted">{_e(rep.model)} · {_e(rep.device)} · generated {_e(rep.created_at)}</p>',
        f'<p class="headline"><b>Measured speedup: {_e(speedup_text(rep))}</b> '
        f"({rep.baseline_throughput:,.1f} → {rep.patched_throughput:,.1f} {_e(u)}, medians of {rep.repeats} "
        f"alternating repeats of {rep.steps} steps, no profiler on timed steps{_e(_stop_text(rep))}). "
        f"{_e(_predicted_text(rep))}</p>",
    ]
    if rep.nonfinite_html:
        parts.append(rep.nonfinite_html)
    if rep.tensor_html:
        parts.append(rep.tensor_html)
    if rep.measured_interval is not None:
        parts.append(f'<p class="muted">How the speedup was measured: {_e(rep.measured_interval.method)}.</p>')
    if rep.unit == "tokens":
        parts.append('<p class="muted">Throughput counts real (non-padding) tokens: a patch that removes padding '
                     "computes fewer positions per step, so tokens/s with the pad included would understate it.</p>")
    if rep.cache_hits:
        parts.append(f'<p class="muted">Replayed from the benchmark cache (measured earlier with the same config, '
                     f"script, image and runner code): {_e(', '.join(rep.cache_hits))}.</p>")
    parts += ['<div class="charts">',
              f"<figure>{_img(waste_png, 'waste budget per step, original vs patched, stacked by bucket')}"
              "<figcaption class=\"muted\">Waste budget per step (ms), stacked by bucket.</figcaption></figure>",
              f"<figure>{_img(tput_png, 'measured throughput, original vs patched')}"
              f"<figcaption class=\"muted\">Throughput ({_e(u)}); dots are the repeats, dashed lines the "
              "predicted range."
              "</figcaption></figure>", "</div>"]
    if rep.reconciliation:
        parts += ["<h2>Profiled vs benchmarked</h2><ul>", *[f"<li>{_e(n)}</li>" for n in rep.reconciliation],
                  "</ul>"]
    parts += ["<h2>Side by side (profiled runs)</h2>", "<table><tr><th>metric</th><th>original</th>"
              "<th>patched</th></tr>"]
    parts += [f"<tr><td>{_e(r.metric)}</td><td>{_e(_num(r.before, r.unit))}</td><td>{_e(_num(r.after, r.unit))}"
              "</td></tr>" for r in rep.metrics]
    parts += ["</table>", "<h2>Waste budget per step</h2>",
              "<table><tr><th>bucket</th><th>original</th><th>share</th><th>patched</th><th>share</th>"
              "<th>status</th></tr>"]
    for bc in rep.buckets:
        status = bc.before_status if bc.before_status == bc.after_status else f"{bc.before_status} / {bc.after_status}"
        parts.append(f"<tr><td>{_e(bc.bucket)}</td><td>{bc.before_s * 1e3:.2f} ms</td><td>{bc.before_share:.0%}</td>"
                     f"<td>{bc.after_s * 1e3:.2f} ms</td><td>{bc.after_share:.0%}</td><td>{_e(status)}</td></tr>")
    parts += ["</table>"]
    if rep.hazards:
        parts += ["<h2>Hazards and warnings</h2>", *[
            f'<div class="rule"><span class="id">{_e(h.kind)}: {_e(h.rule_id)}</span><br>{_e(h.text)} '
            f"{_e(h.action)}" + (f"<br>Blocks: {_e(', '.join(h.blocks))}" if h.blocks else "") +
            (f"<br>Evidence: {_e(h.evidence)}" if h.evidence else "") +
            f'<br><span class="muted">Source: <a href="{_e(h.url)}">{_e(h.title)}</a></span></div>'
            for h in rep.hazards]]
    if rep.signals:
        parts += ["<h2>The run's own signals</h2>", "<table><tr><th>signal</th><th>times</th><th>first</th>"
                  "<th>where</th><th>step</th></tr>",
                  *[f"<tr><td>{_e(x.id)}</td><td>{x.count}</td><td>{_e(x.message[:160])}</td><td>{_e(x.where)}</td>"
                    f"<td>{'' if x.step is None else x.step}</td></tr>" for x in rep.signals], "</table>"]
    parts += ["<h2>Applied rules</h2>"]
    if not rep.applied:
        parts.append(f"<p>{_e(_no_rule_text(rep.applied, rep.dropped))}</p>")
    for a in rep.applied:
        changes = ", ".join(f"<code>{_e(k)}</code> {_e(_fmt_change(v))}" for k, v in a.changes.items())
        parts.append(
            f'<div class="rule"><span class="id">{_e(a.rule_id)}</span> <span class="muted">({_e(a.category)}, '
            f"targets <code>{_e(a.targets_bucket)}</code>, predicted {a.predicted_recovery:.0%} of the step)</span>"
            f"<br>{changes}<br>{_e(a.rationale)}<br><span class=\"muted\">Source: "
            f'<a href="{_e(a.citation.url)}">{_e(a.citation.title)}</a>, {_e(a.citation.section)}</span></div>')
    if rep.consistency_notes:
        parts += ["<p><b>How the rules were combined</b></p><ul>",
                  *[f"<li>{_e(n)}</li>" for n in rep.consistency_notes], "</ul>"]
    if rep.dropped:
        parts += ["<p><b>Not applied</b></p><ul>", *[f"<li>{_e(d)}</li>" for d in rep.dropped], "</ul>"]
    if rep.env or rep.unset_env:
        env = [f"export {k}={v}" for k, v in rep.env.items()] + [f"unset {k}" for k in rep.unset_env]
        parts += ["<p><b>Environment for the patched run</b></p>", f'<pre class="diff">{_e(chr(10).join(env))}</pre>']
    parts += [f"<h2>Patch to your file{' (' + _e(rep.target_file) + ')' if rep.target_file else ''}</h2>",
              _diff_html(rep.diff),
              '<p class="muted">Apply it in the workload folder with <code>git apply</code> or '
              "<code>patch -p1</code>.</p>"]
    if rep.warnings:
        parts += ["<h2>Notes</h2><ul>", *[f"<li>{_e(w)}</li>" for w in rep.warnings], "</ul>"]
    footer = [("workload", rep.workload), ("model", rep.model or "unknown"), ("device", rep.device),
              ("ROCm/CUDA", rep.accelerator_version), ("torch", rep.torch_version),
              ("batch/sequence shape", rep.batch_shape), ("environment", environment_text(rep) or "unknown"),
              ("numbers", rep.provenance)]
    parts += ["<footer><p><b>This recommendation holds for</b></p><table>",
              *[f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in footer], "</table></footer>",
              "</body></html>"]
    return "\n".join(parts) + "\n"


def report_markdown(rep: AuditReport | ReplayReport, chart_name: str | None = None) -> str:
    """The report as markdown: :func:`render_markdown` (chart linked as ``chart_name``), or a replay's own text."""
    return rep.markdown if isinstance(rep, ReplayReport) else render_markdown(rep, chart_name)


def render_replay_html(rep: ReplayReport) -> str:
    """A replayed audit's report (:attr:`ReplayReport.markdown`) as one self-contained HTML page.

    The markdown is rendered with markdown-it (CommonMark plus tables), in
    the same page style as :func:`render_html`; nothing is added to it, so the
    page states exactly what the markdown report states.
    """
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(rep.markdown)
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>Goblin audit: {_e(rep.workload)} ({_e(rep.provenance)})</title>"
                      f"<style>{_CSS}</style></head><body>", body, "</body></html>"]) + "\n"


def write_html(rep: AuditReport | ReplayReport, path: Path) -> Path:
    """Write the report as HTML (:func:`render_html`, or :func:`render_replay_html` for a replay) to ``path``.

    Parents are created; returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    page = render_replay_html(rep) if isinstance(rep, ReplayReport) else render_html(rep)
    path.write_text(page, encoding="utf-8")
    return path


def write_report(rep: AuditReport, out_dir: Path) -> Path:
    """Write ``report.md``, ``report.png`` and ``report.html`` into ``out_dir``; return the markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chart = plot_report(rep, out_dir / "report.png")
    write_html(rep, out_dir / "report.html")
    md = out_dir / "report.md"
    md.write_text(render_markdown(rep, chart.name), encoding="utf-8")
    return md


# --------------------------------------------------------------------------- replayed audits

class ReplayReport(BaseModel):
    """The audit report of a replay workload: recorded numbers, fired rules and the patch.

    Nothing was measured, so the measured throughputs and speedup are None
    (the ``audits`` row keeps them NULL); ``provenance`` is the recording's
    label (``replayed`` or ``modelled``) and ``source`` where it came from.
    The attributes match what :func:`goblin_assets.warehouse.frames.audit_frame`
    reads from an ``AuditReport``.
    """

    workload: str
    unit: str
    provenance: str
    source: str
    predicted_low: float
    predicted_high: float
    confidence: float
    baseline_throughput: float | None = None
    patched_throughput: float | None = None
    measured_speedup: float | None = None
    measured_interval: SpeedupInterval | None = None
    calibration: Calibration | None = None
    markdown: str


def replay_report(before: RunMetrics, patch: Patch, config: ConfigDict, model: str = "",
                  calibration: Calibration | None = None, hazards: list[HazardNote] | None = None,
                  tensors: TensorFindings | None = None) -> ReplayReport:
    """The report of an audit whose run was replayed (pure function).

    Parameters
    ----------
    before : RunMetrics
        The replayed profile run (``provenance.kind`` replayed or modelled).
    patch : Patch
        The fired rules applied to the workload's own config file.
    config : ConfigDict
        The parsed config (batch size and sequence length for the footer).
    model : str
        A human-readable model name.
    calibration : Calibration, optional
        The patch's prediction scaled by its rules' record (default: the
        model's prediction unscaled).
    hazards : list of HazardNote, optional
        The hazards and warnings that fired.
    tensors : TensorFindings, optional
        The "Tensor findings" section, where the recording holds sketches (a replay usually has none).

    Units: step times in ms, throughputs in the run's ``throughput_unit``.
    """
    kind, u = before.provenance.kind, before.throughput_unit
    cal = calibration or calibrate(patch, None)
    source = before.provenance.source
    def val(v: float | None, fmt: str, key: str) -> str:  # a missing number is never shown as 0
        return fmt.format(v) if v is not None else "not observable" + (
            f" ({before.not_observable[key]})" if key in before.not_observable else "")

    rows = [("step time (median)", val(None if before.step_time_s is None else before.step_time_s * 1e3,
                                       "{:.1f} ms", "step_time_s")),
            (u, val(before.throughput, "{:,.1f}", "throughput")), ("MFU", val(before.mfu_pct, "{:.1f} %", "mfu_pct")),
            ("memory peak", val(before.mem_peak_gb, "{:.1f} GB", "mem_peak_gb")),
            ("utilisation", val(before.util_pct, "{:.0f} %", "util_pct")), ("device", before.provenance.device)]
    out = [f"# Goblin audit: {before.workload} ({kind}, nothing measured by this run)", "",
           f"**Measured speedup: not observable.** Every number below is {kind}, from the recording "
           f"`{source}`. A benchmark needs timed runs of the original and the patched workload, and a replay runs "
           f"nothing. Predicted {cal.low:.2f}x–{cal.high:.2f}x (modelled from the {kind} waste budget"
           f"{', scaled by measured audits' if cal.applied else ''}), confidence {cal.confidence:.2f}. "
           f"{cal.note()}", "",
           f"## Recorded run ({kind})", "", "| metric | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows],
           "", f"## Waste budget per step ({kind})", "", "| bucket | ms/step | status |", "|---|---|---|",
           *[f"| {k} | {b.seconds * 1e3:.2f} | {b.status} |" for k, b in before.waste_budget.items()],
           ""]
    out += tensors.markdown() if tensors is not None else []
    out += signals_markdown(before.signals)
    out += rules_markdown(patch.applied, patch.dropped, patch.env, patch.unset_env, list(hazards or []),
                          patch.consistency_notes)
    out += ["", "## Patch to your file", "", "```diff", redact(patch.diff).rstrip() or "(no change)", "```", ""]
    if before.warnings:
        out += ["## Notes", "", *[f"- {w}" for w in before.warnings], ""]
    out += ["---", f"Workload `{before.workload}`, model {model or config.model_name or 'unknown'}, "
                   f"batch_size={config.batch_size}, seq_len={config.seq_len}. Numbers: {kind} ({source})."]
    return ReplayReport(workload=before.workload, unit=before.unit, provenance=kind, source=source,
                        predicted_low=cal.low, predicted_high=cal.high, confidence=cal.confidence, calibration=cal,
                        markdown="\n".join(out) + "\n")
