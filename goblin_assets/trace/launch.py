"""Kernel launch costs: host launch-call time, launch delay, short kernels, and their graded findings.

* :func:`launch_stats`: HTA 0.5 ``hta/analyzers/cuda_kernel_analysis.py``
  ``CudaKernelAnalysis.cuda_kernel_launch_stats`` (called by
  ``TraceAnalysis.get_cuda_kernel_launch_stats``): every device event joined
  to its host launch call by ``correlation``; ``cpu_launch_us`` is the call's
  duration, ``gpu_dur_us`` the event's, ``launch_delay_us`` the event's start
  minus the call's end, clipped at 0.  HTA recognises the CUDA names only
  (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, and with
  ``include_memory_events`` ``cudaMemcpyAsync`` / ``cudaMemsetAsync``), so it
  finds nothing in a ROCm trace; :data:`LAUNCH_API` adds the HIP and driver
  spellings (``hipLaunchKernel``, ``hipExtModuleLaunchKernel``,
  ``hipExtLaunchKernel``, ``hipModuleLaunchKernel``, ``cuLaunchKernel``,
  ``hipMemcpyAsync`` ...).  The ``api`` column lets a caller keep HTA's set
  (:data:`HTA_LAUNCH_API`).  Synchronous copies (``cudaMemcpy``,
  ``hipMemcpyWithStream``) are not launches: their call time includes the wait.
* :func:`short_kernels`: TraceLens's short-kernel study (``TraceLens``
  ``TreePerf``, ``short_kernel_threshold_us=10``): kernels shorter than the
  threshold, per name, and their share of all kernel time.
* :func:`launch_findings`: graded with :data:`goblin_assets.trace.severity.THRESHOLDS`
  (``launch_cpu_us``, ``launch_delay_us``, ``short_kernel_pct``, ``idle_pct``).
  The launch measures are graded on their 95th percentile (ours: one slow call
  is noise, a slow tail is a pattern); HTA's own outlier cut-offs
  (``runtime_cutoff=50``, ``launch_delay_cutoff=100`` µs) give the outlier
  counts in the evidence.
"""
from __future__ import annotations

import re

import pandas as pd

from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.idle import CONSECUTIVE_KERNEL_DELAY_US, idle_breakdown
from goblin_assets.trace.intervals import Window, hta_round, select_kernels
from goblin_assets.trace.severity import Finding, graded
from goblin_assets.trace.temporal import temporal_breakdown

#: Host calls that enqueue device work asynchronously (CUDA runtime / driver, HIP).
LAUNCH_API = re.compile(r"^(?:cuda|hip)(?:Ext)?(?:Module)?Launch(?:Cooperative)?Kernel(?:ExC|_spt|_ptsz)?$"
                        r"|^cuLaunch(?:Cooperative)?Kernel(?:Ex)?$"
                        r"|^(?:cuda|hip)Mem(?:cpy|set)(?:2D|3D|D\w+)?Async(?:_spt|_ptsz)?$")
#: The names HTA ``cuda_kernel_launch_stats`` recognises (``include_memory_events=True``).
HTA_LAUNCH_API = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")
#: HTA ``get_cuda_kernel_launch_stats`` defaults (µs): outlier cut-offs for the call time and the delay.
HTA_RUNTIME_CUTOFF_US = 50.0
HTA_LAUNCH_DELAY_CUTOFF_US = 100.0
#: TraceLens TreePerf short-kernel study threshold (µs).
SHORT_KERNEL_US = 10.0

LAUNCH_COLUMNS = ["correlation", "api", "name", "device", "stream", "launch_ts_us", "cpu_launch_us", "gpu_dur_us",
                  "launch_delay_us"]
SHORT_COLUMNS = ["name", "category", "count", "total_us", "mean_us", "share_pct"]


def launch_stats(ev: TraceEvents, window: Window = None, hta_rounding: bool = False) -> pd.DataFrame:
    """One row per device event launched by a :data:`LAUNCH_API` call, linked by ``correlation``.

    Columns: ``correlation`` (Int64), ``api`` (the host call's name), ``name``
    (the device event's), ``device``, ``stream``, ``launch_ts_us`` (call
    start), ``cpu_launch_us`` (call duration), ``gpu_dur_us`` (event
    duration), ``launch_delay_us`` (event start - call end, clipped at 0), all
    µs.  In launch order.  ``window`` / ``hta_rounding`` as in
    :mod:`goblin_assets.trace.intervals` (``window="hta"``, ``hta_rounding=True``
    reproduce HTA's rows for the CUDA names).  Empty (with these columns) when
    the trace has no host calls (rocprofv3 output) or no launches.

    Raises
    ------
    ValueError
        An invalid ``window``.
    """
    rt = ev.runtime[ev.runtime["name"].str.match(LAUNCH_API) & ev.runtime["correlation"].notna()]
    if rt.empty or ev.kernels.empty:
        return pd.DataFrame(columns=LAUNCH_COLUMNS)
    if hta_rounding:
        rt = hta_round(rt)
    k = select_kernels(ev, window, hta_rounding)
    j = k.merge(rt[["correlation", "name", "ts_us", "dur_us", "end_us"]], on="correlation", suffixes=("", "_rt"))
    out = pd.DataFrame({"correlation": j["correlation"], "api": j["name_rt"], "name": j["name"],
                        "device": j["device"], "stream": j["stream"], "launch_ts_us": j["ts_us_rt"],
                        "cpu_launch_us": j["dur_us_rt"], "gpu_dur_us": j["dur_us"],
                        "launch_delay_us": (j["ts_us"] - j["end_us_rt"]).clip(lower=0)})
    return out.sort_values("launch_ts_us", kind="stable").reset_index(drop=True)


