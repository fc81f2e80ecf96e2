"""``goblin trace`` output: the terminal tables, the self-contained HTML page, and the diff of two traces."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from rich.table import Table

from goblin_assets.report.html import _CSS, _e, _img, _plt
from goblin_assets.trace.analysis import TraceReport

_SEV_STYLE = {"high": "bold red", "moderate": "yellow", "ok": "green"}


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def frame_table(df: pd.DataFrame, title: str, max_rows: int = 12, max_width: int = 60) -> Table:
    """A rich table of the first ``max_rows`` rows of ``df`` (long text cut to ``max_width`` characters;
    list/dict columns, such as ``ops_on_path``, are left to ``--json``, the HTML page and the warehouse)."""
    df = df[[c for c in df.columns if not (df[c].dtype == object and df[c].map(
        lambda v: isinstance(v, (list, dict))).any())]]
    t = Table(title=f"{title} ({len(df)} rows)" if len(df) > max_rows else title, show_header=True)
    for c in df.columns:
        t.add_column(str(c), overflow="fold")
    for row in df.head(max_rows).itertuples(index=False):
        t.add_row(*[_fmt(v)[:max_width] for v in row])
    return t


def findings_table(rep: TraceReport) -> Table:
    """The graded findings, high first: severity, analysis, message, value and the threshold's source."""
    t = Table(title=f"findings ({rep.events.path.name})", show_header=True)
    for c in ("severity", "analysis", "finding", "value", "threshold (source)"):
        t.add_column(c, overflow="fold")
    for f in rep.findings:
        val = "" if f.value is None else f"{f.value:,.3g} {f.unit}".strip()
        t.add_row(f"[{_SEV_STYLE[f.severity]}]{f.severity}[/]", f.analysis, f.message, val, f.threshold_source)
    return t


def _category_png(rep: TraceReport, diff: pd.DataFrame | None) -> bytes:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    kb = rep.tables["kernel_categories"]
    if diff is not None and not diff.empty:
        d = diff.head(8)
        x = range(len(d))
        axes[0].barh([i - 0.2 for i in x], d["a_share_pct"], height=0.4, label="A")
        axes[0].barh([i + 0.2 for i in x], d["b_share_pct"], height=0.4, label="B")
        axes[0].set_yticks(list(x), d["category"])
        axes[0].set_title("kernel time share by category (A vs B)")
        axes[0].legend()
    elif not kb.empty:
        col = next(c for c in kb.columns if c.endswith("_pct"))
        kb = kb.sort_values(col)
        axes[0].barh(kb.iloc[:, 0].astype(str), kb[col])
        axes[0].set_title("kernel time share by category (%)")
    axes[0].set_xlabel("% of kernel time (measured)")
    tb = rep.tables["temporal"]
    tb = tb[tb["timing"] == "recorded"] if "timing" in tb.columns else tb
    if not tb.empty:
        row = tb.iloc[0]
        parts = {k.replace("_pct", ""): float(row[k]) for k in ("idle_time_pct", "compute_time_pct",
                                                                 "non_compute_time_pct") if k in tb.columns}
        axes[1].bar(list(parts), list(parts.values()), color=["#bbbbbb", "#4c9a2a", "#1f77b4"])
        axes[1].set_title("temporal breakdown (HTA's definitions)")
        axes[1].set_ylabel("% of the device's active span (measured)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _html_table(df: pd.DataFrame, max_rows: int = 30) -> str:
    if df.empty:
        return '<p class="muted">empty</p>'
    head = "".join(f"<th>{_e(c)}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{_e(_fmt(v))}</td>" for v in r) + "</tr>"
                   for r in df.head(max_rows).itertuples(index=False))
    more = f'<p class="muted">{len(df) - max_rows} more rows in the warehouse</p>' if len(df) > max_rows else ""
    return f"<table><tr>{head}</tr>{rows}</table>{more}"


def render_trace_html(rep: TraceReport, diff: dict[str, pd.DataFrame] | None = None,
                      other: TraceReport | None = None) -> str:
    """One self-contained HTML page: findings, the category chart, every table; with ``diff`` (from
    :func:`goblin_assets.trace.diff.category_diff` / ``op_diff`` against ``other``) the comparison first."""
    ev, m = rep.events, rep.metrics
    title = f"Goblin trace: {ev.path.name}" + (f" vs {other.events.path.name}" if other else "")
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class='muted'>{_e(ev.source_format)} on {_e(ev.device_name or 'an unrecorded device')}; "
            f"{len(ev.steps)} profiler steps; read and analysed in {rep.elapsed_s:.2f} s. Nothing was run: every "
            f"time below is the recording's (measured by its profiler), FLOP and roofline figures are "
            f"estimated from recorded shapes.</p>",
            _img(_category_png(rep, diff.get("categories") if diff else None), "kernel categories")]
    if diff:
        body += ["<h2>Diff: categories (A = this trace, B = the other)</h2>", _html_table(diff["categories"]),
                 "<h2>Diff: ops matched by name and shapes</h2>", _html_table(diff["ops"])]
    body += ["<h2>Findings</h2>", _html_table(pd.DataFrame(
        [{"severity": f.severity, "analysis": f.analysis, "finding": f.message,
          "value": None if f.value is None else f"{f.value:,.3g} {f.unit}", "status": f.status,
          "threshold source": f.threshold_source} for f in rep.findings]))]
    body += ["<h2>Waste budget (per step)</h2>", _html_table(pd.DataFrame(
        [{"bucket": k, "ms_per_step": b.seconds * 1e3, "status": b.status, "note": b.note}
         for k, b in m.waste_budget.items()]))]
    for name, df in rep.tables.items():
        body += [f"<h2>{_e(name.replace('_', ' '))}</h2>", _html_table(df)]
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")


def write_trace_html(rep: TraceReport, path: str | Path, diff: dict[str, pd.DataFrame] | None = None,
                     other: TraceReport | None = None) -> Path:
    """Write :func:`render_trace_html` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_trace_html(rep, diff, other), encoding="utf-8")
    return path
