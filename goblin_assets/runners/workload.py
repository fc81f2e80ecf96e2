"""Workload folders: a training script plus a small ``workload.yaml``.

``workload.yaml`` fields:

* ``entry`` (required): the script to run, relative to the folder.
* ``args``: extra command-line arguments for the script.
* ``unit``: ``samples`` or ``tokens``: what one step's throughput counts.
* ``batch_field``: which element of each batch from the DataLoader counts one
  sample/token: an integer index into a tuple batch or a key of a dict batch
  (its leading dimension is the number of samples; for ``tokens``, its numel).
* ``mask_field``: for ``tokens``, the key of the attention mask, whose sum is
  the number of non-padding tokens.
* ``config``: the file ``training_config`` parses (default: ``entry``).
* ``model``: a human-readable model name for reports.
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

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ValidationError

from goblin_assets import workloads_root
from goblin_assets.errors import WorkloadError

#: The file that makes a folder a runnable workload.
SPEC_NAME = "workload.yaml"
#: A recorded RunMetrics (JSON): a folder with one and no ``workload.yaml`` is a replay workload.
RECORDING_NAME = "cached_metrics.json"
#: The recorded environment of a replay workload.
ENVIRONMENT_NAME = "environment.yaml"
#: The replay scenario's expectations; its ``config`` key names the config file.
EXPECTATIONS_NAME = "expected_findings.yaml"


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
    """Load ``PATH/workload.yaml`` (or treat a ``.py`` file as its own workload).

    Raises
    ------
    WorkloadError
        The path does not exist, has no ``workload.yaml``, the YAML is invalid,
        or the entry script is missing; the message names the file.
    """
    p = Path(path)
    if not p.exists():
        raise WorkloadError(f"{p}: no such workload folder or file")
    if p.is_file():
        if p.suffix != ".py":
            raise WorkloadError(f"{p}: a workload is a folder with workload.yaml, or a .py script")
        return Workload(name=p.stem, root=p.parent.resolve(), entry=p.name)
    spec_file = p / SPEC_NAME
    if not spec_file.is_file():
        if (p / RECORDING_NAME).is_file():
            return _replay_workload(p)
        raise WorkloadError(f"{spec_file}: missing (a workload folder needs workload.yaml naming its entry script, "
                            f"or {RECORDING_NAME} to replay)")
    raw = _read_mapping(spec_file)
    raw.setdefault("name", p.resolve().name)
    try:
        wl = Workload(root=p.resolve(), **raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"])
        raise WorkloadError(f"{spec_file}: field '{field}': {first['msg']}") from None
    if not wl.script.is_file():
        raise WorkloadError(f"{spec_file}: entry script '{wl.entry}' not found at {wl.script}")
    if wl.python and not os.access(wl.interpreter or "", os.X_OK):
        raise WorkloadError(f"{spec_file}: field 'python': {wl.python!r} is not an executable interpreter")
    return wl


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
