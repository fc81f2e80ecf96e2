"""Record sketches of a workload's matmuls during a short run (the ``workload`` driver)."""
from __future__ import annotations

import json
import uuid

import pandas as pd

from goblin_assets.errors import RunFailed
from goblin_assets.runners.base import Runner
from goblin_assets.runners.workload import Workload

#: Column order of the tidy ``sketches`` table (DESIGN.md "Sketch rows").
SKETCH_COLUMNS = ["run_id", "workload", "model", "step", "backend", "dist", "M", "K", "N", "numel",
                  "site", "role", "stat", "idx", "value"]


def record_workload(workload: Workload, runner: Runner, steps: int = 3, warmup: int = 1,
                    run_id: str | None = None) -> pd.DataFrame:
    """Tap every forward matmul of ``workload`` for ``steps`` optimizer steps.

    The taps run in the child process (:class:`goblin_assets.opscope.taps.MatmulTap`),
    on the device, read back once per step.  Returns the tidy rows (columns
    :data:`SKETCH_COLUMNS`; ``dist`` is ``"workload"``).

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
    df["run_id"] = run_id or uuid.uuid4().hex[:12]
    df["workload"] = workload.name
    df["model"] = workload.model
    df["backend"] = raw.result.get("device", "cpu")
    df["dist"] = "workload"
    return df[SKETCH_COLUMNS]
