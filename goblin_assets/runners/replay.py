"""The replay runner: a recorded RunMetrics, labelled as replayed.

A workload folder may hold ``cached_metrics.json``: one RunMetrics (JSON, the
model of :mod:`goblin_assets.contracts`) recorded earlier, for example on an
MI300X.  The replay runner returns it instead of running anything, so demos
and the synthetic corpus work without a GPU.  What it returns is never
presented as measured (DESIGN.md "Data contracts"): ``provenance.kind`` is
``replayed`` (``modelled`` stays ``modelled``), ``provenance.source`` names
the recording file and what the recording itself says of its origin, and a
warning says the numbers were not measured by this run.

Only ``profile`` runs replay.  A benchmark or sketch needs fresh
measurements, so those modes yield a failed :class:`RawRun` with the reason.
The RunMetrics travels typed on :attr:`RawRun.metrics
<goblin_assets.runners.result.RawRun.metrics>` (a failed one, labelled
replayed, when the replay failed), and ``profile_run`` returns it as it is:
a replay never goes through the trace readers.
"""
from __future__ import annotations

from pathlib import Path

from goblin_assets.contracts import RunMetrics, RunProvenance
from goblin_assets.errors import GoblinError
from goblin_assets.runners.result import Mode, RawRun, read_json_model
from goblin_assets.runners.workload import RECORDING_NAME, Workload


class ReplayError(GoblinError):
    """A recording is missing or is not a valid RunMetrics (names the file and field)."""


def load_recording(path: str | Path) -> RunMetrics:
    """Read a recorded RunMetrics exactly as stored (no relabelling).

    Raises
    ------
    ReplayError
        The file is missing, is not JSON, or fails RunMetrics validation; the
        message names the file and the first invalid field.
    """
    p = Path(path)
    if not p.is_file():
        raise ReplayError(f"{p}: no recording (a replay needs a RunMetrics JSON file named {RECORDING_NAME})")
    return read_json_model(p, RunMetrics, ReplayError)


def replay_metrics(path: str | Path, workload: Workload | None = None) -> RunMetrics:
    """A recording relabelled for replay: never presented as measured.

    ``provenance.kind`` becomes ``replayed`` (a ``modelled`` recording stays
    ``modelled``); ``provenance.source`` is the recording's path followed by
    its own origin (kind, device, profiler, time, source); one warning says
    so.  Device, versions and host of the recording are kept: they describe
    where the numbers came from.

    Raises
    ------
    ReplayError
        As :func:`load_recording`.
    """
    p = Path(path).resolve()
    rec = load_recording(p)
    prov = rec.provenance
    origin = " ".join(x for x in (
        f"recorded as {prov.kind}",
        f"on {prov.device}" if prov.device else "",
        f"with {prov.profiler}" if prov.profiler else "",
        f"at {prov.measured_at}" if prov.measured_at else "",
        f"from {prov.source}" if prov.source else "",
    ) if x)
    kind = "modelled" if prov.kind == "modelled" else "replayed"
    m = rec.model_copy(deep=True)
    m.provenance = prov.model_copy(update={"kind": kind, "source": f"{p} ({origin})"})
    m.warnings.append(f"{kind} from {p}: not measured by this run ({origin})")
    if workload is not None:
        if rec.workload and rec.workload != workload.name:
            m.warnings.append(f"{p}: recording is of workload {rec.workload!r}, replayed for {workload.name!r}")
        m.workload = workload.name
    return m


def not_observable(workload: Workload, runner, mode: Mode) -> str | None:
    """Why ``runner`` cannot measure a ``mode`` run of ``workload``; None when it can.

    A replay runner only replays the recorded profile run: a ``benchmark``
    (original vs patched) or a ``sketch`` (tensors on the device) needs the
    workload to run, so the stage is not observable.  Stages call this first
    and report the reason instead of failing or inventing numbers.

    Returns
    -------
    str or None
        One sentence naming the recording and what it is (replayed or
        modelled, on which device).
    """
    if getattr(runner, "kind", "") != "replay" or mode == "profile":
        return None
    rec = runner.recording_for(workload)
    try:
        prov = load_recording(rec).provenance
        label = "modelled" if prov.kind == "modelled" else "replayed"
        what = f"{label} ({'' if prov.kind == label else prov.kind + ' '}on {prov.device})"
    except ReplayError:
        what = "replayed"
    need = {"benchmark": "timed runs of the original and the patched workload",
            "sketch": "the workload's tensors on a device"}.get(mode, f"a {mode} run")
    return (f"not observable: {workload.name} is {what} from {rec}; a {mode} needs {need}, "
            f"and a replay runs nothing")


