"""The ranks of one job, side by side: per-rank step time, the straggler and why, and every collective across ranks.

Input: one Kineto trace per rank (``goblin trace DIR`` reads every trace in
the folder).  A trace's rank is its ``distributedInfo.rank``, else the last
number in its file name, else its position.

**Per rank** (:func:`rank_table`, medians over the profiler steps every rank
recorded, µs): ``step_us``; ``compute_us`` (device time of the non-collective
kernels on GPU traces, ``|N| = busy - exposed`` in the reader's terms; the
CPU ops' own time outside data loading and collectives on CPU traces);
``collective_us`` (time inside collectives); ``collective_wait_us`` (the part
of it spent waiting for other ranks: each collective's duration on this rank
minus its latency, below); ``loader_us`` (DataLoader ``__next__``);
``host_us`` (CPU traces: the step minus ops, collectives and loader, i.e.
Python and host work no op records; GPU traces: device idle time not spent
in the loader); ``idle_us`` (GPU: step minus device busy time; CPU: equal to
``host_us``).

**Per collective** (:func:`collective_table`): the i-th collective of each
kind on every rank is the same call (collectives are issued in the same
order on every rank of a process group, which NCCL requires).  On GPU traces
a collective is a collective kernel (NCCL/RCCL), its kind and size from the
kernel's ``Collective name`` / ``In msg nelems`` / ``dtype`` args, else from
the ``nccl:<op>`` range that launched it (linked by ``correlation`` to the
launch call on the same thread); on CPU traces it is gloo's ``gloo:<op>``
range, sized by its ``Input Dims`` / ``Input type`` (``record_shapes``).
``latency_us`` is the shortest duration across ranks (TraceLens NcclAnalyser:
"communication latency ... by taking the minimum duration across ranks to
eliminate waiting time"); ``skew_us`` the spread of start times across ranks
(latest minus earliest; meaningful on one host or with synchronised clocks);
``last_rank`` the rank that arrived last.  Bandwidths follow nccl-tests
(NVIDIA/nccl-tests ``doc/PERFORMANCE.md``): ``algbw = S / t`` with S the
message size in bytes and t the latency; ``busbw = algbw x f`` with f
``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and
all-to-all, 1 for broadcast, reduce and send/recv, n the process group's
size (``distributedInfo.world_size``, else the number of ranks given).  S is
the input size for all-reduce, broadcast, reduce and all-to-all, and the
gathered size (input x n) for all-gather, as nccl-tests counts it; for
reduce-scatter the input.  ``busbw_pct_of_link`` compares busbw with the
device's per-direction link peak (:data:`LINK_PEAK_GBPS`); ``undetermined``
where no source states it (CPU / gloo over TCP, unknown devices).

**Straggler** (:func:`straggler_findings`): the rank whose own work per step
(``step_us - collective_wait_us``) is the largest, when it exceeds the
median of the other ranks' by at least :data:`STRAGGLER_PCT` % of the median
step (ours, a tenth of the TraceML warning share of 10 %, so that an
injected slowdown of a few per cent is named); its cause is the bucket
(compute, host, loader, collective: its own time in collectives beyond
waiting) whose excess over the other ranks' median is largest.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from goblin_assets.errors import GoblinError
from goblin_assets.trace.events import TraceEvents, TraceReadError, load_trace, trace_stem
from goblin_assets.trace.metrics import trace_summary
from goblin_assets.trace.severity import Finding, graded

RANK_COLS = ["rank", "file", "device", "backend", "steps", "step_us", "compute_us", "collective_us",
             "collective_wait_us", "loader_us", "host_us", "idle_us", "straggler", "cause"]
COLLECTIVE_COLS = ["seq", "collective", "step", "ranks", "size_bytes", "dtype", "group_size", "latency_us",
                   "max_dur_us", "skew_us", "first_rank", "last_rank", "algbw_GBps", "busbw_GBps", "link_peak_GBps",
                   "busbw_pct_of_link", "bandwidth_status", "per_rank"]
#: Straggler threshold: excess own work over the other ranks' median, % of the median step (ours).
STRAGGLER_PCT = 1.0
#: Per-direction peak of the device's GPU-to-GPU link, GB/s (1e9 B/s), from the vendors' data sheets
#: (NVIDIA A100 data sheet: NVLink 600 GB/s total; H100 SXM data sheet: NVLink 900 GB/s total; AMD
#: Instinct MI300X data sheet: 896 GB/s peak aggregate Infinity Fabric; halved for one direction, the
#: figure nccl-tests' busbw is compared with).  Keys are matched case-insensitively in the device name.
LINK_PEAK_GBPS: dict[str, tuple[float, str]] = {
    "A100": (300.0, "NVIDIA A100 Tensor Core GPU data sheet: NVLink 600 GB/s (bidirectional)"),
    "H100 80GB HBM3": (450.0, "NVIDIA H100 data sheet, SXM: NVLink 900 GB/s (bidirectional)"),
    "H100 SXM": (450.0, "NVIDIA H100 data sheet, SXM: NVLink 900 GB/s (bidirectional)"),
    "MI300X": (448.0, "AMD Instinct MI300X data sheet: 896 GB/s peak aggregate Infinity Fabric (bidirectional)"),
}
_DTYPE_BYTES = {"float": 4, "float32": 4, "c10::half": 2, "half": 2, "float16": 2, "c10::bfloat16": 2,
                "bfloat16": 2, "double": 8, "float64": 8, "long": 8, "int": 4, "int32": 4, "long int": 8, "int64": 8,
                "int8": 1, "signed char": 1, "unsigned char": 1, "uint8": 1, "bool": 1}
_KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
          ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("reduce", "reduce"), ("sendrecv", "send_recv"),
          ("send", "send_recv"), ("recv", "send_recv"), ("barrier", "barrier"), ("gather", "gather"),
          ("scatter", "scatter"))
_BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}


class RanksError(GoblinError):
    """The traces given are not the ranks of one job (names the files and the problem)."""


@dataclass
class RankTrace:
    """One rank: its rank number, its events and the audit's per-step summary of them."""

    rank: int
    events: TraceEvents
    summary: object

    @property
    def path(self) -> Path:
        return self.events.path


