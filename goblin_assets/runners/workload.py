"""Workload folders: a training script plus a small ``workload.yaml``.

``workload.yaml`` fields (:data:`SPEC_KEYS`; any other key is an error that
names the closest known one, and a value of the wrong kind is an error naming
its key):

* ``entry`` (required): the program to run, relative to the folder: a Python
  script (``.py``) run inside the harness, or a launch script (``.sh``,
  ``.bash``) run by bash, whose ``python``/``python3`` commands run their
  script inside the harness (:mod:`goblin_assets.runners.local`).  A file
  without a suffix is told by its ``#!`` line.  Anything else (a TOML, YAML
  or JSON config) is an error: a config file goes under ``config:``.
* ``args``: extra command-line arguments for the script.
* ``unit``: ``samples`` or ``tokens``: what one step's throughput counts.
* ``batch_field``: which element of each batch from the DataLoader counts one
  sample/token: an integer index into a tuple batch or a key of a dict batch
  (its leading dimension is the number of samples; for ``tokens``, its numel).
* ``mask_field``: for ``tokens``, the key of the attention mask, whose sum is
  the number of non-padding tokens.
* ``config``: the file ``training_config`` parses (default: ``entry``).
* ``model``: a human-readable model name for reports.
* ``name``: the workload's name in reports and the warehouse (default: the
  folder's name).
* ``python``: the interpreter the script runs in (the user's environment:
  its torch, transformers, datasets ...): a path (relative to the folder or
  absolute) or a command name on ``PATH``; default Goblin's own.  A setting
  (``goblin audit --python``, ``GOBLIN_RUNNER_PYTHON``) takes precedence.

A folder without ``workload.yaml`` that holds ``cached_metrics.json`` is a
*replay* workload (the synthetic corpus, ``workloads/synthetic/<scenario>``):
nothing in it is run; its audit replays the recording (see
:mod:`goblin_assets.runners.replay`).  Its ``expected_findings.yaml`` names the
config file (``config:``) and ``environment.yaml``, when present, is the
environment the recording belongs to (``env``, ``host``, ``packages``,
``cores``), which rule detection reads instead of this machine's.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ValidationError, field_validator

from goblin_assets import workloads_root
from goblin_assets.errors import WorkloadError, WorkloadSpecError

#: The file that makes a folder a runnable workload.
SPEC_NAME = "workload.yaml"
#: A recorded RunMetrics (JSON): a folder with one and no ``workload.yaml`` is a replay workload.
RECORDING_NAME = "cached_metrics.json"
#: The recorded environment of a replay workload.
ENVIRONMENT_NAME = "environment.yaml"
#: The replay scenario's expectations; its ``config`` key names the config file.
EXPECTATIONS_NAME = "expected_findings.yaml"
#: The keys a ``workload.yaml`` may hold (module docstring).
SPEC_KEYS: tuple[str, ...] = ("entry", "args", "unit", "batch_field", "mask_field", "config", "model", "python",
                              "name")
#: Entry suffixes run inside the harness as Python.
PYTHON_SUFFIXES: tuple[str, ...] = (".py",)
#: Entry suffixes run by bash as launch scripts (their ``python`` commands go through the harness).
LAUNCH_SUFFIXES: tuple[str, ...] = (".sh", ".bash")

EntryKind = Literal["python", "launch"]

_SHEBANG = re.compile(rb"#!\s*(\S+)(?:[ \t]+(\S+))?")


def entry_kind(path: Path) -> EntryKind | None:
    """How the runner runs ``path``: ``python``, ``launch`` (bash), or None (not a program: a config file).

    By suffix (:data:`PYTHON_SUFFIXES`, :data:`LAUNCH_SUFFIXES`); a file
    without one by its ``#!`` line (``python``, ``python3.11``, ``sh``,
    ``bash``, also through ``/usr/bin/env``).  An unreadable file is None.
    """
    suffix = path.suffix.lower()
    if suffix in PYTHON_SUFFIXES:
        return "python"
    if suffix in LAUNCH_SUFFIXES:
        return "launch"
    if suffix:
        return None
    try:
        with open(path, "rb") as f:
            m = _SHEBANG.match(f.readline(256))
    except OSError:
        return None
    if m is None:
        return None
    prog = Path(m.group(1).decode(errors="replace")).name
    if prog == "env" and m.group(2):
        prog = m.group(2).decode(errors="replace")
    if re.fullmatch(r"python[\d.]*", prog):
        return "python"
    return "launch" if prog in ("sh", "bash", "dash") else None


class Workload(BaseModel):
    """A validated workload folder."""

    name: str
    root: Path
    entry: str
    args: list[str] = []
    unit: Literal["samples", "tokens"] = "samples"
    batch_field: int | str = 0
    mask_field: str | None = None
    config: str | None = None
    model: str = ""
    recording: str | None = None
    environment: str | None = None
    python: str | None = None

    @field_validator("args", mode="before")
    @classmethod
    def _numbers_as_text(cls, v):
        """``args: [--lr, 0.1]``: YAML reads 0.1 as a number; on a command line it is the text ``0.1``."""
        if isinstance(v, list):
            return [str(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else a for a in v]
        return v

    def __setstate__(self, state: dict) -> None:
        """Unpickle, giving fields added since the pickle was written their defaults.

        Dagster's IO manager keeps a materialized Workload pickled; a stage that
        re-runs on it (automation) must not fail on a field it predates.
        """
        defaults = {k: f.get_default() for k, f in type(self).model_fields.items() if not f.is_required()}
        super().__setstate__({**state, "__dict__": {**defaults, **state["__dict__"]}})

    @property
    def script(self) -> Path:
        return self.root / self.entry

    @property
    def config_file(self) -> Path:
        return self.root / (self.config or self.entry)

    @property
    def kind(self) -> EntryKind | None:
        """How the entry is run (:func:`entry_kind`): ``python``, ``launch``, None for a replay's config."""
        return entry_kind(self.script)

    def program(self, script: Path | None = None) -> Path:
        """The file a run executes: the entry, or ``script`` (a patched copy of it).

        A patch edits the config file; when ``config:`` names a file other
        than the entry, ``script`` is that file's copy inside a copy of the
        whole folder, and the program is the copy's entry (a config file is
        never run).
        """
        if script is None:
            return self.script
        script = Path(script)
        cfg = Path(self.config) if self.config and self.config != self.entry else None
        if cfg is not None and script.parts[-len(cfg.parts):] == cfg.parts:
            return script.parents[len(cfg.parts) - 1] / self.entry
        return script

    @property
    def interpreter(self) -> str | None:
        """The workload's ``python:`` as an absolute path (None when it names none)."""
        if not self.python:
            return None
        if "/" not in self.python:
            return shutil.which(self.python) or self.python
        return str((self.root / self.python).absolute()) if not Path(self.python).is_absolute() else self.python

    def script_hash(self) -> str:
        """sha256 of the entry script's bytes (for the benchmark cache key)."""
        return hashlib.sha256(self.script.read_bytes()).hexdigest()

    @property
    def replay(self) -> bool:
        """True for a replay workload: ``recording`` is replayed, nothing is run."""
        return self.recording is not None

    def recorded_environment(self) -> dict | None:
        """The recorded ``environment.yaml`` (``env``, ``host``, ``packages``, ``cores``), or None.

        Raises
        ------
        WorkloadError
            The file is not a YAML mapping (names the file).
        """
        if not self.environment:
            return None
        return _read_mapping(self.root / self.environment)


