"""``goblin memory`` output: the self-contained HTML page of a memory snapshot and its warehouse rows."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pandas as pd

from goblin_assets.report.html import _CSS, _e, _img, _plt, fig_png
from goblin_assets.trace.memory_snapshot import SnapshotReport, mib
from goblin_assets.trace.render import _html_table


def _timeline_png(rep: SnapshotReport) -> bytes:
    """Allocated and reserved MiB after each trace entry around the first OOM (left), live MiB by category (right)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    tl = rep.tables["timeline"]
    if not tl.empty:
        for dev, d in tl.groupby("device"):
            axes[0].step(d["event_index"], d["allocated_bytes"] / 2**20, where="post", label=f"allocated (dev {dev})")
            axes[0].step(d["event_index"], d["reserved_bytes"] / 2**20, where="post", linestyle="--",
                         label=f"reserved (dev {dev})")
        for o in rep.tables["ooms"].itertuples():
            axes[0].axvline(o.event_index, color="red", linewidth=1)
            axes[0].annotate(f"OOM: {mib(o.request_bytes)} requested", (o.event_index, o.reserved_bytes / 2**20),
                             color="red", ha="right", va="bottom", fontsize=8)
        axes[0].legend(fontsize=8)
    axes[0].set_title("allocator timeline around the OOM (from the snapshot)" if len(rep.tables["ooms"])
                      else "allocator timeline (from the snapshot)")
    axes[0].set_xlabel("trace entry")
    axes[0].set_ylabel("MiB")
    cats = rep.tables["categories"].sort_values("bytes")
    if not cats.empty:
        axes[1].barh(cats["category"] + " (" + cats["category_source"] + ")", cats["bytes"] / 2**20)
    axes[1].set_title("live memory by category")
    axes[1].set_xlabel("MiB")
    return fig_png(fig)


def render_snapshot_html(rep: SnapshotReport) -> str:
    """One self-contained HTML page: diagnosis, totals, the timeline chart, live memory by frame and category,
    the segments with their largest free block against the failed request, the OOM events and the timeline rows."""
    title = f"Goblin memory: {rep.path.name}"
    t = rep.totals
    body = [f"<h1>{_e(title)}</h1>",
            "<p class='muted'>Read from the snapshot; nothing was run. "
            + _e(" ".join(f"{k}: {v}." for k, v in rep.notes.items())) + "</p>",
            "<h2>Diagnosis</h2><ul>" + "".join(f"<li>{_e(d)}</li>" for d in rep.diagnosis) + "</ul>",
            _html_table(pd.DataFrame([{"reserved": mib(t["reserved_bytes"]), "allocated": mib(t["allocated_bytes"]),
                                       "reserved minus allocated": mib(t["reserved_minus_allocated_bytes"]),
                                       "largest free block": mib(t["largest_free_block_bytes"]),
                                       "segments": t["segments"], "OOM events": t["oom_events"]}])),
            _img(_timeline_png(rep), "allocator timeline")]
    for name in ("ooms", "frames", "categories", "segments", "timeline"):
        body += [f"<h2>{_e(name)}</h2>", _html_table(rep.tables[name])]
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")


def write_snapshot_html(rep: SnapshotReport, path: str | Path) -> Path:
    """Write :func:`render_snapshot_html` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_snapshot_html(rep), encoding="utf-8")
    return path


def snapshot_frames(rep: SnapshotReport) -> dict[str, pd.DataFrame]:
    """The warehouse rows of one analysed snapshot, each with its ``snapshot_id``.

    ``memory_snapshots`` (one row: totals and diagnosis), ``memory_snapshot_segments``,
    ``memory_snapshot_frames`` (live bytes by frame and category) and ``memory_snapshot_events`` (the
    timeline rows, the ``oom`` entries among them).
    """
    t, oom = rep.totals, rep.tables["ooms"]
    first = oom.iloc[0] if not oom.empty else None
    head = pd.DataFrame([{
        "snapshot_id": rep.snapshot_id, "created_at": datetime.now(), "path": str(rep.path),
        "origin": rep.notes.get("origin", "recorded"), **{k: t[k] for k in (
            "segments", "reserved_bytes", "allocated_bytes", "active_bytes", "reserved_minus_allocated_bytes",
            "free_internal_bytes", "free_external_bytes", "largest_free_block_bytes", "oom_events",
            "trace_entries")},
        "oom_request_bytes": None if first is None else first["request_bytes"],
        "oom_device_free_bytes": None if first is None else first["device_free_bytes"],
        "diagnosis": "\n".join(rep.diagnosis)}])
    segs = rep.tables["segments"].drop(columns=["address"]).copy()
    frames = rep.tables["frames"].rename(columns={"bytes": "live_bytes"})
    events = rep.tables["timeline"]
    out = {"memory_snapshots": head}
    for name, df in (("memory_snapshot_segments", segs), ("memory_snapshot_frames", frames),
                     ("memory_snapshot_events", events)):
        df = df.copy()
        df.insert(0, "snapshot_id", rep.snapshot_id)
        out[name] = df
    return out
