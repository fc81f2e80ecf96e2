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
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ValidationError

from goblin_assets import workloads_root
from goblin_assets.errors import WorkloadError


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

    @property
    def script(self) -> Path:
        return self.root / self.entry

    @property
    def config_file(self) -> Path:
        return self.root / (self.config or self.entry)

    def script_hash(self) -> str:
        """sha256 of the entry script's bytes (for the benchmark cache key)."""
        return hashlib.sha256(self.script.read_bytes()).hexdigest()


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
    spec_file = p / "workload.yaml"
    if not spec_file.is_file():
        raise WorkloadError(f"{spec_file}: missing (a workload folder needs workload.yaml naming its entry script)")
    try:
        raw = yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{spec_file}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise WorkloadError(f"{spec_file}: expected a mapping at the top level")
    raw.setdefault("name", p.resolve().name)
    try:
        wl = Workload(root=p.resolve(), **raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"])
        raise WorkloadError(f"{spec_file}: field '{field}': {first['msg']}") from None
    if not wl.script.is_file():
        raise WorkloadError(f"{spec_file}: entry script '{wl.entry}' not found at {wl.script}")
    return wl


def list_workloads(root: Path | None = None) -> list[Path]:
    """Folders under the workloads root (``$GOBLIN_WORKLOADS`` or ``workloads/``) with a ``workload.yaml``."""
    base = root or workloads_root()
    return sorted(p.parent for p in base.glob("*/workload.yaml"))
