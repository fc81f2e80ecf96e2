"""``goblin audit --trace``: a trace recorded elsewhere becomes a replay workload, so nothing is run.

:func:`trace_workload` analyses the trace (:func:`~goblin_assets.trace.analysis.analyze_trace`),
and writes a replay folder under ``$GOBLIN_HOME/traces/<trace file stem>-<sha256[:8] of its bytes>/``:

* ``cached_metrics.json``: the trace's RunMetrics (labelled ``replayed``; its
  warnings carry every moderate or high finding of the trace analyses);
* ``environment.yaml``: the recorded node as far as the trace says it (the
  device names of ``deviceProperties``; ``WORLD_SIZE`` / ``RANK`` from its
  ``distributedInfo``, no other environment variable; unknown package
  versions), so rules read the recorded device, never this machine;
* ``expected_findings.yaml``: names the config file (a copy in the folder:
  a patch is written against the copy, never into the user's file).

A run that failed leaves its own recording beside the trace: TorchElastic's
error file (``error.json``, the JSON ``torch.distributed.elastic`` writes for a
``@record`` entry point to ``TORCHELASTIC_ERROR_FILE``: ``message.message``,
``message.extraInfo.py_callstack``, ``message.errorCode``).  When one is there
(:func:`run_error_beside`) the RunMetrics is of a failed run (``ok: false``,
the error line as its failure, the call stack as its stderr tail, the steps the
trace reached), and the audit goes down the failure path: its report names the
failure's class.

The config is the file given, else the one training config beside the trace
(the entry of a ``workload.yaml`` there, else the only ``.py``/``.yaml``/
``.yml``/``.toml`` file or ``.json`` that is not itself a trace), else an
empty ``config.yaml`` written into the folder (every field unset: rules that
need the config do not fire, rules on the trace's own numbers do).  The audit
session then treats the folder as any replay (:mod:`goblin_assets.runners.replay`).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import yaml

from goblin_assets import goblin_home
from goblin_assets.errors import WorkloadError
from goblin_assets.runners.replay import record_metrics
from goblin_assets.runners.workload import (ENVIRONMENT_NAME, EXPECTATIONS_NAME, SPEC_NAME, Workload, load_workload)
from goblin_assets.trace.analysis import TraceReport, analyze_trace
from goblin_assets.trace.events import trace_stem

_CONFIG_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".json")


def _is_trace_json(p: Path) -> bool:
    try:
        head = p.open("rb").read(4096)
    except OSError:
        return False
    return b"traceEvents" in head or b"rocprofiler-sdk-tool" in head or b"schemaVersion" in head


def _elastic_error(p: Path) -> dict | None:
    """The ``message`` object of a TorchElastic error file, or None when ``p`` is not one."""
    if p.suffix != ".json" or p.stat().st_size > 4 << 20:
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    msg = doc.get("message") if isinstance(doc, dict) else None
    return msg if isinstance(msg, dict) and isinstance(msg.get("message"), str) else None


def run_error_beside(trace: Path) -> tuple[Path, dict] | None:
    """The TorchElastic error file beside ``trace`` and its ``message`` object, or None when there is none.

    The format is ``torch.distributed.elastic.multiprocessing.errors.ErrorHandler.record_exception``'s:
    ``{"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack": ..., "timestamp": ...},
    "errorCode": N}}`` (``errorCode`` added by the agent when the worker died of a signal).
    """
    for p in sorted(trace.parent.glob("*.json")):
        if p != trace and (msg := _elastic_error(p)) is not None:
            return p, msg
    return None


def config_beside(trace: Path) -> Path | None:
    """The training config beside ``trace`` (see the module docstring), or None when there is none or several."""
    folder = trace.parent
    if (folder / SPEC_NAME).is_file():
        wl = load_workload(folder)
        return wl.config_file
    found = [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in _CONFIG_SUFFIXES and p != trace
             and not (p.suffix == ".json" and (_is_trace_json(p) or _elastic_error(p) is not None))]
    return found[0] if len(found) == 1 else None


def trace_workload(trace: str | Path, config: str | Path | None = None,
                   report: TraceReport | None = None) -> tuple[Workload, TraceReport]:
    """The replay workload of a recorded trace, and the trace's analysis.

    ``config``: the training config (a file, or a folder whose config is
    found as beside the trace); default: :func:`config_beside`.

    Raises
    ------
    goblin_assets.trace.events.TraceReadError
        The trace cannot be read.
    WorkloadError
        ``config`` does not exist.
    """
    trace = Path(trace).resolve()
    rep = report or analyze_trace(trace)
    if config is not None:
        cfg = Path(config).resolve()
        if not cfg.exists():
            raise WorkloadError(f"{cfg}: no such config file or folder")
        if cfg.is_dir():
            cfg = config_beside(cfg / trace.name)
            if cfg is None:
                raise WorkloadError(f"{config}: no single training config in this folder")
    else:
        cfg = config_beside(trace)
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()[:8]
    folder = goblin_home() / "traces" / f"{trace_stem(trace)}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    if cfg is None:
        cfg = folder / "config.yaml"
        cfg.write_text(f"# no training config was found beside {trace.name}: every field is unset\n{{}}\n",
                       encoding="utf-8")
    else:  # a copy inside the replay folder: the patch is written against it, never into the user's file
        cfg = Path(shutil.copy2(cfg, folder / cfg.name))
    m = rep.metrics.model_copy(deep=True)
    m.workload = folder.name
    # the recording is the user's profiler's measurement; the replay relabels it "replayed" when read back
    m.provenance.kind = "measured"
    m.warnings += [f"trace {f.severity}: {f.message}" for f in rep.findings if f.severity != "ok"]
    if (err := run_error_beside(trace)) is not None:  # the run's own recording says it failed
        path, msg = err
        code = msg.get("errorCode")
        m.ok = False
        m.failure = (f"{trace.name}: the run failed (TorchElastic error file {path.name}"
                     + (f", exit code {code}" if code is not None else "") + f"): {msg['message'].strip()}")
        m.stderr_tail = str((msg.get("extraInfo") or {}).get("py_callstack") or "")[-4000:]
    record_metrics(m, folder)
    devices = sorted({str(p.get("name")) for p in rep.events.device_properties if p.get("name")})
    dist = rep.events.distributed
    # the process group the trace records (distributedInfo): world size and this trace's rank, nothing guessed
    env = {k: str(dist[f]) for k, f in (("WORLD_SIZE", "world_size"), ("RANK", "rank")) if dist.get(f) is not None}
    env_doc = {"env": env, "packages": {}, "host": {"devices": devices}}
    (folder / ENVIRONMENT_NAME).write_text(
        "# the node of a recorded trace, as far as the trace says (goblin audit --trace)\n"
        + yaml.safe_dump(env_doc, sort_keys=False), encoding="utf-8")
    (folder / EXPECTATIONS_NAME).write_text(
        yaml.safe_dump({"config": cfg.name, "trace": str(trace)}, sort_keys=False), encoding="utf-8")
    return load_workload(folder), rep
