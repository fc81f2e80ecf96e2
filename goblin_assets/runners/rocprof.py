"""The rocprof runner: the harness child under rocprofv3, with amd-smi polled beside it.

The child is the same as the local runner's (:mod:`goblin_assets.runners.harness`,
step budget, timeout, scrubbed environment), prefixed with::

    rocprofv3 --kernel-trace --hip-trace --output-format csv -d RUN_DIR/rocprof -- python -m goblin_assets.runners.harness SPEC

While it runs, a background thread calls ``amd-smi metric -u -m --json``
every ``smi_interval_s`` seconds.  After it ends, the kernel trace, the HIP
API trace and the amd-smi samples are summarised over the measured steps'
window into ``RawRun.extra["rocprof"]`` (top kernels, device busy time,
utilisation, VRAM), which :meth:`RocprofRunner.fold_metrics` folds into the
RunMetrics ``profile_run`` built from the torch.profiler trace.  Kernel kinds
and categories come from the one category table
(:mod:`goblin_assets.runners.categories`).

Parsers read files by header name, not position: ``kernel_trace.csv`` has
``LDS_Block_Size, Scratch_Size, VGPR_Count, Accum_VGPR_Count, SGPR_Count`` in
current rocprofiler-sdk releases and ``Private_Segment_Size,
Group_Segment_Size`` in older ones; ``rocpd convert`` writes ``Lds_Block_Size``
casing and a leading ``Guid``.  All rocprofv3 timestamps are nanoseconds.

Source: ROCm/rocprofiler-sdk ``source/docs/how-to/using-rocprofv3.rst`` and
``source/docs/data/*.csv``; ROCm/amdsmi ``amdsmi_cli`` (``metric`` JSON: each
value ``{"value": x, "unit": u}`` or ``"N/A"``; MB = bytes // 1024**2);
``docs/sources.md`` "rocprofv3 and amd-smi".
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd

from goblin_assets.contracts import KernelShare, RunMetrics
from goblin_assets.errors import GoblinError
from goblin_assets.runners.base import ToolMissingError
from goblin_assets.runners.categories import classify, is_fused_attention
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.result import Mode, RawRun
from goblin_assets.runners.stall import STALL_FACTOR, STALL_MIN_S
from goblin_assets.runners.trace import union_length
from goblin_assets.runners.workload import Workload

#: HIP API calls that launch a kernel, and calls that block the host on the device.
_LAUNCH_CALLS = re.compile(r"^hip(Ext)?(Module)?Launch(Cooperative)?Kernel|^hipGraphLaunch")
_SYNC_CALLS = re.compile(r"^hip(Device|Stream|Event)Synchronize$|^hipMemcpy$|^hipMemcpyDtoH$|^hipMemcpyHtoD$")

#: Bytes per amd-smi unit.  amdsmi_cli divides bytes by 1024**2 and labels it "MB"
#: (ROCm/amdsmi amdsmi_cli/amdsmi_commands.py, ``used_vram // (1024*1024)``).
_UNIT_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


class RocprofParseError(GoblinError):
    """A rocprofv3 CSV or amd-smi output cannot be read (names the file and the column)."""


# --------------------------------------------------------------------------- CSV parsers


def _snake(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.strip().lower()).strip("_")


def _read_csv(path: str | Path, required: tuple[str, ...]) -> pd.DataFrame:
    p = Path(path)
    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise RocprofParseError(f"{p}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise RocprofParseError(f"{p}: not a CSV file ({exc})") from None
    df.columns = [_snake(c) for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise RocprofParseError(f"{p}: missing column(s) {', '.join(missing)} (header: {', '.join(df.columns)})")
    for c in ("start_timestamp", "end_timestamp"):
        ns = pd.to_numeric(df[c], errors="coerce")
        if ns.isna().any():
            row = int(ns.isna().to_numpy().nonzero()[0][0]) + 2
            raise RocprofParseError(f"{p}: line {row}: column {c} is not an integer timestamp")
        df[c] = ns.astype("int64")
    df = df.rename(columns={"start_timestamp": "start_ns", "end_timestamp": "end_ns"})
    df["dur_ns"] = df["end_ns"] - df["start_ns"]
    return df


def _ints(df: pd.DataFrame, cols: tuple[str, ...]) -> None:
    for c in cols:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")


def parse_kernel_trace_csv(path: str | Path) -> pd.DataFrame:
    """Read rocprofv3's ``*_kernel_trace.csv`` (any of its column sets) into a frame.

    Returns
    -------
    pandas.DataFrame
        One row per kernel dispatch (rows whose ``Kind`` is not
        ``KERNEL_DISPATCH`` are dropped), ordered by start, with columns
        ``kernel_name`` (str), ``agent_id`` (str: ``"Agent 4"`` in current
        releases, ``"2"`` in older ones), ``start_ns``, ``end_ns``, ``dur_ns``
        (int64, nanoseconds), ``kernel_type`` (COMMUNICATION | MEMORY |
        COMPUTATION, :func:`kernel_type`), ``category`` and ``group`` (the
        category table's), plus every other column of the file under its
        snake_case header name (``queue_id``, ``stream_id``, ``correlation_id``,
        ``lds_block_size`` or ``group_segment_size``, ``grid_size_x``, ...;
        integer columns as nullable Int64).

    Raises
    ------
    RocprofParseError
        Missing file, not a CSV, no ``Kernel_Name``/``Start_Timestamp``/
        ``End_Timestamp`` column, or a timestamp that is not an integer (the
        message names the file, and the line or the column).

    Source
    ------
    ROCm/rocprofiler-sdk ``source/docs/data/kernel_trace.csv`` (older) and
    ``how-to/kernel-naming-filtering`` (current).
    """
    df = _read_csv(path, ("kernel_name", "start_timestamp", "end_timestamp"))
    if "kind" in df.columns:
        df = df[df["kind"].isin(["KERNEL_DISPATCH", ""])].copy()
    if "agent_id" not in df.columns:
        df["agent_id"] = ""
    _ints(df, ("queue_id", "stream_id", "thread_id", "dispatch_id", "kernel_id", "correlation_id",
               "private_segment_size", "group_segment_size", "lds_block_size", "scratch_size", "vgpr_count",
               "accum_vgpr_count", "sgpr_count", "workgroup_size_x", "workgroup_size_y", "workgroup_size_z",
               "grid_size_x", "grid_size_y", "grid_size_z"))
    df["kernel_type"] = [kernel_type(n) for n in df["kernel_name"]]
    df["category"] = [classify(n).category for n in df["kernel_name"]]
    df["group"] = [classify(n).group for n in df["kernel_name"]]
    return df.sort_values("start_ns", kind="stable").reset_index(drop=True)


def parse_hip_api_csv(path: str | Path) -> pd.DataFrame:
    """Read rocprofv3's ``*_hip_api_trace.csv`` into a frame.

    Returns
    -------
    pandas.DataFrame
        One row per HIP API call, ordered by start, with columns ``domain``
        (``HIP_RUNTIME_API``, ``HIP_COMPILER_API``, ...; ``""`` when absent),
        ``function`` (str), ``process_id``, ``thread_id``, ``correlation_id``
        (nullable Int64), ``start_ns``, ``end_ns``, ``dur_ns`` (int64, ns).

    Raises
    ------
    RocprofParseError
        Missing file, not a CSV, or no ``Function``/``Start_Timestamp``/
        ``End_Timestamp`` column (named in the message).

    Source
    ------
    ROCm/rocprofiler-sdk ``source/docs/data/hip_trace.csv``: ``Domain,
    Function, Process_Id, Thread_Id, Correlation_Id, Start_Timestamp,
    End_Timestamp``.
    """
    df = _read_csv(path, ("function", "start_timestamp", "end_timestamp"))
    if "domain" not in df.columns:
        df["domain"] = ""
    _ints(df, ("process_id", "thread_id", "correlation_id"))
    return df.sort_values("start_ns", kind="stable").reset_index(drop=True)


def kernel_type(name: str) -> str:
    """HTA's kernel kind of a kernel name: COMMUNICATION, MEMORY or COMPUTATION.

    From the category table: ``collective`` is COMMUNICATION, ``memory`` (DMA
    copies and fills, ROCclr blit kernels) is MEMORY, everything else
    COMPUTATION, as HTA's ``get_kernel_type`` splits kernels
    (hta/common/types.py: ``^nccl`` communication, Memcpy/Memset memory).
    """
    category = classify(name).category
    return {"collective": "COMMUNICATION", "memory": "MEMORY"}.get(category, "COMPUTATION")


# --------------------------------------------------------------------------- amd-smi


def _number(v) -> tuple[float | None, str]:
    """(value, unit) of an amd-smi leaf: ``{"value", "unit"}``, a bare number, a string or "N/A"."""
    unit = ""
    if isinstance(v, dict):
        unit = str(v.get("unit") or "")
        v = v.get("value")
    if isinstance(v, bool) or v is None:
        return None, unit
    if isinstance(v, (int, float)):
        return float(v), unit
    m = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*", str(v))
    if not m:
        return None, unit  # "N/A" and friends
    return float(m.group(1)), unit or m.group(2)


def _gb(v, default_unit: str) -> float | None:
    x, unit = _number(v)
    if x is None:
        return None
    factor = _UNIT_BYTES.get((unit or default_unit).upper())
    return None if factor is None else x * factor / 1e9


def _first(d: dict, *paths: tuple[str, ...]):
    for path in paths:
        cur = d
        for key in path:
            cur = cur.get(key) if isinstance(cur, dict) else None
        if cur is not None:
            return cur
    return None


def parse_amd_smi_json(text: str, gpu: int | None = None) -> dict:
    """Utilisation and VRAM of one GPU from ``amd-smi metric -u -m --json`` or ``amd-smi monitor --json``.

    Accepts a list of per-GPU objects, the ``{"gpu_data": [...]}`` envelope
    of newer builds, or a single object.  ``metric`` keys: ``usage.gfx_activity``,
    ``mem_usage.used_vram``/``total_vram``; ``monitor`` keys: ``gfx``,
    ``vram_used``/``vram_total``.  Leaves are ``{"value": x, "unit": u}``,
    bare numbers or ``"N/A"`` (read as None).

    Parameters
    ----------
    text:
        The command's standard output.
    gpu:
        amd-smi's GPU index to read; the first GPU when None.

    Returns
    -------
    dict
        ``gpu`` (int or None), ``util_pct`` (0..100), ``vram_used_gb``,
        ``vram_total_gb`` (GB = 1e9 bytes; amd-smi's MB and GB are 1024**2
        and 1024**3 bytes); a value amd-smi reports as N/A is None.

    Raises
    ------
    RocprofParseError
        Not JSON, no GPU object, or no GPU with index ``gpu``.
    """
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    try:
        data = json.loads(text[start:] if start > 0 else text)
    except json.JSONDecodeError as exc:
        raise RocprofParseError(f"amd-smi output: not JSON ({exc}): {text[:120]!r}") from None
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    gpus = [g for g in data if isinstance(g, dict)] if isinstance(data, list) else []
    if not gpus:
        raise RocprofParseError(f"amd-smi output: no GPU object: {text[:120]!r}")
    if gpu is None:
        entry = gpus[0]
    else:
        entry = next((g for g in gpus if _number(g.get("gpu"))[0] == gpu), None)
        if entry is None:
            raise RocprofParseError(f"amd-smi output: no GPU {gpu} (GPUs: {[g.get('gpu') for g in gpus]})")
    util, _ = _number(_first(entry, ("usage", "gfx_activity"), ("gfx",), ("usage", "gfx_usage")))
    idx, _ = _number(entry.get("gpu"))
    return {
        "gpu": int(idx) if idx is not None else None,
        "util_pct": util,
        "vram_used_gb": _gb(_first(entry, ("mem_usage", "used_vram"), ("vram_used",)), "MB"),
        "vram_total_gb": _gb(_first(entry, ("mem_usage", "total_vram"), ("vram_total",)), "MB"),
    }


class AmdSmiPoller:
    """Samples ``amd-smi metric -u -m --json`` in a background thread.

    Each sample is ``parse_amd_smi_json``'s dict plus ``t_s`` (the parent's
    ``time.perf_counter()``, CLOCK_MONOTONIC seconds).  ``error`` holds the
    first failure (tool missing, non-zero exit, unparseable output).
    """

    def __init__(self, amd_smi: str | None, interval_s: float = 1.0, gpu: int | None = None):
        self.cmd = [amd_smi, "metric", "-u", "-m", "--json"] + (["-g", str(gpu)] if gpu is not None else [])
        self.amd_smi = amd_smi
        self.interval_s = interval_s
        self.gpu = gpu
        self.samples: list[dict] = []
        self.error: str | None = None if amd_smi else "amd-smi: not found on PATH (utilisation and VRAM not sampled)"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="amd-smi-poller", daemon=True)

    def _sample(self) -> None:
        t = time.perf_counter()
        try:
            out = subprocess.run(self.cmd, capture_output=True, text=True, timeout=max(5.0, 5 * self.interval_s))
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.error = self.error or f"amd-smi: {exc}"
            return
        if out.returncode != 0:
            self.error = self.error or f"amd-smi exited with {out.returncode}: {out.stderr.strip()[-200:]}"
            return
        try:
            s = parse_amd_smi_json(out.stdout, self.gpu)
        except RocprofParseError as exc:
            self.error = self.error or str(exc)
            return
        s["t_s"] = t
        self.samples.append(s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> AmdSmiPoller:
        if self.amd_smi:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


# --------------------------------------------------------------------------- summaries


def union_ns(frame: pd.DataFrame, lo: int | None = None, hi: int | None = None) -> int:
    """Length of the union of ``[start_ns, end_ns)`` intervals clipped to ``[lo, hi]`` (ns)."""
    if frame.empty:
        return 0
    pairs = zip(frame["start_ns"].tolist(), frame["end_ns"].tolist())
    return int(union_length(pairs, float("-inf") if lo is None else lo, float("inf") if hi is None else hi))


def kernel_breakdown(kernels: pd.DataFrame, top: int | None = 5) -> pd.DataFrame:
    """Kernels by total time: ``kernel_name, kernel_type, calls, total_ns, mean_ns, pct_time`` (0..100).

    ``pct_time`` is each kernel's share of summed kernel time (HTA's kernel
    breakdown).  ``top`` keeps the first rows (None: all).
    """
    cols = ["kernel_name", "kernel_type", "calls", "total_ns", "mean_ns", "pct_time"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    g = (kernels.groupby(["kernel_name", "kernel_type"], sort=False)["dur_ns"]
         .agg(calls="count", total_ns="sum", mean_ns="mean").reset_index())
    g["pct_time"] = 100.0 * g["total_ns"] / g["total_ns"].sum()
    g = g.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)
    return g[cols] if top is None else g[cols].head(top)


def _in_window(frame: pd.DataFrame, lo: int | None, hi: int | None) -> pd.DataFrame:
    if lo is None or hi is None or frame.empty:
        return frame
    return frame[(frame["end_ns"] > lo) & (frame["start_ns"] < hi)]


def _time_by(kernels: pd.DataFrame, column: str) -> dict[str, float]:
    """Summed kernel time (seconds) per value of ``column``."""
    if kernels.empty:
        return {}
    return {str(t): float(v) / 1e9 for t, v in kernels.groupby(column)["dur_ns"].sum().items()}


def summarize_rocprof(kernels: pd.DataFrame, hip: pd.DataFrame | None = None, smi_samples: list[dict] | None = None,
                      window_ns: tuple[int, int] | None = None) -> dict:
    """Summarise a rocprofv3 run over the measured steps' window.

    Parameters
    ----------
    kernels, hip:
        Frames of :func:`parse_kernel_trace_csv` and :func:`parse_hip_api_csv`.
    smi_samples:
        :class:`AmdSmiPoller` samples (``t_s`` in CLOCK_MONOTONIC seconds).
    window_ns:
        ``(first step start, last step end)`` in CLOCK_MONOTONIC ns (the
        harness's clock).  When no kernel falls inside it, the kernels'
        timestamps are in another clock domain and the whole run is used,
        with a warning.

    Returns
    -------
    dict
        ``window`` ("measured steps" | "whole run"), ``window_s``, ``kernels``
        (dispatch count), ``kernel_time_s`` (sum of kernel durations),
        ``device_busy_s`` (union), ``util_pct`` (busy / window, 0..100),
        ``kernel_time_by_type_s`` (per :func:`kernel_type`),
        ``kernel_time_by_group_s`` (per group of the category table),
        ``top_kernels`` ([{name, pct_time}], top 5), ``attention_kernel_loaded``
        (a fused attention kernel ran), ``hip_launch_calls``, ``hip_launch_s``,
        ``hip_sync_s``, ``amd_smi`` (``samples``, ``util_pct_avg``,
        ``vram_used_gb_peak``, ``vram_used_gb_avg``, ``vram_total_gb``) and
        ``warnings``.  Units: seconds, percent, GB.
    """
    warnings: list[str] = []
    lo = hi = None
    label = "whole run"
    if window_ns is not None:
        inside = _in_window(kernels, *window_ns)
        if not inside.empty or kernels.empty:
            lo, hi = window_ns
            label = "measured steps"
        else:
            warnings.append("no kernel inside the measured steps' window (clock domains differ?); "
                            "kernel figures cover the whole run")
    k = _in_window(kernels, lo, hi)
    if lo is None and not k.empty:
        lo, hi = int(k["start_ns"].min()), int(k["end_ns"].max())
    window_s = (hi - lo) / 1e9 if lo is not None else 0.0
    busy = union_ns(k, lo, hi)
    top = kernel_breakdown(k, top=5)
    out: dict = {
        "window": label,
        "window_s": window_s,
        "kernels": int(len(k)),
        "kernel_time_s": float(k["dur_ns"].sum()) / 1e9 if not k.empty else 0.0,
        "device_busy_s": busy / 1e9,
        "util_pct": 100.0 * busy / (hi - lo) if lo is not None and hi > lo else None,
        "kernel_time_by_type_s": _time_by(k, "kernel_type"),
        "kernel_time_by_group_s": _time_by(k, "group"),
        "top_kernels": [{"name": r.kernel_name, "pct_time": float(r.pct_time)} for r in top.itertuples()],
        "attention_kernel_loaded": any(is_fused_attention(n) for n in k["kernel_name"].unique()),
    }
    if hip is not None:
        h = _in_window(hip, lo, hi)
        launch = h[h["function"].str.match(_LAUNCH_CALLS)]
        sync = h[h["function"].str.match(_SYNC_CALLS)]
        out.update(hip_launch_calls=int(len(launch)), hip_launch_s=float(launch["dur_ns"].sum()) / 1e9,
                   hip_sync_s=float(sync["dur_ns"].sum()) / 1e9)
    samples = list(smi_samples or [])
    if samples and window_ns is not None:
        inside = [s for s in samples if window_ns[0] / 1e9 <= s["t_s"] <= window_ns[1] / 1e9]
        if inside:
            samples = inside
        else:
            warnings.append("no amd-smi sample inside the measured steps; VRAM/utilisation cover the whole run")

    def vals(key: str) -> list[float]:
        return [s[key] for s in samples if s.get(key) is not None]

    util, used, total = vals("util_pct"), vals("vram_used_gb"), vals("vram_total_gb")
    out["amd_smi"] = {
        "samples": len(samples),
        "util_pct_avg": sum(util) / len(util) if util else None,
        "vram_used_gb_peak": max(used) if used else None,
        "vram_used_gb_avg": sum(used) / len(used) if used else None,
        "vram_total_gb": max(total) if total else None,
    }
    out["warnings"] = warnings
    return out


# --------------------------------------------------------------------------- runner


def find_tool(name: str, explicit: str | None = None) -> str | None:
    """Path of ``name``: ``explicit`` if given (must exist), else ``PATH``, else ``/opt/rocm/bin``."""
    if explicit:
        return explicit if Path(explicit).is_file() or shutil.which(explicit) else None
    found = shutil.which(name)
    if found:
        return found
    rocm = Path(os.environ.get("ROCM_PATH", "/opt/rocm")) / "bin" / name
    return str(rocm) if rocm.is_file() else None


class RocprofRunner(LocalRunner):
    """The local runner's child under ``rocprofv3``, with ``amd-smi`` sampled beside it.

    Parameters
    ----------
    device, timeout_s, python, stall_factor, stall_min_s:
        As :class:`~goblin_assets.runners.local.LocalRunner`: the same stall
        watch stops a hung run under rocprofv3 (the dump signal goes to the
        whole process group, so the Python child under the tool dumps its
        stacks; the tool itself is then killed with the group).
    mem_cap_gb:
        Address-space cap of the child (GB).  Default None: the ROCm runtime
        reserves large virtual address ranges, so an ``RLIMIT_AS`` cap sized
        for host memory can fail device initialisation (not verified on
        hardware here).
    rocprofv3, amd_smi:
        Paths of the tools; default: found on ``PATH`` or ``$ROCM_PATH/bin``.
    smi_interval_s:
        Seconds between amd-smi samples.
    gpu:
        amd-smi's GPU index to sample (default: the first GPU it lists).

    Raises
    ------
    ToolMissingError
        ``rocprofv3`` is not installed (amd-smi missing only leaves
        utilisation and VRAM unsampled, with the reason in the result).
    """

    kind = "rocprof"

    def __init__(self, device: str = "auto", timeout_s: float = 600.0, mem_cap_gb: float | None = None,
                 python: str | None = None, rocprofv3: str | None = None, amd_smi: str | None = None,
                 smi_interval_s: float = 1.0, gpu: int | None = None, stall_factor: float = STALL_FACTOR,
                 stall_min_s: float = STALL_MIN_S):
        super().__init__(device=device, timeout_s=timeout_s, mem_cap_gb=mem_cap_gb, python=python,
                         stall_factor=stall_factor, stall_min_s=stall_min_s)
        self.rocprofv3 = find_tool("rocprofv3", rocprofv3)
        if self.rocprofv3 is None:
            raise ToolMissingError(rocprofv3 or "rocprofv3",
                                   "install ROCm's rocprofiler-sdk (ROCm >= 6.2), or use the local runner")
        self.amd_smi = find_tool("amd-smi", amd_smi)
        self.smi_interval_s = smi_interval_s
        self.gpu = gpu

    def _command(self, spec_path: Path, launch: list[str] | None = None) -> list[str]:
        out = spec_path.parent / "rocprof"
        return [self.rocprofv3, "--kernel-trace", "--hip-trace", "--output-format", "csv", "-d", str(out), "--",
                *super()._command(spec_path, launch)]

    def run(self, workload: Workload, mode: Mode, steps: int, warmup: int = 2, script: Path | None = None,
            env: dict[str, str] | None = None, unset_env: list[str] | None = None, tap: str | None = None,
            label: str = "") -> RawRun:
        """Run as :meth:`LocalRunner.run` under rocprofv3; summarise its files into ``extra["rocprof"]``.

        ``extra["rocprof"]`` is :func:`summarize_rocprof`'s dict plus the
        paths of the CSV files read; when rocprofv3 wrote no kernel trace it
        holds ``error`` instead (the run itself stays ok).  The amd-smi
        samples are also written to ``RUN_DIR/amd_smi.json``.

        Returns
        -------
        RawRun
            As :meth:`LocalRunner.run`.
        """
        # rocprofv3 writes its files from C atexit handlers, which the harness's os._exit would skip.
        env = {**(env or {}), "GOBLIN_HARNESS_EXIT": "libc"}
        with AmdSmiPoller(self.amd_smi, self.smi_interval_s, self.gpu) as poller:
            raw = super().run(workload, mode, steps, warmup=warmup, script=script, env=env, unset_env=unset_env,
                              tap=tap, label=label)
        (raw.run_dir / "amd_smi.json").write_text(json.dumps({"samples": poller.samples, "error": poller.error}))
        if raw.ok:
            raw.extra["rocprof"] = self._summarize(raw, poller)
        return raw

    def fold_metrics(self, raw: RawRun, metrics: RunMetrics) -> None:
        """Fold the rocprofv3 + amd-smi summary of ``raw`` (``extra["rocprof"]``) into ``metrics``, in place.

        Kernel-level figures from rocprofv3 replace the torch.profiler ones:
        device utilisation (percent), top-5 kernels, whether a fused attention
        kernel ran; amd-smi VRAM fills the memory average and headroom (GB).
        A summary that failed (no kernel trace) leaves ``metrics`` as it was,
        with a warning.
        """
        rp = raw.extra.get("rocprof")
        if not rp:
            return
        if rp.get("error"):
            metrics.warnings.append(f"rocprofv3: {rp['error']}")
            return
        metrics.provenance.profiler = "torch.profiler + rocprofv3"
        if rp.get("util_pct") is not None:
            metrics.util_pct = rp["util_pct"]
        if rp.get("top_kernels"):
            metrics.top_kernels = [KernelShare(**k) for k in rp["top_kernels"][:5]]
        metrics.attention_kernel_loaded = bool(metrics.attention_kernel_loaded or rp.get("attention_kernel_loaded"))
        smi = rp.get("amd_smi") or {}
        if smi.get("vram_used_gb_avg") is not None:
            metrics.mem_avg_gb = smi["vram_used_gb_avg"]
            metrics.not_observable.pop("mem_avg_gb", None)
        if smi.get("vram_total_gb") and smi.get("vram_used_gb_peak") is not None:
            metrics.memory_headroom_gb = smi["vram_total_gb"] - smi["vram_used_gb_peak"]
        metrics.warnings += [f"rocprofv3 ({rp.get('window', '?')}): {w}" for w in rp.get("warnings", [])]

    def _summarize(self, raw: RawRun, poller: AmdSmiPoller) -> dict:
        out_dir = raw.run_dir / "rocprof"
        ktrace = sorted(out_dir.rglob("*kernel_trace.csv"))
        htrace = sorted(out_dir.rglob("*hip_api_trace.csv"))
        if not ktrace:
            dbs = sorted(out_dir.rglob("*.db"))
            hint = (f"; found {dbs[0].name} (rocpd): convert with `rocpd convert -i {dbs[0]} --output-format csv`"
                    if dbs else "")
            return {"error": f"{out_dir}: rocprofv3 wrote no *kernel_trace.csv{hint}"}
        try:
            kernels = pd.concat([parse_kernel_trace_csv(p) for p in ktrace], ignore_index=True)
            hip = pd.concat([parse_hip_api_csv(p) for p in htrace], ignore_index=True) if htrace else None
        except RocprofParseError as exc:
            return {"error": str(exc)}
        per = raw.result.per_step
        window = (int(per[0].t_start_s * 1e9), int(per[-1].t_end_s * 1e9)) if per else None
        summary = summarize_rocprof(kernels, hip, poller.samples, window)
        if poller.error:
            summary["warnings"].append(poller.error)
        summary["files"] = [str(p) for p in ktrace + htrace]
        return summary
