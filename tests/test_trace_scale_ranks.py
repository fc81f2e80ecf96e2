"""Issue 29: real traces as they come from jobs: the CUPTI-profiler trace, the compact reader, many ranks,
per-step outliers, graph-launched device time.

Test data (tests/data/traces/README.md): HTA's MIT-licensed test traces (a CUPTI range-profiler trace;
two ranks of one NCCL job), copyright Meta Platforms, Inc. and affiliates, unchanged; and traces
recorded here with ``benchmarks/record_gloo_ranks.py`` (torchrun, gloo, 2 ranks, rank 1 slowed).
Expected numbers are counted from the raw JSON in the tests, never copied from our output.
"""
from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from goblin_assets.cli import main

DATA = Path(__file__).parent / "data" / "traces"
CUPTI = DATA / "hta_cupti_profiler_a100.json.gz"


def test_cupti_profiler_trace_ends_critical_path_not_observable_without_a_traceback(goblin_home, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no library warning either (pandas FutureWarning, numpy RuntimeWarning)
        assert main(["trace", str(CUPTI), "--json", "--no-warehouse"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == "NVIDIA A100-PG509-200"
    assert "critical_path" in doc["not_observable"]
    assert "device events" in doc["not_observable"]["critical_path"]
    assert "argmax" not in json.dumps(doc["not_observable"])
