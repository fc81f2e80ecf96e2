"""The opscope correctness gate as a blocking asset check on every driver asset.

The check reports the gate the driver ran while recording (injected vs
original outputs, torch.testing.assert_close); nothing re-runs.  A driver run
without a passing gate writes no rows and blocks the miners downstream.
"""
from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest

from goblin_assets.defs.mining import MINING_ASSETS
from goblin_assets.defs.opscope import DRIVERS, GATE_CHECK, OPSCOPE_ASSETS
from goblin_assets.opscope import drivers
from goblin_assets.opscope.inject import Gate
from goblin_assets.warehouse.db import query
from tests.conftest import dagster_resources


def _resources(tmp_path):
    return dagster_resources(tmp_path / "wh.duckdb", device="cpu")


def test_every_driver_asset_has_a_blocking_gate_check():
    assert {a.key.to_user_string() for a in OPSCOPE_ASSETS} == {f"opscope_{d}" for d in DRIVERS}
    for a in OPSCOPE_ASSETS:
        (spec,) = a.check_specs
        assert spec.name == GATE_CHECK and spec.blocking and spec.asset_key == a.key


def test_gate_check_reports_the_recording_run(tmp_path):
    res = dg.materialize(OPSCOPE_ASSETS, selection=["opscope_seq"], instance=dg.DagsterInstance.ephemeral(),
                         resources=_resources(tmp_path), run_config={"ops": {"opscope_seq": {"config": {"steps": 1}}}})
    assert res.success
    (ev,) = res.get_asset_check_evaluations()
    assert ev.check_name == GATE_CHECK and ev.passed
    gates = ev.metadata["gates"].value
    assert ev.metadata["gate_checks"].value == len(gates) >= 1
    assert all(g["passed"] and g["outputs_compared"] >= 1 for g in gates)
    assert ev.metadata["max_abs_diff"].value == pytest.approx(max(g["max_abs_diff"] for g in gates))


def test_a_run_without_a_passing_gate_writes_nothing_and_blocks_the_miners(tmp_path, monkeypatch):
    rows = pd.DataFrame(columns=drivers.SKETCH_COLUMNS)

    def no_gate(name, **kw):  # a driver whose gate did not pass (or never ran)
        return drivers.DriverResult("r1", name, "m", rows, [], [Gate(False, 1, 3.0, "output 0 differs")])

    monkeypatch.setattr(drivers, "run_driver", no_gate)
    res = dg.materialize([*OPSCOPE_ASSETS, *MINING_ASSETS], selection=["opscope_seq", "opscope_patterns"],
                         instance=dg.DagsterInstance.ephemeral(), resources=_resources(tmp_path),
                         raise_on_error=False)
    (ev,) = res.get_asset_check_evaluations()
    assert not ev.passed and ev.metadata["gates"].value[0]["message"] == "output 0 differs"
    assert res.asset_materializations_for_node("opscope_seq")[0].metadata["dagster/row_count"].value == 0
    assert not res.asset_materializations_for_node("opscope_patterns")  # blocked
    assert query("SELECT count(*) n FROM sketches", tmp_path / "wh.duckdb").n[0] == 0
