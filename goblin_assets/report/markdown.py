"""The audit report as markdown (Dagster's metadata view, ``report.md``), and replayed audits' reports.

:func:`render_markdown` renders an :class:`~goblin_assets.report.compare.AuditReport`;
:func:`replay_report` builds the report of an audit whose run was replayed
(nothing measured); :func:`report_markdown` picks the one that fits.
"""
from __future__ import annotations

from pydantic import BaseModel

from goblin_assets.contracts import ConfigDict, Patch, RunMetrics
from goblin_assets.measure.benchmark import SpeedupInterval, verdict_line
from goblin_assets.measure.calibration import Calibration, calibrate
from goblin_assets.opscope.tensor_findings import TensorFindings
from goblin_assets.redact import redact
from goblin_assets.report.compare import AuditReport, HazardNote, config_markdown
from goblin_assets.report.verdict import Verdict


def no_rule_text(applied: list, dropped: list[str]) -> str:
    unapplied = [d for d in dropped if "already has the values" not in d]
    if unapplied:
        return (f"No rule was applied: {len(unapplied)} fired and could not be applied (see \"Not applied\"); "
                "the file is unchanged.")
    if dropped:
        return "No change needed: the rules that fired find the config already as they would set it."
    return "No tuning rule fired: nothing to patch."


def invariants_markdown(invariants) -> list[str]:
    """The run-time invariant checks (measure/invariants.py) as markdown lines: the broken ones with their
    evidence, then one line naming those that held and those the run could not show."""
    if not invariants:
        return []
    fired = [i for i in invariants if i.status == "fired"]
    out = ["## Invariants of the training step (measured in the run)", ""]
    if fired:
        out += ["| check | severity | what was measured | where | step | rules |", "|---|---|---|---|---|---|"]
        out += [f"| {i.id} | {i.severity} | {i.message[:200].replace('|', '/')} | {i.where.replace('|', '/')} | "
                f"{i.step if i.step is not None else ''} | {', '.join(i.rules)} |" for i in fired]
        out.append("")
    held = [i.id for i in invariants if i.status == "silent"]
    unseen = [f"{i.id} ({i.message})" for i in invariants if i.status == "not_observable"]
    out += [f"Held: {', '.join(held) or 'none'}.", ""]
    if unseen:
        out += [f"Not observable in this run: {'; '.join(unseen)}.", ""]
    return out


def outliers_markdown(outliers: list[dict]) -> list[str]:
    """The original run's outlier steps (:func:`goblin_assets.measure.step_outliers.outlier_steps`: past 1.5x the
    median step, TraceLens's criterion) after the warm-up as a markdown table: step, seconds, ratio to the median
    and the cause: a timed event that explains most of the step's excess (``checkpoint_save``, ``compile``, with
    how long and where), else the bucket that grew most (``not_observable`` for a step the profiler did not
    record).  A slow warm-up step is expected (allocation, autotuning, caches) and is not listed.  Empty when
    none."""
    measured = [o for o in outliers if o.get("phase") == "measured"]
    if not measured:
        return []
    out = ["## Outlier steps (original run, past 1.5x the median step)", "",
           "| step | time | × median | cause |", "|---|---|---|---|"]
    out += [f"| {o['step']} | {o['time_s'] * 1e3:.1f} ms | {o['ratio']:.1f}x | {o['cause']}"
            f"{': ' + o['cause_detail'].replace('|', '/') if o.get('cause_detail') else ''} |" for o in measured]
    return [*out, ""]


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
        out.append(no_rule_text(applied, dropped))
    for a in applied:
        changes = ", ".join(f"`{k}` {change_text(v)}" for k, v in a.changes.items())
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


def change_text(v: dict) -> str:
    frm = v.get("from", "unset")
    return f"{'unset' if frm is None else frm} → {'unset' if v.get('to') is None else v.get('to')}"


def num_text(v, unit: str = "") -> str:
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


def unit_text(rep: AuditReport) -> str:
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
    """The measured speedup in one line (:func:`~goblin_assets.measure.benchmark.verdict_line`): the verdict
    first, then the interval, the pairs faster and the sign test, and the pairs' time against the budget."""
    iv = rep.measured_interval
    return verdict_line(iv) if iv else f"{rep.measured_speedup:.2f}x (no interval)"


