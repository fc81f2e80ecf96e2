"""Pandera schemas as blocking asset checks on every table-shaped audit asset."""
from __future__ import annotations

import pandas as pd
import pytest

from goblin_assets.definitions import defs
from goblin_assets.defs.checks import TABLE_ASSETS, validate_rows

TABLE_SHAPED = {("training_config", "configs"), ("profile_run", "kernels"), ("waste_budget", "waste_budget"), ("tensor_sketches", "sketches"),
                ("mined_patterns", "patterns"), ("benchmark_baseline", "benchmarks")}


def test_every_table_shaped_asset_has_a_blocking_schema_check():
    assert set(TABLE_ASSETS) == TABLE_SHAPED
    specs = {(s.asset_key.to_user_string(), s.name): s for a in defs.assets for s in getattr(a, "check_specs", ())}
    for asset, table in TABLE_SHAPED:
        spec = specs[(asset, f"{table}_schema")]
        assert spec.blocking, (asset, table)


def _kernels(pct: float) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": "r", "rank": 1, "name": "aten::addmm", "pct_time": pct}])


@pytest.mark.parametrize("frame,expected,ok", [
    (_kernels(41.0), 1, True),
    (_kernels(141.0), 1, False),   # pct_time outside 0..100
    (_kernels(41.0), 2, False),    # a row the asset reported is missing
    (_kernels(41.0).drop(columns="rank"), None, False),   # strict: a column is gone
])
def test_validate_rows(frame, expected, ok):
    res = validate_rows("kernels", frame, expected_rows=expected)
    assert res.passed is ok
    if "failure_cases" in res.metadata:
        assert res.metadata["failure_cases"].value


def test_benchmark_rows_must_be_positive_and_labelled():
    row = {"audit_id": "a", "workload": "w", "label": "baseline", "repeat": 0, "throughput_per_s": 0.0,
           "unit": "samples", "median_per_s": 1.0, "spread_per_s": 0.0, "steps": 8, "cache_key": "k", "cache_hit": False, "provenance": "measured"}
    res = validate_rows("benchmarks", pd.DataFrame([row, {**row, "label": "tuned", "throughput_per_s": 2.0}]))
    assert not res.passed
    cases = {c["column"] for c in res.metadata["failure_cases"].value}
    assert cases == {"throughput_per_s", "label"}
