"""Record sketches of a workload's matmuls during a short run (the ``workload`` driver)."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pandas as pd

from goblin_assets.errors import RunFailed
from goblin_assets.runners.base import Runner
from goblin_assets.runners.result import RawRun
from goblin_assets.runners.workload import Workload
from goblin_assets.warehouse.frames import text
from goblin_assets.warehouse.tables import TEXT

#: Column order of the tidy ``sketches`` table (DESIGN.md "Sketch rows").
SKETCH_COLUMNS = ["run_id", "workload", "model", "step", "backend", "dist", "M", "K", "N", "numel",
                  "site", "role", "stat", "idx", "value"]


@dataclass
class SketchRecording:
    """A sketch recording of a workload: the tidy rows and the child run that produced them.

    ``rows`` has the columns :data:`SKETCH_COLUMNS`; ``raw`` is the run (its
    harness clock times the recorded steps, taps included).
    """

    rows: pd.DataFrame
    raw: RawRun


def record_sketches(workload: Workload, runner: Runner, steps: int = 3, warmup: int = 1,
                    run_id: str | None = None) -> SketchRecording:
    """Tap every forward matmul of ``workload`` for ``steps`` optimizer steps.

    The taps run in the child process (:class:`goblin_assets.opscope.taps.MatmulTap`),
    on the device, read back once per step.  The rows' ``dist`` is ``"workload"``.

    Raises
    ------
    RunFailed
        The workload's script failed; the message names the script and reason.
    """
    raw = runner.run(workload, "sketch", steps=steps, warmup=warmup,
                     tap="goblin_assets.opscope.taps:MatmulTap", label="sketch")
    if not raw.ok:
        raise RunFailed(f"tensor_sketches: {raw.failure}")
    rows = json.loads((raw.run_dir / "sketches.json").read_text())
    df = pd.DataFrame(rows)
    if df.empty:
        raise RunFailed(f"tensor_sketches: {workload.script}: no matmul ran in {steps} steps")
    consts = {"run_id": run_id or uuid.uuid4().hex[:12], "workload": workload.name, "model": workload.model,
              "backend": raw.result.device, "dist": "workload"}
    for col in ("site", "role", "stat"):
        df[col] = df[col].astype(TEXT)
    for col, v in consts.items():
        df[col] = text(v, len(df))
    return SketchRecording(df[SKETCH_COLUMNS], raw)


def record_workload(workload: Workload, runner: Runner, steps: int = 3, warmup: int = 1,
                    run_id: str | None = None) -> pd.DataFrame:
    """The rows of :func:`record_sketches` (columns :data:`SKETCH_COLUMNS`).  Raises RunFailed."""
    return record_sketches(workload, runner, steps, warmup, run_id).rows