def stop_text(rep: AuditReport) -> str:
    return f"; repeats stopped: {rep.bench_stop_reason}" if rep.bench_stop_reason else ""


def predicted_text(rep: AuditReport) -> str:
    """The predicted range and confidence, and where they came from (the model, scaled by history or not)."""
    cal = rep.calibration
    src = "modelled from the waste budget"
    if cal is not None and cal.applied:
        src += f", scaled by the record of {cal.audits} measured audit{'s' if cal.audits != 1 else ''}"
    text = (f"Predicted {rep.predicted_low:.2f}x–{rep.predicted_high:.2f}x ({src}), confidence {rep.confidence:.2f} "
            f"(evidence coverage {rep.evidence_coverage:.2f} × rule consistency {rep.rule_consistency:.2f}"
            f"{'' if cal is None or not cal.applied else f' × record {cal.confidence_factor:.2f}'}).")
    return text + (f" {cal.note()}" if cal is not None else "")


def verdict_markdown(verdict: Verdict | None) -> list[str]:
    """The verdict as the report's first lines: the headline in bold, then every ranked item when there are several."""
    if verdict is None:
        return []
    out = [f"**Verdict: {verdict.headline}**", ""]
    if len(verdict.items) > 1:
        out += [f"- {line}" for line in verdict.lines()] + [""]
    return out


def patch_markdown(diff: str, verdict: Verdict | None, exact_note: bool = True) -> list[str]:
    """The patch section: "Patch to your file", or "Not recommended" with the measured change when it was slower."""
    body = ["```diff", diff.rstrip() or "(no change)", "```", ""]
    if verdict is not None and verdict.not_recommended:
        return ["## Not recommended: " + verdict.not_recommended, "",
                "The change below was benchmarked and made your program slower, so it is not offered as a fix and "
                "no `patch.diff` is written; the measurement stays in the report and the warehouse.", "", *body]
    note = (["Secrets and personal paths in it are redacted here; `patch.diff` beside this report is the exact "
             "diff: apply it in the workload folder with `git apply` or `patch -p1`.", ""] if exact_note else [])
    return ["## Patch to your file", "", *body, *note]


def render_markdown(rep: AuditReport, chart_name: str | None = None) -> str:
    """The report as GitHub-flavoured markdown (renders in Dagster's metadata view).

    Order: the verdict (report/verdict.py), the measured speedup, the non-finite evidence, the applied rules
    and hazards, the patch (or why it is not recommended), then the measurements behind them, the run's own
    signals, the tensor findings and the notes.
    """
    u = unit_text(rep)
    out = [f"# Goblin audit: {rep.workload}", "", *verdict_markdown(rep.verdict)]
    out += [f"**Measured speedup: {speedup_text(rep)}** ({rep.baseline_throughput:.1f} → "
            f"{rep.patched_throughput:.1f} {u}, medians of {rep.repeats} alternating repeats of "
            f"{rep.steps} steps each, no profiler on timed steps{stop_text(rep)}). {predicted_text(rep)}", ""]
    if rep.measured_interval is not None:
        out += [f"How the speedup was measured: {rep.measured_interval.method}.", ""]
    if rep.unit == "tokens":
        out += ["Throughput counts real (non-padding) tokens: a patch that removes padding computes fewer "
                "positions per step, so tokens/s with the pad included would understate its gain.", ""]
    if chart_name:
        out += [f"![waste budget and throughput]({chart_name})", ""]
    out += rep.nonfinite_markdown
    out += rules_markdown(rep.applied, rep.dropped, rep.env, rep.unset_env, rep.hazards, rep.consistency_notes)
    out += ["", *patch_markdown(rep.diff, rep.verdict)]
    out += rep.config_markdown
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
        out += [f"| {r.metric} | {num_text(r.before, r.unit)} | {num_text(r.after, r.unit)} |" for r in rep.metrics]
        out.append("")
    out += ["## Waste budget per step (measured with the profiler)", "",
            "| bucket | original | share | patched | share | status |", "|---|---|---|---|---|---|"]
    for bc in rep.buckets:
        status = bc.before_status if bc.before_status == bc.after_status else f"{bc.before_status} / {bc.after_status}"
        out.append(f"| {bc.bucket} | {bc.before_s * 1e3:.2f} ms | {bc.before_share:.0%} | {bc.after_s * 1e3:.2f} ms | "
                   f"{bc.after_share:.0%} | {status} |")
    out += ["", *outliers_markdown(rep.step_outliers), *signals_markdown(rep.signals),
            *invariants_markdown(rep.invariants), *rep.tensor_markdown,
            *rep.trace_diff_markdown]
    if rep.warnings:
        out += ["## Notes", "", *[f"- {w}" for w in rep.warnings], ""]
    out += ["---", _footer(rep)]
    return "\n".join(out) + "\n"


