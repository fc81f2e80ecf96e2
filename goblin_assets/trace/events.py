"""Read a recorded GPU trace into typed event frames, whatever recorded it.

Three inputs, one output (:class:`TraceEvents`):

* **Kineto** (``.json`` / ``.json.gz``): the Chrome trace ``torch.profiler``
  exports on CUDA and ROCm (``traceEvents``, ``deviceProperties``; ``ts`` and
  ``dur`` in µs).  Device events are ``cat`` ``kernel`` / ``gpu_memcpy`` /
  ``gpu_memset``; the launches that enqueue them are ``cuda_runtime`` (ROCm
  builds write ``hipLaunchKernel`` under the same category) linked to them by
  ``args.correlation``; CPU ops (``cpu_op``) link to their kernels by
  ``args["External id"]``.  Holistic Trace Analysis and TraceLens read the
  same fields (HTA ``trace/parser_config.py``; TraceLens ``TreePerf``).
* **rocprofv3 JSON** (``--output-format json``): ``rocprofiler-sdk-tool[0]``
  with ``agents``, ``kernel_symbols`` and ``buffer_records.kernel_dispatch``
  (``start_timestamp`` / ``end_timestamp`` in ns; the kernel's name from its
  symbol's ``formatted_kernel_name``, the device from the dispatch's agent's
  ``product_name``).  Source: ROCm/rocprofiler-sdk
  ``source/lib/output/generateJSON.cpp``.
* **rocprofv3 CSV** (``*_kernel_trace.csv``): read by
  :func:`goblin_assets.runners.rocprof.parse_kernel_trace_csv`.

Every time column is in µs (``*_us``), relative to nothing: the trace's own
clock, so intervals of one trace compare with each other only.  Each kernel
carries its category and group from the one category table
(:mod:`goblin_assets.runners.categories`), and HTA's three-way ``kernel_type``
(COMMUNICATION / MEMORY / COMPUTATION) so the temporal breakdown uses HTA's
definitions exactly.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec
import pandas as pd

from goblin_assets.errors import GoblinError
from goblin_assets.runners.trace import TraceSummary, summarize
from goblin_assets.runners.kineto_json import Args, KinetoDecodeError, KinetoDoc, decode, read_bytes
from goblin_assets.runners.categories import classify

SourceFormat = Literal["kineto", "rocprofv3_json", "rocprofv3_csv"]

#: Device event categories of a Kineto trace (HTA counts the same three as GPU work).
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: Host-side launch categories (ROCm builds reuse ``cuda_runtime``; newer Kineto splits ``cuda_driver``).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#|^enumerate\(DataPipe\)#")


class TraceReadError(GoblinError):
    """A recorded trace cannot be read: names the file and what is wrong with it."""


def trace_stem(path: str | Path) -> str:
    """A trace file's name without its trace suffix (``rank0.json.gz`` -> ``rank0``; dots inside are kept)."""
    name = Path(path).name
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json", ".csv"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def hta_kernel_type(name: str) -> str:
    """HTA's kernel type of a device event name: COMMUNICATION, MEMORY or COMPUTATION.

    Same test as HTA 0.5 ``utils/utils.py`` ``get_kernel_type``: a name
    containing ``nccl`` (any case, which also catches RCCL's ``ncclDevKernel``)
    is communication, ``memcpy`` / ``memset`` (any case) memory, anything else
    computation.
    """
    low = name.lower()
    if "nccl" in low:
        return "COMMUNICATION"
    if "memcpy" in low or "memset" in low:
        return "MEMORY"
    return "COMPUTATION"