def record_metrics(metrics: RunMetrics, folder: str | Path) -> Path:
    """Write ``metrics`` as ``FOLDER/cached_metrics.json`` (the file a replay reads).

    Returns
    -------
    Path
        The file written.
    """
    p = Path(folder) / RECORDING_NAME
    p.write_text(metrics.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return p


class ReplayRunner:
    """Return a recorded RunMetrics instead of running the workload.

    Parameters
    ----------
    recording:
        The RunMetrics JSON to replay; default ``WORKLOAD/cached_metrics.json``.
    device, timeout_s, mem_cap_gb, python:
        Accepted so a resource can build any runner kind with the same
        settings; a replay uses none of them.
    """

    kind = "replay"

    def __init__(self, recording: str | Path | None = None, device: str = "auto", timeout_s: float = 600.0,
                 mem_cap_gb: float | None = None, python: str | None = None):
        self.recording = Path(recording) if recording else None
        self.device = device
        self.timeout_s = timeout_s
        self.mem_cap_gb = mem_cap_gb

    def recording_for(self, workload: Workload) -> Path:
        """The recording this runner replays for ``workload``."""
        return self.recording or workload.root / RECORDING_NAME

    def metrics(self, workload: Workload) -> RunMetrics:
        """The replayed RunMetrics of ``workload`` (see :func:`replay_metrics`).

        Raises
        ------
        ReplayError
            The recording is missing or invalid.
        """
        return replay_metrics(self.recording_for(workload), workload)

    def run(self, workload: Workload, mode: Mode, steps: int, warmup: int = 2, script: Path | None = None,
            env: dict[str, str] | None = None, unset_env: list[str] | None = None, tap: str | None = None,
            label: str = "") -> RawRun:
        """Replay the recording as a RawRun whose ``metrics`` is the relabelled RunMetrics.

        ``steps``, ``warmup``, ``env`` and ``label`` do not change a
        recording; a patched ``script`` or a mode other than ``profile``
        cannot be replayed.  Nothing runs and no run folder is made
        (``run_dir`` is the recording's folder).

        Returns
        -------
        RawRun
            ``metrics`` is always set: the replayed RunMetrics, or when the
            recording is missing or invalid, the mode is ``benchmark``/
            ``sketch``, or ``script`` is a patched copy (its numbers were
            never recorded), ``ok=False`` with the reason, in a RunMetrics
            labelled replayed too.
        """
        rec = self.recording_for(workload)
        raw = RawRun(ok=False, run_dir=rec.parent.resolve(), mode=mode)
        if mode != "profile":
            raw.failure = (f"{rec}: the replay runner only replays profile runs; a {mode} run needs fresh "
                           f"measurements (use the local or rocprof runner)")
        elif script is not None and Path(script).resolve() != workload.script.resolve():
            raw.failure = f"{rec}: records {workload.entry}, not the patched script {Path(script).name}"
        else:
            try:
                raw.metrics = replay_metrics(rec, workload)
            except ReplayError as exc:
                raw.failure = str(exc)
        if raw.metrics is None:
            raw.metrics = RunMetrics(ok=False, failure=raw.failure, workload=workload.name, unit=workload.unit,
                                     provenance=RunProvenance(kind="replayed", source=str(rec.resolve())))
        raw.ok = raw.metrics.ok
        raw.failure = raw.metrics.failure
        return raw

    def fold_metrics(self, raw: RawRun, metrics: RunMetrics) -> None:
        """Nothing to fold: a replay's RunMetrics is finished (``raw.metrics``) and never rebuilt from a trace."""
