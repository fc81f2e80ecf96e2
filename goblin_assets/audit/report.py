"""compare_runs and the audit report (markdown with a chart).

:func:`compare_runs` is pure: two profiles, the benchmark results and the
patch in, the report model out.  :func:`write_report` renders it as markdown
(also attached as Dagster metadata) beside a matplotlib chart of the waste
budget before/after and the measured throughputs.
"""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from goblin_assets.audit.waste import shares
from goblin_assets.contracts import (
    WASTE_BUCKETS, AppliedRule, BenchmarkResult, ConfigDict, Patch, RunMetrics,
)


class BucketChange(BaseModel):
    bucket: str
    before_s: float
    after_s: float
    before_share: float
    after_share: float
    before_status: str
    after_status: str


class AuditReport(BaseModel):
    """Everything the audit report shows; every number says how it was obtained."""

    workload: str
    model: str
    unit: str
    device: str
    torch_version: str | None
    accelerator_version: str
    batch_shape: str
    baseline_throughput: float
    baseline_spread: float
    patched_throughput: float
    patched_spread: float
    repeats: int
    steps: int
    measured_speedup: float
    predicted_low: float
    predicted_high: float
    confidence: float
    buckets: list[BucketChange]
    before_step_time_s: float | None
    after_step_time_s: float | None
    applied: list[AppliedRule]
    dropped: list[str]
    diff: str
    env: dict[str, str]
    unset_env: list[str]
    provenance: str
    cache_hits: list[str]
    warnings: list[str]
    created_at: str


def compare_runs(before: RunMetrics, after: RunMetrics, bench: dict[str, BenchmarkResult], patch: Patch,
                 config: ConfigDict, model: str = "") -> AuditReport:
    """Build the report model from the original and patched runs (pure function).

    ``before``/``after`` are the profiled runs (waste budget); ``bench`` holds
    the alternating benchmark of ``baseline`` and ``patched`` (throughput).
    ``measured_speedup`` = patched median throughput / baseline median.
    """
    b, p = bench["baseline"], bench["patched"]
    sb, sa = shares(before.waste_budget), shares(after.waste_budget)
    buckets = [
        BucketChange(bucket=k, before_s=before.waste_budget[k].seconds, after_s=after.waste_budget[k].seconds,
                     before_share=sb[k], after_share=sa[k], before_status=before.waste_budget[k].status,
                     after_status=after.waste_budget[k].status)
        for k in WASTE_BUCKETS if k in before.waste_budget and k in after.waste_budget
    ]
    prov = before.provenance
    accel = (f"ROCm/HIP {prov.hip_version}" if prov.hip_version else
             f"CUDA {prov.cuda_version}" if prov.cuda_version and prov.device != "cpu" else "none (CPU)")
    shape = f"batch_size={config.batch_size}" + (f", seq_len={config.seq_len}" if config.seq_len else "")
    if before.samples_per_step:
        shape += f" (measured {before.samples_per_step:g} samples/step)"
    return AuditReport(
        workload=before.workload, model=model, unit=before.unit, device=prov.device,
        torch_version=prov.torch_version, accelerator_version=accel, batch_shape=shape,
        baseline_throughput=b.median, baseline_spread=b.spread, patched_throughput=p.median,
        patched_spread=p.spread, repeats=len(b.throughputs), steps=b.metrics.steps,
        measured_speedup=p.median / b.median, predicted_low=patch.expected_speedup_low,
        predicted_high=patch.expected_speedup_high, confidence=patch.confidence, buckets=buckets,
        before_step_time_s=before.step_time_s, after_step_time_s=after.step_time_s,
        applied=patch.applied, dropped=patch.dropped, diff=patch.diff, env=patch.env,
        unset_env=patch.unset_env,
        provenance=f"measured on {prov.device} (host {prov.host}, {prov.cpu_count} cores), torch.profiler for "
                   "the waste budget, harness clock for throughput",
        cache_hits=[lab for lab, r in bench.items() if r.cache_hit],
        warnings=[*before.warnings], created_at=time.strftime("%Y-%m-%d %H:%M:%S"),
    )