def report_markdown(rep: AuditReport | ReplayReport, chart_name: str | None = None) -> str:
    """The report as markdown: :func:`render_markdown` (chart linked as ``chart_name``), or a replay's own text."""
    return rep.markdown if isinstance(rep, ReplayReport) else render_markdown(rep, chart_name)



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
    verdict: Verdict | None = None
    markdown: str


def replay_report(before: RunMetrics, patch: Patch, config: ConfigDict, model: str = "",
                  calibration: Calibration | None = None, hazards: list[HazardNote] | None = None,
                  tensors: TensorFindings | None = None, verdict: Verdict | None = None,
                  not_benchmarked: str = "", nonfinite_markdown: list[str] | None = None) -> ReplayReport:
    """The report of an audit whose run was replayed, or profiled with nothing to benchmark (pure function).

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
    verdict : Verdict, optional
        The audit's ranked verdict, said first.
    not_benchmarked : str
        For a measured profile whose patch was not benchmarked (it changes nothing): why.
    nonfinite_markdown : list of str, optional
        The "Non-finite values" section (:class:`~goblin_assets.measure.evidence.NonfiniteEvidence`), when the
        run held NaN or inf.

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
    if kind == "measured":
        head = [f"# Goblin audit: {before.workload} (profiled; nothing benchmarked)", "", *verdict_markdown(verdict),
                f"**Measured speedup: not observable.** {(not_benchmarked or 'nothing was benchmarked').capitalize()}. "
                "The numbers below are the profiled run's (measured).", ""]
    else:
        head = [f"# Goblin audit: {before.workload} ({kind}, nothing measured by this run)", "",
                *verdict_markdown(verdict),
                f"**Measured speedup: not observable.** Every number below is {kind}, from the recording "
                f"`{source}`. A benchmark needs timed runs of the original and the patched workload, and a replay "
                f"runs nothing. Predicted {cal.low:.2f}x–{cal.high:.2f}x (modelled from the {kind} waste budget"
                f"{', scaled by measured audits' if cal.applied else ''}), confidence {cal.confidence:.2f}. "
                f"{cal.note()}", ""]
    out = [*head, *(nonfinite_markdown or []),
           *rules_markdown(patch.applied, patch.dropped, patch.env, patch.unset_env, list(hazards or []),
                           patch.consistency_notes),
           "", *patch_markdown(redact(patch.diff), verdict, exact_note=False), *config_markdown(config),
           f"## {'Profiled' if kind == 'measured' else 'Recorded'} run ({kind})", "", "| metric | value |", "|---|---|",
           *[f"| {k} | {v} |" for k, v in rows],
           "", f"## Waste budget per step ({kind})", "", "| bucket | ms/step | status |", "|---|---|---|",
           *[f"| {k} | {b.seconds * 1e3:.2f} | {b.status} |" for k, b in before.waste_budget.items()],
           "", *signals_markdown(before.signals), *invariants_markdown(before.invariants)]
    out += tensors.markdown() if tensors is not None else []
    if before.warnings:
        out += ["## Notes", "", *[f"- {w}" for w in before.warnings], ""]
    out += ["---", f"Workload `{before.workload}`, model {model or config.model_name or 'unknown'}, "
                   f"batch_size={config.batch_size}, seq_len={config.seq_len}. Numbers: {kind} ({source})."]
    return ReplayReport(workload=before.workload, unit=before.unit, provenance=kind, source=source,
                        predicted_low=cal.low, predicted_high=cal.high, confidence=cal.confidence, calibration=cal,
                        verdict=verdict, markdown="\n".join(out) + "\n")