def _read_mapping(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise WorkloadError(f"{path}: expected a mapping at the top level")
    return raw


def _replay_workload(p: Path) -> Workload:
    """A folder with ``cached_metrics.json`` and no ``workload.yaml``: replayed, never run."""
    spec = p / EXPECTATIONS_NAME
    config = _read_mapping(spec).get("config") if spec.is_file() else None
    if not config or not (p / config).is_file():
        raise WorkloadError(f"{spec}: field 'config': a replay folder names its config file here "
                            f"({'missing' if not config else f'{config} not found'})")
    try:
        unit = json.loads((p / RECORDING_NAME).read_text(encoding="utf-8")).get("unit", "samples")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise WorkloadError(f"{p / RECORDING_NAME}: not a RunMetrics JSON object ({exc})") from None
    return Workload(name=p.resolve().name, root=p.resolve(), entry=config, unit=unit, recording=RECORDING_NAME,
                    environment=ENVIRONMENT_NAME if (p / ENVIRONMENT_NAME).is_file() else None)


def load_workload(path: str | Path) -> Workload:
    """Load ``PATH/workload.yaml`` (or treat a Python or launch script as its own workload).

    Raises
    ------
    WorkloadSpecError
        A key of ``workload.yaml`` is unknown (the message suggests the
        closest known key), a value has the wrong type, or the entry is not a
        Python or launch script (:func:`entry_kind`); names the file and key.
    WorkloadError
        The path does not exist, has no ``workload.yaml``, the YAML is invalid,
        the entry script is missing or the interpreter is not executable; the
        message names the file.
    """
    p = Path(path)
    if not p.exists():
        raise WorkloadError(f"{p}: no such workload folder or file")
    if p.is_file():
        if entry_kind(p) is None:
            raise WorkloadError(f"{p}: a workload is a folder with workload.yaml, a Python script (.py) or a launch "
                                f"script ({', '.join(LAUNCH_SUFFIXES)})")
        return Workload(name=p.stem, root=p.parent.resolve(), entry=p.name)
    spec_file = p / SPEC_NAME
    if not spec_file.is_file():
        if (p / RECORDING_NAME).is_file():
            return _replay_workload(p)
        raise WorkloadError(f"{spec_file}: missing (a workload folder needs workload.yaml naming its entry script, "
                            f"or {RECORDING_NAME} to replay)")
    raw = _read_mapping(spec_file)
    _check_keys(spec_file, raw)
    raw.setdefault("name", p.resolve().name)
    try:
        wl = Workload(root=p.resolve(), **raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"])
        got = repr(first.get("input"))
        raise WorkloadSpecError(str(spec_file), str(first["loc"][0]), f"field '{field}': {first['msg']} "
                                f"(got {got if len(got) <= 60 else got[:57] + '...'})") from None
    if not wl.script.is_file():
        raise WorkloadError(f"{spec_file}: entry script '{wl.entry}' not found at {wl.script}")
    if wl.kind is None:
        raise WorkloadSpecError(
            str(spec_file), "entry",
            f"field 'entry': '{wl.entry}' is not a Python script ({', '.join(PYTHON_SUFFIXES)}) or a launch script "
            f"({', '.join(LAUNCH_SUFFIXES)}), so it cannot be run; a config file goes under config: "
            f"(entry: the script that trains, config: {wl.entry})")
    if wl.python and not os.access(wl.interpreter or "", os.X_OK):
        raise WorkloadError(f"{spec_file}: field 'python': {wl.python!r} is not an executable interpreter")
    return wl


def _check_keys(spec_file: Path, raw: dict) -> None:
    """Reject a key of ``workload.yaml`` that is not in :data:`SPEC_KEYS`, naming the closest known one."""
    for key in raw:
        if key in SPEC_KEYS:
            continue
        close = difflib.get_close_matches(str(key), SPEC_KEYS, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(SPEC_KEYS)}"
        raise WorkloadSpecError(str(spec_file), str(key), f"unknown key '{key}' ({hint})",
                                close[0] if close else None)


def list_workloads(root: Path | None = None) -> list[Path]:
    """Workload folders under the workloads root (``$GOBLIN_WORKLOADS`` or ``workloads/``), at any depth.

    Runnable folders (with ``workload.yaml``) and replay folders (with
    ``cached_metrics.json`` and no ``workload.yaml``, e.g. every
    ``synthetic/<scenario>``); a folder inside another workload folder is not
    one.
    """
    base = root or workloads_root()
    found = {p.parent for name in (SPEC_NAME, RECORDING_NAME) for p in base.rglob(name)}
    return sorted(f for f in found if not any(a in found for a in f.parents))