@dataclass
class TraceEvents:
    """One recorded trace as frames (all times in µs on the trace's clock).

    ``kernels``: one row per device event with ``name``, ``kind``
    (kernel | gpu_memcpy | gpu_memset), ``ts_us``, ``dur_us``, ``end_us``,
    ``device`` (int), ``stream`` (int), ``correlation`` (Int64),
    ``external_id`` (Int64), ``category`` / ``group`` (the category table's),
    ``hta_kernel_type``, ``grid`` / ``block`` (str, empty when absent).
    ``runtime``: host launch / sync API calls (``name``, ``ts_us``, ``dur_us``,
    ``end_us``, ``pid``, ``tid``, ``correlation``, ``external_id``).
    ``cpu_ops``: ``cpu_op`` events (``name``, ``ts_us``, ``dur_us``,
    ``end_us``, ``pid``, ``tid``, ``external_id``, ``sequence_number``,
    ``fwd_thread_id``, ``input_dims``, ``input_types``, ``concrete_inputs``;
    shapes are ``None`` without ``record_shapes``).  ``python``:
    ``python_function`` events (``name``, ``ts_us``, ``dur_us``, ``end_us``,
    ``tid``; present only with ``with_stack``).  ``steps``: the CPU-side
    ``ProfilerStep#N`` windows (``step``, ``start_us``, ``end_us``, ``dur_us``);
    empty for rocprofv3 output, which has no steps.  ``gpu_steps``: the
    device-side copies of those windows (``gpu_user_annotation``
    ``ProfilerStep#N``; same columns), which HTA's step filter also reads.  ``loader``: DataLoader
    ``__next__`` ranges (``ts_us``, ``end_us``).  ``syncs``: ``cuda_sync``
    events (``name``, ``ts_us``, ``end_us``, ``stream``).  ``annotations``:
    the other ``user_annotation`` ranges (``record_function``, and the
    process group's ``nccl:<op>`` / ``gloo:<op>`` ranges with their
    ``input_dims`` / ``input_types``).  Collective kernels also carry the
    process group's ``collective_name``, ``in_msg_nelems``, ``dtype`` and
    ``group_size`` where the trace records them (None elsewhere).

    ``device_name`` is the first ``deviceProperties`` entry's name (Kineto) or
    the dispatching agent's ``product_name`` (rocprofv3), ``None`` when the
    trace does not say; ``versions`` the runtime versions the trace records,
    decoded (``hip``, ``cuda``: :func:`_versions`); ``flags`` the recording options the trace states
    (``record_shapes``, ``with_stack``, ``profile_memory``, ``with_flops``,
    ``with_modules``: True/False, absent when the trace does not record it).
    """

    path: Path
    source_format: SourceFormat
    kernels: pd.DataFrame
    runtime: pd.DataFrame
    cpu_ops: pd.DataFrame
    python: pd.DataFrame
    steps: pd.DataFrame
    gpu_steps: pd.DataFrame
    loader: pd.DataFrame
    syncs: pd.DataFrame
    device_name: str | None = None
    device_properties: list[dict] = field(default_factory=list)
    flags: dict[str, bool] = field(default_factory=dict)
    distributed: dict = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    other_events: int = 0
    annotations: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_ANN_COLS))
    summary: TraceSummary | None = None  # the audit's per-step summary of a stepped Kineto trace, same decode

    @property
    def platform(self) -> str:
        """``rocm`` or ``cuda``: from the recorded runtime version, else the device's vendor, else the launch API
        names (``hip*``), else the profiler (rocprofv3 is ROCm's); ``cpu`` for a Kineto trace without device
        events."""
        if self.source_format == "kineto" and self.kernels.empty:
            return "cpu"
        if "hip" in self.versions or self.source_format != "kineto":
            return "rocm"
        if "cuda" in self.versions:
            return "cuda"
        name = (self.device_name or "").lower()
        if "amd" in name or "instinct" in name or "radeon" in name:
            return "rocm"
        if "nvidia" in name:
            return "cuda"
        return "rocm" if self.runtime["name"].str.startswith("hip").any() else "cuda"

    @property
    def has_steps(self) -> bool:
        return not self.steps.empty

    def window(self, step: int | None = None) -> tuple[float, float]:
        """The ``(start_us, end_us)`` of one step, or of all steps (all device events when there are none)."""
        if step is not None:
            row = self.steps[self.steps["step"] == step].iloc[0]
            return float(row["start_us"]), float(row["end_us"])
        if self.has_steps:
            return float(self.steps["start_us"].min()), float(self.steps["end_us"].max())
        if self.kernels.empty:
            return 0.0, 0.0
        return float(self.kernels["ts_us"].min()), float(self.kernels["end_us"].max())


