"""The audit report as one self-contained HTML page, and its charts (PNG).

:func:`render_html` embeds the waste budget (before vs after, stacked by
bucket) and the throughput chart as base64 PNGs, the applied rules with their
citations, the diff and the footer stating the exact tuple the recommendation
holds for; :func:`write_report` writes ``report.md``, ``report.png`` and
``report.html``.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from goblin_assets.measure.benchmark import interval_text
from goblin_assets.report.compare import AuditReport
from goblin_assets.report.markdown import (
    ReplayReport,
    change_text,
    environment_text,
    no_rule_text,
    num_text,
    predicted_text,
    render_markdown,
    speedup_text,
    stop_text,
    unit_text,
)

#: Bucket colours shared by the PNG and the HTML legend.
BUCKET_COLORS = {"useful": "#4c9a2a", "data_wait": "#d9534f", "host_gap": "#f0ad4e", "comm_excess": "#5bc0de",
                 "precision_path": "#9b59b6", "kernel_shape": "#7f8c8d"}



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
        title = f"Throughput: no significant change\n({interval_text(iv)})"
    else:
        title = f"Throughput: {iv.point:.2f}x measured\n({interval_text(iv)})"
    ax.set_title(title)
    top = max([hi, *runs[0], *runs[1]])
    ax.set_ylim(0, top * 1.18)          # room for the legend above the predicted range
    ax.legend(fontsize=8, loc="upper left")


def fig_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (100 dpi, tight layout); the figure is closed."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


def _png(draw, rep: AuditReport, size: tuple[float, float]) -> bytes:
    fig, ax = _plt().subplots(figsize=size)
    draw(ax, rep)
    return fig_png(fig)


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


def _verdict_html(rep: AuditReport) -> list[str]:
    """The verdict first: its headline, and its ranked items when there are several."""
    v = rep.verdict
    if v is None:
        return []
    items = ("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in v.lines()) + "</ul>") if len(v.items) > 1 else ""
    return [f'<p class="headline verdict"><b>Verdict: {_e(v.headline)}</b></p>' + items]


def _markdown_html(lines: list[str]) -> str:
    """Markdown lines of the report rendered as HTML (markdown-it, CommonMark plus tables, no raw HTML)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render("\n".join(lines)) if lines else ""


def render_html(rep: AuditReport) -> str:
    """The report as one self-contained HTML page (charts embedded as base64 PNG, no external assets).

    Sections: the verdict, the headline (measured vs predicted speedup, confidence), the
    waste-budget chart (before vs after, stacked by bucket) and the
    throughput chart, the side-by-side metrics, the waste budget table, each
    applied rule with its citation, rules not applied and why, how rules on
    the same bucket were combined, the diff of the user's file, the config as it ran
    (each field where the run's observed value differs from the file), notes, and
    the footer tuple (workload, model, device, ROCm/CUDA version, torch
    version, batch/sequence shape).
    """
    u = unit_text(rep)
    waste_png = _png(_waste_axes, rep, (7.5, 4))
    tput_png = _png(_throughput_axes, rep, (5, 4))
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Goblin audit: {_e(rep.workload)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Goblin audit: {_e(rep.workload)}</h1>",
        f'<p class="muted">{_e(rep.model)} · {_e(rep.device)} · generated {_e(rep.created_at)}</p>',
        *_verdict_html(rep),
        f'<p class="headline"><b>Measured speedup: {_e(speedup_text(rep))}</b> '
        f"({rep.baseline_throughput:,.1f} → {rep.patched_throughput:,.1f} {_e(u)}, medians of {rep.repeats} "
        f"alternating repeats of {rep.steps} steps, no profiler on timed steps{_e(stop_text(rep))}). "
        f"{_e(predicted_text(rep))}</p>",
    ]
    if rep.nonfinite_html:
        parts.append(rep.nonfinite_html)
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
    parts += [f"<tr><td>{_e(r.metric)}</td><td>{_e(num_text(r.before, r.unit))}</td><td>{_e(num_text(r.after, r.unit))}"
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
        parts.append(f"<p>{_e(no_rule_text(rep.applied, rep.dropped))}</p>")
    for a in rep.applied:
        changes = ", ".join(f"<code>{_e(k)}</code> {_e(change_text(v))}" for k, v in a.changes.items())
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
    if rep.verdict is not None and rep.verdict.not_recommended:
        parts += [f"<h2>Not recommended: {_e(rep.verdict.not_recommended)}</h2>",
                  "<p>The change below was benchmarked and made your program slower, so it is not offered as a fix "
                  "and no <code>patch.diff</code> is written.</p>", _diff_html(rep.diff)]
    else:
        parts += [f"<h2>Patch to your file{' (' + _e(rep.target_file) + ')' if rep.target_file else ''}</h2>",
                  _diff_html(rep.diff),
                  '<p class="muted">Apply it in the workload folder with <code>git apply</code> or '
                  "<code>patch -p1</code>.</p>"]
    if rep.config_markdown:   # the config as it ran: observed vs parsed, each disagreement (issue 27)
        parts.append(_markdown_html(rep.config_markdown))
    if rep.tensor_html:
        parts.append(rep.tensor_html)
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



def render_replay_html(rep: ReplayReport) -> str:
    """A replayed audit's report (:attr:`ReplayReport.markdown`) as one self-contained HTML page.

    The markdown is rendered with markdown-it (CommonMark plus tables), in
    the same page style as :func:`render_html`; nothing is added to it, so the
    page states exactly what the markdown report states.
    """
    body = _markdown_html([rep.markdown])
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