def collective_kind(name: str) -> str | None:
    """The collective of an event name (``ncclDevKernel_AllReduce_...``, ``nccl:all_reduce``,
    ``gloo:all_reduce``, ``c10d::allreduce_``) as ``all_reduce`` | ``all_gather`` | ... ; None if none."""
    low = re.sub(r"[^a-z]", "", name.lower().split("(")[0])
    low = low.replace("base", "").replace("coalesced", "").replace("intotensor", "")
    for key, kind in _KINDS:
        if key in low:
            return kind
    return None


def _rank_of(ev: TraceEvents, i: int) -> int:
    r = ev.distributed.get("rank")
    if isinstance(r, int):
        return r
    nums = re.findall(r"\d+", trace_stem(ev.path))
    return int(nums[-1]) if nums else i


def trace_files(paths: list[str | Path]) -> list[Path]:
    """The trace files of ``paths``: each folder's ``*.json`` / ``*.json.gz`` (sorted), each file as given.

    Raises RanksError when a path does not exist or a folder holds no trace.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith((".json", ".json.gz")) and q.is_file())
            if not found:
                raise RanksError(f"{p}: no .json or .json.gz trace in this folder")
            out += found
        elif p.exists():
            out.append(p)
        else:
            raise RanksError(f"{p}: no such file or folder")
    return out


def load_ranks(paths: list[str | Path]) -> list[RankTrace]:
    """Read every rank's trace (:func:`trace_files` of ``paths``), sorted by rank.

    Raises
    ------
    RanksError
        Fewer than two traces, two traces claiming the same rank, or a trace without profiler steps.
    TraceReadError
        A file cannot be read as a trace.
    """
    files = trace_files(paths)
    if len(files) < 2:
        raise RanksError(f"{', '.join(map(str, paths))}: the ranks of a job need two traces or more, got {len(files)}")
    ranks = []
    for i, f in enumerate(files):
        ev = load_trace(f)
        if not ev.has_steps:
            raise RanksError(f"{f}: no ProfilerStep# windows; per-rank step times need a stepped profiler")
        ranks.append(RankTrace(_rank_of(ev, i), ev, trace_summary(ev)))
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise RanksError(f"{seen[r.rank]} and {r.path}: both are rank {r.rank}")
        seen[r.rank] = r.path
    return sorted(ranks, key=lambda r: r.rank)


def _dtype_bytes(t) -> int | None:
    return _DTYPE_BYTES.get(str(t).lower()) if t is not None else None


def _nelems(dims) -> int | None:
    """Elements of the first tensor of an ``Input Dims`` entry (``[[n]]`` or a tensor list ``[[[n]]]``)."""
    try:
        d = dims[0]
        while d and isinstance(d[0], list):
            d = d[0]
        return int(np.prod(d)) if d else None
    except (TypeError, IndexError, ValueError):
        return None


def rank_collectives(ev: TraceEvents) -> pd.DataFrame:
    """This rank's collectives in issue order: ``collective`` (kind), ``name``, ``ts_us``, ``dur_us``,
    ``nelems``, ``dtype`` (the trace's type name), ``group_size`` (None where not recorded)."""
    cols = ["collective", "name", "ts_us", "dur_us", "nelems", "dtype", "group_size"]
    rows = []
    k = ev.kernels[ev.kernels["category"] == "collective"] if not ev.kernels.empty else ev.kernels
    if len(k):
        ann = ev.annotations[ev.annotations["name"].str.match(r"^(nccl|rccl|xccl):")]
        launch = ev.runtime.dropna(subset=["correlation"]).drop_duplicates("correlation").set_index("correlation")
        for r in k.itertuples():
            kind, n, dt, gs = collective_kind(str(r.collective_name or "")) if r.collective_name else None, \
                r.in_msg_nelems, r.dtype, r.group_size
            if kind is None or n is None:
                lr = launch.loc[r.correlation] if pd.notna(r.correlation) and r.correlation in launch.index else None
                if lr is not None:
                    hit = ann[(ann["tid"] == lr["tid"]) & (ann["ts_us"] <= lr["ts_us"]) & (ann["end_us"] >= lr["end_us"])]
                    if len(hit):
                        a = hit.loc[hit["dur_us"].idxmin()]
                        kind = kind or collective_kind(a["name"])
                        n = n if n is not None else _nelems(a["input_dims"])
                        dt = dt if dt is not None else (a["input_types"] or [None])[0]
            rows.append((kind or collective_kind(r.name) or "unknown", r.name, r.ts_us, r.dur_us, n, dt, gs))
    else:
        a = ev.annotations[ev.annotations["name"].str.startswith("gloo:")] if not ev.annotations.empty else ev.annotations
        for r in a.itertuples():
            rows.append((collective_kind(r.name) or "unknown", r.name, r.ts_us, r.dur_us, _nelems(r.input_dims),
                         (r.input_types or [None])[0] if isinstance(r.input_types, list) else None, None))
    return pd.DataFrame(rows, columns=cols).sort_values("ts_us", kind="stable").reset_index(drop=True)


def _group_size(ranks: list[RankTrace]) -> int:
    ws = [r.events.distributed.get("world_size") for r in ranks]
    ws = [w for w in ws if isinstance(w, int) and w > 0]
    return max(ws) if ws else len(ranks)


def link_peak(device: str | None) -> tuple[float | None, str]:
    """Per-direction link peak (GB/s) of a device name and its source; ``(None, reason)`` when undetermined."""
    for key, (gbps, src) in LINK_PEAK_GBPS.items():
        if device and key.lower() in device.lower():
            return gbps, src
    return None, f"undetermined: no link peak recorded for device {device or '(not recorded: a CPU trace)'}"


def collective_table(ranks: list[RankTrace]) -> pd.DataFrame:
    """One row per collective matched across ranks (columns :data:`COLLECTIVE_COLS`; module docstring).

    ``per_rank``: ``{rank: {"start_us", "dur_us", "wait_us"}}``; ``step``: the
    ProfilerStep of the first rank holding its start (-1 outside steps);
    ``bandwidth_status``: ``measured`` when size and latency are known, else
    ``undetermined`` with the missing input.
    """
    per = {r.rank: rank_collectives(r.events) for r in ranks}
    n = _group_size(ranks)
    peak, peak_src = link_peak(ranks[0].events.device_name)
    first = ranks[0].events.steps
    rows = []
    kinds = sorted({k for df in per.values() for k in df["collective"]})
    for kind in kinds:
        seqs = {rk: df[df["collective"] == kind].reset_index(drop=True) for rk, df in per.items()}
        count = min(len(s) for s in seqs.values())
        for i in range(count):
            starts = {rk: float(s.loc[i, "ts_us"]) for rk, s in seqs.items()}
            durs = {rk: float(s.loc[i, "dur_us"]) for rk, s in seqs.items()}
            lat = min(durs.values())
            ref = seqs[ranks[0].rank].loc[i]
            nel, dt = ref["nelems"], ref["dtype"]
            size = int(nel) * _dtype_bytes(dt) if nel is not None and pd.notna(nel) and _dtype_bytes(dt) else None
            gs = int(ref["group_size"]) if ref["group_size"] is not None and pd.notna(ref["group_size"]) else n
            if size is not None and kind == "all_gather":
                size *= gs
            algbw = size / (lat * 1e-6) / 1e9 if size and lat > 0 else None
            bus = algbw * _BUS_FACTOR[kind](gs) if algbw is not None and kind in _BUS_FACTOR and gs > 0 else None
            st = first[(first["start_us"] <= starts[ranks[0].rank]) & (first["end_us"] > starts[ranks[0].rank])]
            status = "measured" if bus is not None else (
                "undetermined: message size not recorded (record_shapes off)" if size is None else "undetermined")
            rows.append({
                "seq": i, "collective": kind, "step": int(st["step"].iloc[0]) if len(st) else -1, "ranks": len(seqs),
                "size_bytes": size, "dtype": None if dt is None else str(dt), "group_size": gs, "latency_us": lat,
                "max_dur_us": max(durs.values()), "skew_us": max(starts.values()) - min(starts.values()),
                "first_rank": min(starts, key=starts.get), "last_rank": max(starts, key=starts.get),
                "algbw_GBps": algbw, "busbw_GBps": bus, "link_peak_GBps": peak,
                "busbw_pct_of_link": 100.0 * bus / peak if bus is not None and peak else None,
                "bandwidth_status": status if peak or bus is None else f"{status}; link peak {peak_src}",
                "per_rank": {int(rk): {"start_us": starts[rk], "dur_us": durs[rk], "wait_us": durs[rk] - lat}
                             for rk in seqs}})
    return pd.DataFrame(rows, columns=COLLECTIVE_COLS).sort_values(["step", "seq"], kind="stable").reset_index(drop=True)


def rank_table(ranks: list[RankTrace], coll: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per rank (columns :data:`RANK_COLS`, medians over the steps every rank recorded, µs; module
    docstring), with the straggler marked (``straggler``, ``cause``; :func:`straggler`)."""
    coll = collective_table(ranks) if coll is None else coll
    common = set.intersection(*({s.index for s in r.summary.steps} for r in ranks))
    rows = []
    for r in ranks:
        steps = [s for s in r.summary.steps if s.index in common] or r.summary.steps
        wait = {s.index: 0.0 for s in steps}
        for c in coll.itertuples():
            if c.step in wait and r.rank in c.per_rank:
                wait[c.step] += c.per_rank[r.rank]["wait_us"]
        gpu = r.summary.has_device
        vals = []
        for s in steps:
            compute = s.device_busy_us - s.comm_exposed_us if gpu else s.op_us
            idle = s.dur_us - s.device_busy_us if gpu else max(s.dur_us - s.op_us - s.collective_us
                                                                 - s.data_wait_us, 0.0)
            host = max(idle - s.data_wait_us, 0.0) if gpu else idle
            vals.append((s.dur_us, compute, s.collective_us, min(wait[s.index], s.collective_us), s.data_wait_us,
                         host, idle))
        med = np.median(np.array(vals), axis=0)
        device = r.events.device_name or ("cpu" if r.events.kernels.empty else "gpu (name not recorded)")
        rows.append({"rank": r.rank, "file": r.path.name, "device": device,
                     "backend": r.events.distributed.get("backend"), "steps": len(steps),
                     **dict(zip(RANK_COLS[5:12], map(float, med))), "straggler": False, "cause": None})
    out = pd.DataFrame(rows, columns=RANK_COLS)
    who, cause = straggler(out)
    if who is not None:
        out.loc[out["rank"] == who, ["straggler", "cause"]] = [True, cause]
    return out


def straggler(table: pd.DataFrame) -> tuple[int | None, str | None]:
    """``(rank, cause)`` of the straggler in a :func:`rank_table`, or ``(None, None)`` (module docstring)."""
    if len(table) < 2:
        return None, None
    work = table["step_us"] - table["collective_wait_us"]
    i = int(work.idxmax())
    others = table.drop(index=i)
    if (work[i] - float(work.drop(index=i).median())) < STRAGGLER_PCT / 100.0 * float(table["step_us"].median()):
        return None, None
    row = table.loc[i]
    excess = {"compute": row["compute_us"] - others["compute_us"].median(),
              "host": row["host_us"] - others["host_us"].median(),
              "loader": row["loader_us"] - others["loader_us"].median(),
              "collective": (row["collective_us"] - row["collective_wait_us"])
              - float((others["collective_us"] - others["collective_wait_us"]).median())}
    return int(row["rank"]), max(excess, key=excess.get)


def straggler_findings(table: pd.DataFrame, coll: pd.DataFrame) -> list[Finding]:
    """One ``straggler`` finding (analysis ``ranks``) naming the slow rank and its cause, with the
    per-rank buckets and the collectives' median skew as evidence; an ``ok`` finding when no rank stands out."""
    hit = table[table["straggler"]]
    med_step = float(table["step_us"].median())
    skew = float(coll["skew_us"].median()) if len(coll) else None
    ev = {"per_rank": table[RANK_COLS[:1] + RANK_COLS[5:12]].round(1).to_dict("records"),
          "median_skew_us": skew, "collectives": len(coll)}
    if hit.empty:
        return [Finding(analysis="ranks", kind="straggler", severity="ok", status="measured", value=0.0,
                        unit="% of step", threshold_source="ours (trace/ranks.py STRAGGLER_PCT)",
                        message=f"no straggler among {len(table)} ranks: own work per step within "
                                f"{STRAGGLER_PCT:.0f}% of the median step", evidence=ev)]
    r = hit.iloc[0]
    work = table["step_us"] - table["collective_wait_us"]
    excess = float(work[hit.index[0]] - work.drop(index=hit.index[0]).median())
    pct = 100.0 * excess / med_step
    waits = table.drop(index=hit.index[0])["collective_wait_us"].median()
    return [graded("ranks", "straggler", "straggler_pct", round(pct, 2),
                   f"rank {int(r['rank'])} is the straggler: {excess / 1e3:.2f} ms more own work per step "
                   f"({pct:.1f}% of the {med_step / 1e3:.2f} ms median step), cause {r['cause']}; the other "
                   f"ranks wait {waits / 1e3:.2f} ms per step in collectives"
                   + (f" (median collective skew {skew / 1e3:.2f} ms)" if skew is not None else ""),
                   rank=int(r["rank"]), cause=r["cause"], **ev)]


def analyze_ranks(paths: list[str | Path]) -> dict[str, pd.DataFrame | list[Finding]]:
    """Read the ranks (:func:`load_ranks`) and return ``{"ranks": rank_table, "collectives": collective_table,
    "findings": straggler_findings}``.  Raises as :func:`load_ranks` does."""
    ranks = load_ranks(paths)
    coll = collective_table(ranks)
    table = rank_table(ranks, coll)
    return {"ranks": table, "collectives": coll, "findings": straggler_findings(table, coll), "traces": ranks}


def ranks_frames(res: dict, paths: list) -> dict[str, pd.DataFrame]:
    """The warehouse rows of one job: ``trace_runs`` (one row, ``source_format`` ``kineto_ranks``, the job's
    ``trace_id``), ``trace_ranks``, ``trace_collectives`` (``per_rank`` as JSON) and ``trace_findings``."""
    import json
    from datetime import datetime

    from goblin_assets.ids import make_audit_id

    ranks: list[RankTrace] = res["traces"]
    job = make_audit_id("trace-ranks-" + "-".join(trace_stem(r.path) for r in ranks[:2]))
    runs = pd.DataFrame([{
        "trace_id": job, "audit_id": None, "created_at": datetime.now(), "path": ", ".join(map(str, paths)),
        "source_format": "kineto_ranks", "device": ranks[0].events.device_name,
        "steps": int(res["ranks"]["steps"].min()), "device_events": int(sum(len(r.events.kernels) for r in ranks)),
        "elapsed_s": 0.0, "flags_json": json.dumps({"ranks": [r.rank for r in ranks]}), "not_observable_json": "{}"}])
    coll = res["collectives"].copy()
    coll["per_rank"] = coll["per_rank"].map(lambda v: json.dumps(v))
    findings = pd.DataFrame([{
        "trace_id": job, "analysis": f.analysis, "kind": f.kind, "severity": f.severity, "message": f.message,
        "value": f.value, "unit": f.unit, "threshold": f.threshold, "threshold_source": f.threshold_source,
        "status": f.status, "evidence_json": json.dumps(f.evidence, default=str)} for f in res["findings"]])
    return {"trace_runs": runs, "trace_ranks": res["ranks"].assign(trace_id=job)[["trace_id", *RANK_COLS]],
            "trace_collectives": coll.assign(trace_id=job)[["trace_id", *COLLECTIVE_COLS]],
            "trace_findings": findings}


__all__ = ["RanksError", "TraceReadError", "analyze_ranks", "collective_table", "rank_table", "load_ranks"]