_KERNEL_COLS = ["name", "kind", "ts_us", "dur_us", "end_us", "device", "stream", "correlation", "external_id",
                "category", "group", "hta_kernel_type", "grid", "block", "collective_name", "in_msg_nelems", "dtype",
                "group_size"]
_ANN_COLS = ["name", "ts_us", "dur_us", "end_us", "pid", "tid", "input_dims", "input_types"]
_RUNTIME_COLS = ["name", "ts_us", "dur_us", "end_us", "pid", "tid", "correlation", "external_id"]
_OP_COLS = ["name", "ts_us", "dur_us", "end_us", "pid", "tid", "external_id", "sequence_number", "fwd_thread_id",
            "input_dims", "input_types", "concrete_inputs"]
_PY_COLS = ["name", "ts_us", "dur_us", "end_us", "tid"]


def _frame(rows: list[dict], cols: list[str], ints: tuple[str, ...] = ()) -> pd.DataFrame:
    return _frame_cols(pd.DataFrame(rows, columns=cols), ints)


def _annotate(kernels: pd.DataFrame) -> pd.DataFrame:
    names = kernels["name"].tolist()
    kinds = kernels["kind"].tolist()
    matches = [classify(n) for n in names]
    kernels["category"] = ["memory" if k != "kernel" else m.category for k, m in zip(kinds, matches)]
    kernels["group"] = ["memory" if k != "kernel" else m.group for k, m in zip(kinds, matches)]
    kernels["hta_kernel_type"] = [hta_kernel_type(n) for n in names]
    return kernels


def _read(path: Path) -> bytes:
    try:
        return read_bytes(path)
    except FileNotFoundError:
        raise TraceReadError(f"{path}: no such file") from None
    except (OSError, EOFError) as exc:
        raise TraceReadError(f"{path}: not readable ({exc})") from None


