"""What ``goblin audit`` prints into a pipe or a log (issue 25): paths whole on one line, tables not cut.

A terminal gets rich's layout at its own width; a pipe has no width, and rich's default (80 columns)
folded long paths mid-word and cut table cells to an ellipsis.  The audit is a replay (nothing runs) of a
shipped scenario copied under a deep folder, so its paths are far wider than 80 columns.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import WORKLOADS


def test_piped_summary_keeps_paths_whole_and_tables_uncut(tmp_path):
    deep = tmp_path.joinpath(*["a_folder_name_long_enough_to_push_paths_past_eighty_columns"] * 3)
    wl = deep / "wl"
    shutil.copytree(WORKLOADS / "synthetic" / "bnb_8bit_old_rocm", wl)
    home = deep / "home"
    r = subprocess.run([sys.executable, "-m", "goblin_assets.cli", "audit", str(wl)], capture_output=True, text=True,
                       env={**os.environ, "GOBLIN_HOME": str(home), "COLUMNS": "80"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("verdict: ")                       # the verdict leads, on the first line
    report = [ln for ln in lines if ln.startswith("report: ")]
    assert len(report) == 1 and Path(report[0].removeprefix("report: ")).is_file(), lines  # one whole path
    assert max(len(ln) for ln in lines) > 200                     # long lines stay long: nothing folded them
    assert str(wl / "cached_metrics.json") in r.stdout            # the recording's path, unbroken
    table = [ln for ln in lines if ln.startswith("│")]
    assert table and not [ln for ln in table if "…" in ln], table  # no cell cut to an ellipsis
    assert any("step time" in ln for ln in table)