def plot_report(rep: AuditReport, path: Path) -> Path:
    """PNG: waste budget before/after (stacked, ms per step) and measured throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"useful": "#4c9a2a", "data_wait": "#d9534f", "host_gap": "#f0ad4e", "comm_excess": "#5bc0de",
              "precision_path": "#9b59b6", "kernel_shape": "#7f8c8d"}
    bottoms = [0.0, 0.0]
    for bc in rep.buckets:
        vals = [bc.before_s * 1e3, bc.after_s * 1e3]
        ax1.bar(["original", "patched"], vals, bottom=bottoms, label=bc.bucket, color=colors.get(bc.bucket))
        bottoms = [bottoms[0] + vals[0], bottoms[1] + vals[1]]
    ax1.set_ylabel("ms per step (measured, torch.profiler)")
    ax1.set_title("Waste budget per step")
    ax1.legend(fontsize=8, loc="upper right")
    ax2.bar(["original", "patched"], [rep.baseline_throughput, rep.patched_throughput],
            yerr=[[rep.baseline_spread / 2, rep.patched_spread / 2]] * 2, color=["#999999", "#4c9a2a"], capsize=6)
    ax2.set_ylabel(f"{rep.unit}/s (median of {rep.repeats}, measured)")
    ax2.set_title(f"Throughput: {rep.measured_speedup:.2f}x measured")
    fig.suptitle(f"{rep.workload} on {rep.device}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt_change(v: dict) -> str:
    frm = v.get("from", "unset")
    return f"{'unset' if frm is None else frm} → {'unset' if v.get('to') is None else v.get('to')}"


def render_markdown(rep: AuditReport, chart_name: str | None = None) -> str:
    """The report as GitHub-flavoured markdown (renders in Dagster's metadata view)."""
    u = rep.unit
    out = [f"# Goblin audit: {rep.workload}", ""]
    out += [f"**Measured speedup: {rep.measured_speedup:.2f}x** ({rep.baseline_throughput:.1f} → "
            f"{rep.patched_throughput:.1f} {u}/s, median of {rep.repeats} alternating repeats of "
            f"{rep.steps} steps each, no profiler on timed steps). "
            f"Predicted {rep.predicted_low:.2f}x–{rep.predicted_high:.2f}x (modelled from the waste budget), "
            f"confidence {rep.confidence:.2f}.", ""]
    if chart_name:
        out += [f"![waste budget and throughput]({chart_name})", ""]
    out += ["## Throughput (measured)", "", f"| run | {u}/s (median) | spread (max−min) | step time (profiled) |",
            "|---|---|---|---|",
            f"| original | {rep.baseline_throughput:.1f} | {rep.baseline_spread:.1f} | "
            f"{(rep.before_step_time_s or 0) * 1e3:.1f} ms |",
            f"| patched | {rep.patched_throughput:.1f} | {rep.patched_spread:.1f} | "
            f"{(rep.after_step_time_s or 0) * 1e3:.1f} ms |", ""]
    if rep.cache_hits:
        out += [f"Replayed from the benchmark cache (measured earlier, same config, script, image tag and runner "
                f"code): {', '.join(rep.cache_hits)}.", ""]
    out += ["## Waste budget per step (measured with torch.profiler)", "",
            "| bucket | original | share | patched | share | status |", "|---|---|---|---|---|---|"]
    for bc in rep.buckets:
        status = bc.before_status if bc.before_status == bc.after_status else f"{bc.before_status} / {bc.after_status}"
        out.append(f"| {bc.bucket} | {bc.before_s * 1e3:.2f} ms | {bc.before_share:.0%} | {bc.after_s * 1e3:.2f} ms | "
                   f"{bc.after_share:.0%} | {status} |")
    out += ["", "## Applied rules", ""]
    if not rep.applied:
        out.append("No rule fired: nothing to patch.")
    for a in rep.applied:
        changes = ", ".join(f"`{k}` {_fmt_change(v)}" for k, v in a.changes.items())
        out += [f"- **{a.rule_id}** ({a.category}, targets `{a.targets_bucket}`): {changes}.",
                f"  {a.rationale}",
                f"  Source: [{a.citation.title}]({a.citation.url}), {a.citation.section}."]
    if rep.dropped:
        out += ["", "Not applied:", *[f"- {d}" for d in rep.dropped]]
    if rep.env or rep.unset_env:
        out += ["", "Environment changes for the patched run:", "", "```sh",
                *[f"export {k}={v}" for k, v in rep.env.items()], *[f"unset {k}" for k in rep.unset_env], "```"]
    out += ["", "## Patch to your file", "", "```diff", rep.diff.rstrip() or "(no change)", "```", "",
            "Apply it in the workload folder with `git apply` or `patch -p1`.", ""]
    if rep.warnings:
        out += ["## Notes", "", *[f"- {w}" for w in rep.warnings], ""]
    out += ["---", f"This recommendation holds for: workload `{rep.workload}`, model {rep.model or 'unknown'}, "
            f"device {rep.device}, accelerator stack {rep.accelerator_version}, torch {rep.torch_version}, "
            f"{rep.batch_shape}. Numbers: {rep.provenance}. Generated {rep.created_at}."]
    return "\n".join(out) + "\n"


def write_report(rep: AuditReport, out_dir: Path) -> Path:
    """Write ``report.md`` and ``report.png`` into ``out_dir``; return the markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chart = plot_report(rep, out_dir / "report.png")
    md = out_dir / "report.md"
    md.write_text(render_markdown(rep, chart.name), encoding="utf-8")
    return md