def short_kernels(ev: TraceEvents, threshold_us: float = SHORT_KERNEL_US, window: Window = None) -> pd.DataFrame:
    """Kernels shorter than ``threshold_us``, per name, most time first.

    Columns: ``name``, ``category``, ``count`` (int), ``total_us``,
    ``mean_us`` (µs), ``share_pct`` (% of the summed duration of all kernels in
    the window; memcpy / memset are not kernels here).  Empty (with these
    columns) when none is short.

    Raises
    ------
    ValueError
        ``threshold_us`` <= 0, or an invalid ``window``.
    """
    if threshold_us <= 0:
        raise ValueError(f"threshold_us={threshold_us}: must be > 0")
    k = select_kernels(ev, window)
    k = k[k["kind"] == "kernel"]
    short = k[k["dur_us"] < threshold_us]
    if short.empty:
        return pd.DataFrame(columns=SHORT_COLUMNS)
    out = (short.groupby(["name", "category"], sort=False)["dur_us"]
           .agg(count="size", total_us="sum", mean_us="mean").reset_index())
    out["share_pct"] = 100 * out["total_us"] / float(k["dur_us"].sum())
    return out.sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)[SHORT_COLUMNS]


def launch_findings(ev: TraceEvents, tables: dict[str, pd.DataFrame] | None = None, *, window: Window = "hta",
                    short_threshold_us: float = SHORT_KERNEL_US,
                    consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> list[Finding]:
    """Graded findings on launch overhead and device idleness.

    ``tables`` may hold already computed ``launch`` (:func:`launch_stats`),
    ``short_kernels`` (:func:`short_kernels`), ``temporal``
    (:func:`~goblin_assets.trace.temporal.temporal_breakdown`) and ``idle``
    (:func:`~goblin_assets.trace.idle.idle_breakdown`) frames; any missing one
    is computed here with ``window`` (launch stats and short kernels over the
    whole trace, temporal and idle over ``window``) and the thresholds given.

    * ``launch/slow_launch_calls`` (``launch_cpu_us``): 95th percentile of the
      host launch-call time; evidence: launches, median, HTA outliers (> 50 µs).
    * ``launch/launch_delay`` (``launch_delay_us``): 95th percentile of the
      launch delay; evidence: median, HTA outliers (> 100 µs).  A long delay
      with little idle time means the host runs ahead of a busy device (a
      deep queue), not slow launching: read it with ``idle/gpu_idle``.
    * ``launch/short_kernels`` (``short_kernel_pct``): share of kernel time in
      kernels shorter than ``short_threshold_us``; evidence: count, top names.
    * ``idle/gpu_idle`` (``idle_pct``), one per device: the temporal
      breakdown's idle share of the kernel span; evidence: the idle breakdown's
      host / kernel / other wait (µs, summed over streams) and the dominant cause.

    Launch findings are skipped when the trace records no launches (rocprofv3).

    Raises
    ------
    ValueError
        An invalid ``window`` or threshold.
    """
    tables = tables or {}
    ls = tables["launch"] if "launch" in tables else launch_stats(ev)
    sk = tables["short_kernels"] if "short_kernels" in tables else short_kernels(ev, short_threshold_us)
    tb = tables["temporal"] if "temporal" in tables else temporal_breakdown(ev, window)
    idle = tables["idle"] if "idle" in tables else idle_breakdown(ev, consecutive_kernel_delay_us, window)
    out: list[Finding] = []
    if not ls.empty:
        cpu, delay = ls["cpu_launch_us"].astype(float), ls["launch_delay_us"].astype(float)
        out.append(graded("launch", "slow_launch_calls", "launch_cpu_us", float(cpu.quantile(0.95)),
                          f"95% of {len(ls)} kernel launches take up to {cpu.quantile(0.95):.1f} µs of host time "
                          f"(median {cpu.median():.1f} µs)", launches=len(ls), median_us=float(cpu.median()),
                          over_hta_cutoff=int((cpu > HTA_RUNTIME_CUTOFF_US).sum())))
        out.append(graded("launch", "launch_delay", "launch_delay_us", float(delay.quantile(0.95)),
                          f"95th percentile launch delay {delay.quantile(0.95):.1f} µs "
                          f"(median {delay.median():.1f} µs)", launches=len(ls), median_us=float(delay.median()),
                          over_hta_cutoff=int((delay > HTA_LAUNCH_DELAY_CUTOFF_US).sum())))
    if (ev.kernels["kind"] == "kernel").any():
        pct = float(sk["share_pct"].sum()) if len(sk) else 0.0
        n = int(sk["count"].sum()) if len(sk) else 0
        out.append(graded("launch", "short_kernels", "short_kernel_pct", pct,
                          f"{n} kernels shorter than {short_threshold_us:g} µs take {pct:.1f}% of kernel time",
                          count=n, top=sk["name"].head(3).tolist()))
    for row in tb.itertuples(index=False):
        waits = idle[idle["device"] == row.device][["host_wait_us", "kernel_wait_us", "other_wait_us"]].sum()
        cause = str(waits.idxmax()).removesuffix("_us") if waits.sum() > 0 else "none"
        out.append(graded("idle", "gpu_idle", "idle_pct", float(row.idle_time_pct),
                          f"device {row.device} idle {row.idle_time_pct:.1f}% of its kernel span, "
                          f"mostly {cause.replace('_', ' ')}", device=int(row.device), dominant=cause,
                          **{c: float(v) for c, v in waits.items()}))
    return out
