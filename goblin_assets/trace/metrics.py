"""The audit's RunMetrics and waste budget, built from a trace recorded elsewhere.

A Kineto trace with ``ProfilerStep#N`` windows goes through the very reader
and waste budget the audit uses for its own runs
(:func:`goblin_assets.runners.trace.read_trace`,
:func:`goblin_assets.measure.waste.waste_budget`).  A trace without steps (a
benchmark recorded without ``prof.step()``, or rocprofv3 output, which has no
host side) is one window from its first to its last device event; its
buckets are the device's busy, exposed-collective and idle time, and what such
a trace cannot show (the loader, the host's part of the idle time) is
``not_observable`` with the reason.

Nothing here was measured by Goblin: the RunMetrics is labelled
``replayed`` (the recording's numbers, read back), its source names the file.
"""
from __future__ import annotations

import numpy as np

from goblin_assets.contracts import KernelShare, RunMetrics, RunProvenance
from goblin_assets.measure.waste import waste_budget
from goblin_assets.runners.categories import is_fused_attention
from goblin_assets.runners.trace import StepIntervals, TraceSummary, read_trace, union_length
from goblin_assets.trace.events import TraceEvents

_PROFILER = {"kineto": "torch.profiler (Kineto trace)", "rocprofv3_json": "rocprofv3 (JSON)",
             "rocprofv3_csv": "rocprofv3 (kernel trace CSV)"}


def window_summary(ev: TraceEvents) -> TraceSummary:
    """A :class:`TraceSummary` with one step: the span of the trace's device events (traces without steps).

    ``device_busy_us`` is the union of device events, ``collective_us`` that
    of collective kernels, ``comm_exposed_us`` its part no other device work
    overlaps, ``category_us`` the summed time per category.  No loader, no
    GEMM shapes (rocprofv3 has no ops; a step-less Kineto trace's ops are not
    assigned to steps).
    """
    lo, hi = ev.window()
    k = ev.kernels
    iv = list(zip(k["ts_us"], k["end_us"]))
    coll_mask = (k["category"] == "collective").to_numpy()
    coll = [p for p, c in zip(iv, coll_mask) if c]
    other = [p for p, c in zip(iv, coll_mask) if not c]
    step = StepIntervals(index=0, start_us=lo, end_us=hi, device_busy_us=union_length(iv, lo, hi),
                         collective_us=union_length(coll, lo, hi),
                         comm_exposed_us=max(union_length(coll + other, lo, hi) - union_length(other, lo, hi), 0.0),
                         category_us={c: float(v) for c, v in k.groupby("category")["dur_us"].sum().items()})
    return TraceSummary(steps=[step], has_device=True, device_name=ev.device_name, collectives=int(coll_mask.sum()),
                        others=int((~coll_mask).sum()), backend=ev.distributed.get("backend"),
                        world_size=ev.distributed.get("world_size"))


def trace_summary(ev: TraceEvents) -> TraceSummary:
    """The audit's per-step summary of ``ev``: :func:`read_trace` for a stepped Kineto trace, else :func:`window_summary`."""
    if ev.source_format == "kineto" and ev.has_steps:
        return ev.summary if ev.summary is not None else read_trace(ev.path)
    return window_summary(ev)


def trace_run_metrics(ev: TraceEvents, workload: str = "", summary: TraceSummary | None = None) -> RunMetrics:
    """RunMetrics of a recorded trace, labelled ``replayed`` (never measured by this run).

    ``step_time_s``: median ``ProfilerStep`` duration (the whole window when
    there are no steps); ``waste_budget``: :func:`waste_budget` on
    :func:`trace_summary` (a step-less window's ``data_wait`` is
    ``not_observable``); ``util_pct``: device busy time over the steps' time;
    ``top_kernels``: the five longest kernels by summed time (share of the
    steps' time); ``attention_kernel_loaded``: a fused attention kernel ran.
    Throughput and MFU are ``not_observable`` (a trace does not count samples
    or tokens).  ``summary`` is :func:`trace_summary` of ``ev`` when the
    caller has it already (read once).
    """
    s = summary or trace_summary(ev)
    step_us = [st.dur_us for st in s.steps]
    step_time_s = float(np.median(step_us)) * 1e-6
    kind = ev.source_format
    rocm, cpu = ev.platform == "rocm", ev.platform == "cpu"
    prov = RunProvenance(kind="replayed", device="cpu" if cpu else (ev.device_name or "unknown GPU"),
                         profiler=_PROFILER[kind],
                         source=f"{ev.path} (recorded trace, read by goblin trace)",
                         arch=(ev.device_properties[0].get("arch") if ev.device_properties else None),
                         # the platform decides which rules apply: a version the trace does not record stays
                         # "unknown" (never compared), but says which runtime it was
                         hip_version=ev.versions.get("hip", "unknown") if rocm else None,
                         cuda_version=None if rocm or cpu else ev.versions.get("cuda", "unknown"))
    m = RunMetrics(workload=workload or ev.path.name, steps=len(s.steps), step_time_s=step_time_s,
                   step_times_s=[u * 1e-6 for u in step_us], provenance=prov, trace_path=str(ev.path))
    m.waste_budget = waste_budget(s, step_time_s)
    if not (kind == "kineto" and ev.has_steps):
        m.waste_budget["data_wait"].status = "not_observable"
        m.waste_budget["data_wait"].note = ("the trace has no ProfilerStep windows or no host side: DataLoader "
                                            "waits cannot be told from other idle time (counted in host_gap)")
    total = sum(step_us)
    m.util_pct = 100.0 * sum(st.device_busy_us for st in s.steps) / total if total > 0 else None
    lo, hi = ev.window()
    k = ev.kernels[(ev.kernels["ts_us"] >= lo) & (ev.kernels["ts_us"] < hi)]
    if ev.has_steps:
        k = k[np.any([(k["ts_us"] >= a) & (k["ts_us"] < b) for a, b in zip(ev.steps["start_us"], ev.steps["end_us"])],
                     axis=0)] if len(k) else k
    top = k.groupby("name")["dur_us"].sum().sort_values(ascending=False).head(5)
    m.top_kernels = [KernelShare(name=n, pct_time=min(100.0, 100.0 * float(v) / total)) for n, v in top.items()
                     ] if total > 0 else []
    m.attention_kernel_loaded = bool(any(is_fused_attention(n) for n in k["name"].unique()))
    m.not_observable.update({
        "throughput": "a recorded trace does not count samples or tokens",
        "mfu_pct": "see the op roofline table: FLOPs from recorded shapes against the device's peak (estimated)",
        "mem_peak_gb": "device memory is not read from a recorded trace"})
    m.warnings.append(f"replayed from a recorded trace ({prov.profiler}) on {prov.device}: nothing was run here")
    return m