def _loads(path: Path, raw: bytes) -> object:
    """Generic JSON decode (msgspec) of a file that is not of the Kineto shape."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise TraceReadError(f"{path}: not readable JSON ({exc})") from None


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _frame_cols(cols: dict[str, list] | pd.DataFrame, ints: tuple[str, ...] = ()) -> pd.DataFrame:
    """A frame from column lists (one list per column, built in one pass over the events), Int64 ``ints``,
    float times, sorted by ``ts_us``."""
    if isinstance(cols, pd.DataFrame):
        df = cols
    else:  # empty lists would make float columns: keep them object, as a frame of no rows has
        df = pd.DataFrame(cols) if any(len(v) for v in cols.values()) else pd.DataFrame(columns=list(cols))
    for c in ints:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    for c in ("ts_us", "dur_us", "end_us"):
        if c in df.columns:
            df[c] = df[c].astype(float)
    return df.sort_values("ts_us", kind="stable").reset_index(drop=True) if "ts_us" in df.columns else df


_NO_ARGS = Args()


def _times(evs: list) -> dict[str, list]:
    """``name``, ``ts_us``, ``dur_us``, ``end_us`` columns of decoded events."""
    ts, dur = [float(e.ts) for e in evs], [float(e.dur) for e in evs]
    return {"name": [e.name for e in evs], "ts_us": ts, "dur_us": dur, "end_us": [a + d for a, d in zip(ts, dur)]}


def _kineto(path: Path, doc: KinetoDoc) -> TraceEvents:
    """Frames of a decoded Kineto trace: one pass sorting the events into kinds, then each column in one sweep."""
    kern, rt, ops, py, ann, syncs_ev = [], [], [], [], [], []
    steps, gpu_steps, loader = [], [], []
    other = 0
    for ev in doc.traceEvents:
        if ev.ph != "X" or ev.dur is None or ev.ts is None:
            continue
        if type(ev.ts) not in (float, int) or type(ev.dur) not in (float, int):
            try:
                ev.ts, ev.dur = float(ev.ts), float(ev.dur)
            except (TypeError, ValueError):
                other += 1
                continue
        cat = ev.cat or ""
        if not isinstance(ev.name, str):
            ev.name = str(ev.name)
        if cat in DEVICE_CATS:
            kern.append(ev)
        elif cat in RUNTIME_CATS:
            rt.append(ev)
        elif cat == "python_function":
            py.append(ev)
        elif cat == "cuda_sync":
            syncs_ev.append(ev)
        elif (m := _STEP.match(ev.name)) and cat in ("user_annotation", "cpu_op", "gpu_user_annotation", ""):
            a, d = float(ev.ts), float(ev.dur)
            (gpu_steps if cat == "gpu_user_annotation" else steps).append((int(m.group(1)), a, a + d, d))
        elif cat == "cpu_op":
            if _DATALOADER.match(ev.name):
                loader.append((float(ev.ts), float(ev.ts) + float(ev.dur)))
            ops.append(ev)
        elif _DATALOADER.match(ev.name):
            loader.append((float(ev.ts), float(ev.ts) + float(ev.dur)))
        elif cat == "user_annotation":
            ann.append(ev)
    kern_a, rt_a, ops_a, ann_a = ([e.args or _NO_ARGS for e in g] for g in (kern, rt, ops, ann))
    kernels = _annotate(_frame_cols({
        **_times(kern), "kind": [e.cat for e in kern],
        "device": [_int(e.pid if a.device is None else a.device) for e, a in zip(kern, kern_a)],
        "stream": [_int(e.tid if a.stream is None else a.stream) for e, a in zip(kern, kern_a)],
        "correlation": [a.correlation for a in kern_a], "external_id": [a.external_id for a in kern_a],
        "grid": ["" if a.grid is None else str(a.grid) for a in kern_a],
        "block": ["" if a.block is None else str(a.block) for a in kern_a],
        "collective_name": [a.collective_name for a in kern_a], "in_msg_nelems": [a.in_msg_nelems for a in kern_a],
        "dtype": [a.dtype for a in kern_a], "group_size": [a.group_size for a in kern_a],
    }, ("correlation", "external_id", "device", "stream")))[_KERNEL_COLS]
    runtime = _frame_cols({**_times(rt), "pid": [e.pid for e in rt], "tid": [e.tid for e in rt],
                           "correlation": [a.correlation for a in rt_a], "external_id": [a.external_id for a in rt_a]},
                          ("correlation", "external_id"))
    cpu_ops = _frame_cols({**_times(ops), "pid": [e.pid for e in ops], "tid": [e.tid for e in ops],
                           **{c: [getattr(a, c) for a in ops_a] for c in _OP_COLS[6:]}},
                          ("external_id", "sequence_number", "fwd_thread_id"))
    python = _frame_cols({**_times(py), "tid": [e.tid for e in py]})
    annotations = _frame_cols({**_times(ann), "pid": [e.pid for e in ann], "tid": [e.tid for e in ann],
                               "input_dims": [a.input_dims for a in ann_a],
                               "input_types": [a.input_types for a in ann_a]})
    syncs = [(e.name, float(e.ts), float(e.ts) + float(e.dur), _int((e.args or _NO_ARGS).stream)) for e in syncs_ev]
    step_cols = ["step", "start_us", "end_us", "dur_us"]
    step_df = pd.DataFrame(steps, columns=step_cols).drop_duplicates("step").sort_values("step").reset_index(drop=True)
    head = doc.header()
    props = [p for p in (head.get("deviceProperties") or []) if isinstance(p, dict)]
    flags = {k: bool(head[k]) for k in ("record_shapes", "with_stack", "profile_memory", "with_flops", "with_modules")
             if k in head}
    dist = head.get("distributedInfo")
    return TraceEvents(
        path=path, source_format="kineto", kernels=kernels, runtime=runtime, cpu_ops=cpu_ops, python=python,
        steps=step_df, annotations=annotations,
        gpu_steps=pd.DataFrame(gpu_steps, columns=step_cols).sort_values("step").reset_index(drop=True),
        loader=pd.DataFrame(loader, columns=["ts_us", "end_us"]),
        syncs=pd.DataFrame(syncs, columns=["name", "ts_us", "end_us", "stream"]),
        device_name=props[0].get("name") if props else None, device_properties=props, flags=flags,
        distributed=dist if isinstance(dist, dict) else {},
        versions=_versions(head), other_events=other)


def _versions(doc: dict) -> dict[str, str]:
    """Runtime versions of a Kineto trace's header, decoded (HIP: major*10^7 + minor*10^5 + patch, the
    ``HIP_VERSION`` encoding; CUDA: major*1000 + minor*10, ``CUDART_VERSION``)."""
    out = {}
    hip, cuda = _int(doc.get("hip_runtime_version")), _int(doc.get("cuda_runtime_version"))
    if hip:
        out["hip"] = f"{hip // 10**7}.{hip // 10**5 % 100}.{hip % 10**5}"
    if cuda:
        out["cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    return out


def _empty_host() -> dict:
    return {"runtime": _frame([], _RUNTIME_COLS, ("correlation", "external_id")),
            "cpu_ops": _frame([], _OP_COLS, ("external_id", "sequence_number", "fwd_thread_id")),
            "python": _frame([], _PY_COLS), "steps": pd.DataFrame(columns=["step", "start_us", "end_us", "dur_us"]),
            "gpu_steps": pd.DataFrame(columns=["step", "start_us", "end_us", "dur_us"]),
            "loader": pd.DataFrame(columns=["ts_us", "end_us"]),
            "syncs": pd.DataFrame(columns=["name", "ts_us", "end_us", "stream"])}


def _rocprof_json(path: Path, tool: dict) -> TraceEvents:
    try:
        records = tool["buffer_records"]["kernel_dispatch"]
        symbols = {s["kernel_id"]: s for s in tool.get("kernel_symbols", [])}
        agents = {a["id"]["handle"]: a for a in tool.get("agents", []) if isinstance(a.get("id"), dict)}
    except (KeyError, TypeError) as exc:
        raise TraceReadError(f"{path}: rocprofv3 JSON without {exc} (expected rocprofiler-sdk-tool[0]."
                             "buffer_records.kernel_dispatch, kernel_symbols, agents)") from None
    rows, bad = [], 0
    for r in records:
        try:
            info = r["dispatch_info"]
            sym = symbols.get(info["kernel_id"], {})
            a = r["start_timestamp"] / 1e3
            b = r["end_timestamp"] / 1e3
            agent = info["agent_id"]["handle"]
        except (KeyError, TypeError):
            bad += 1
            continue
        name = sym.get("formatted_kernel_name") or sym.get("kernel_name") or f"kernel_id {info.get('kernel_id')}"
        g, w = info.get("grid_size") or {}, info.get("workgroup_size") or {}
        rows.append({"name": name, "kind": "kernel", "ts_us": a, "dur_us": b - a, "end_us": b,
                     "device": agents.get(agent, {}).get("gpu_index", agent),
                     "stream": (r.get("stream_id") or {}).get("handle", info.get("queue_id", {}).get("handle")),
                     "correlation": (r.get("correlation_id") or {}).get("internal"), "external_id": None,
                     "grid": str([g.get("x"), g.get("y"), g.get("z")]) if g else "",
                     "block": str([w.get("x"), w.get("y"), w.get("z")]) if w else ""})
    kernels = _annotate(_frame(rows, _KERNEL_COLS, ("correlation", "external_id", "device", "stream")))
    used = {(r.get("dispatch_info") or {}).get("agent_id", {}).get("handle") for r in records[:1000]}
    gpu = next((agents[h] for h in used if h in agents), None) or next(
        (a for a in agents.values() if a.get("type") == 2), None)
    props = [{"name": gpu.get("product_name"), "arch": gpu.get("name"), "computeUnits": gpu.get("cu_count")}] if gpu else []
    return TraceEvents(path=path, source_format="rocprofv3_json", kernels=kernels, **_empty_host(),
                       device_name=gpu.get("product_name") if gpu else None, device_properties=props,
                       other_events=bad)


def _rocprof_csv(path: Path) -> TraceEvents:
    from goblin_assets.runners.rocprof import RocprofParseError, parse_kernel_trace_csv

    try:
        df = parse_kernel_trace_csv(path)
    except RocprofParseError as exc:
        raise TraceReadError(str(exc)) from None
    out = pd.DataFrame({
        "name": df["kernel_name"], "kind": "kernel", "ts_us": df["start_ns"] / 1e3, "dur_us": df["dur_ns"] / 1e3,
        "end_us": df["end_ns"] / 1e3,
        "device": pd.to_numeric(df["agent_id"].astype(str).str.extract(r"(\d+)")[0], errors="coerce"),
        "stream": df["stream_id"] if "stream_id" in df.columns else df.get("queue_id"),
        "correlation": df.get("correlation_id"), "external_id": None,
        "grid": "", "block": ""})
    out = _annotate(_frame(out.to_dict("records"), _KERNEL_COLS, ("correlation", "external_id", "device", "stream")))
    return TraceEvents(path=path, source_format="rocprofv3_csv", kernels=out, **_empty_host())


def load_trace(path: str | Path) -> TraceEvents:
    """Read a Kineto trace (``.json``/``.json.gz``) or rocprofv3 output (JSON or ``*_kernel_trace.csv``).

    The format is decided by content, not by name: a JSON object with
    ``traceEvents`` is Kineto, one with ``rocprofiler-sdk-tool`` is rocprofv3;
    a ``.csv`` is a rocprofv3 kernel trace.

    Raises
    ------
    TraceReadError
        Missing file, unreadable or non-JSON content, JSON of another kind, a
        rocprofv3 file without kernel dispatch records, or a trace with no
        device events and no CPU ops (the message names the file).
    """
    path = Path(path)
    if not path.exists():
        raise TraceReadError(f"{path}: no such file")
    if path.suffix.lower() == ".csv":
        ev = _rocprof_csv(path)
    else:
        raw = _read(path)
        try:
            kdoc = decode(raw)
        except KinetoDecodeError:
            kdoc = None  # not of the Kineto shape: decoded generically below, for the error or rocprofv3
        if kdoc is not None and kdoc.traceEvents is not None:
            del raw
            summary = _summary_of(path, kdoc)
            ev = _kineto(path, kdoc)
            ev.summary = summary
            del kdoc
            return _check(ev)
        doc = _loads(path, raw)
        del raw
        if isinstance(doc, dict) and "rocprofiler-sdk-tool" in doc:
            tools = doc["rocprofiler-sdk-tool"]
            if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
                raise TraceReadError(f"{path}: rocprofiler-sdk-tool is not a list of tool results")
            ev = _rocprof_json(path, tools[0])
        elif isinstance(doc, dict) and "traceEvents" in doc:
            ev = _kineto(path, doc)
        else:
            raise TraceReadError(f"{path}: neither a Kineto trace (traceEvents) nor rocprofv3 JSON "
                                 "(rocprofiler-sdk-tool)")
    return _check(ev)


def _check(ev: TraceEvents) -> TraceEvents:
    if ev.kernels.empty and ev.cpu_ops.empty:
        raise TraceReadError(f"{ev.path}: no device events and no CPU ops: nothing to analyse")
    return ev


def _summary_of(path: Path, doc: KinetoDoc):
    """The audit's per-step summary (:func:`goblin_assets.runners.trace.summarize`) of a stepped trace, else None."""
    try:
        return summarize(path, doc)
    except ValueError:
        return None  # no ProfilerStep windows: trace_summary uses the device window instead
