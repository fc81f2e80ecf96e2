"""Predictions learn from history: a rule's measured/predicted record scales the next prediction (pure)."""
from __future__ import annotations

import pandas as pd
import pytest

from goblin_assets.contracts import AppliedRule, Citation, Patch
from goblin_assets.measure.calibration import (
    CREDIBILITY_K,
    HISTORY_COLUMNS,
    HISTORY_SQL,
    MIN_AUDITS,
    calibrate,
    rule_records,
)

CITE = Citation(title="t", section="s", url="https://example.org")


def _patch(*rules: tuple[str, float], low: float = 1.2, high: float = 1.5, confidence: float = 0.6) -> Patch:
    applied = [AppliedRule(rule_id=r, category="data", targets_bucket="data_wait", citation=CITE, rationale="",
                           predicted_recovery=rec) for r, rec in rules]
    return Patch(new_config={}, diff="", target_file="", applied=applied, expected_speedup_low=low,
                 expected_speedup_high=high, confidence=confidence)


def _row(i: int, rules: str, measured: float, low: float = 1.2, high: float = 1.5, workload: str = "w") -> dict:
    return {"audit_id": f"a{i}", "workload": workload, "rules": rules, "measured_speedup": measured,
            "predicted_speedup_low": low, "predicted_speedup_high": high}


def test_no_history_or_too_little_leaves_the_model_alone():
    p = _patch(("r1", 0.2))
    for history in (None, [], [_row(0, "r1", 1.1)]):          # MIN_AUDITS is 2
        cal = calibrate(p, history)
        assert (cal.low, cal.high, cal.confidence, cal.audits) == (1.2, 1.5, 0.6, 0) and not cal.applied
        assert "No rule of this patch has a record" in cal.note()
    assert MIN_AUDITS == 2


def test_a_rule_that_always_overpromised_is_scaled_down_by_its_credibility():
    history = [_row(i, "r1", 1.08 + d) for i, d in enumerate((-0.01, 0.0, 0.01))] + [_row(9, "other", 2.0)]
    rec = rule_records(history)["r1"]
    z = 3 / (3 + CREDIBILITY_K)
    assert rec.audits == 3 and rec.measured_over_predicted == pytest.approx(1.08 / 1.35)
    assert rec.within_range == 0.0 and rec.credibility == pytest.approx(z)
    cal = calibrate(_patch(("r1", 0.2)), history)
    scale = 1 + z * (1.08 / 1.35 - 1)
    assert cal.scale == pytest.approx(scale) and cal.low == pytest.approx(1.2 * scale)
    assert cal.high == pytest.approx(1.5 * scale) and cal.confidence == pytest.approx(0.6 * (1 - z))
    assert cal.audits == 3 and cal.applied
    note = cal.note()
    assert "record of 3 measured audits" in note and "r1: 3 audits" in note and "1.20x–1.50x" in note


def test_rules_weigh_by_predicted_recovery_and_a_rule_without_record_counts_as_the_model():
    history = [_row(i, "r1", 1.08 + d) for i, d in enumerate((-0.01, 0.0, 0.01))]
    alone = calibrate(_patch(("r1", 0.2)), history)
    mixed = calibrate(_patch(("r1", 0.2), ("r2", 0.6)), history)   # r2: no record, 3/4 of the predicted recovery
    assert mixed.scale == pytest.approx(0.25 * alone.scale + 0.75)
    assert [r.rule_id for r in mixed.records] == ["r1"]


def test_a_benchmark_replayed_from_the_cache_counts_once():
    same = [_row(i, "r1", 1.08) for i in range(4)]                   # four identical audits: one measurement
    assert rule_records(same)["r1"].audits == 1
    assert not calibrate(_patch(("r1", 0.2)), same).applied


def test_the_record_is_the_speedup_calibration_models_numbers():
    """measured/predicted and within-range per rule: the SQL model marts/speedup_calibration.sql on the same rows."""
    from importlib.resources import files

    import duckdb

    from goblin_assets.warehouse.db import ensure_tables
    from goblin_assets.warehouse.frames import _frame

    rows = [_row(0, "r1,r2", 1.4), _row(1, "r1", 1.1, 1.0, 1.3), _row(2, "r2", 0.9), _row(3, "r1", 1.25)]
    con = duckdb.connect()
    ensure_tables(con)
    frame = _frame("audits", [{**r, "created_at": pd.Timestamp("2025-01-01"), "profile_run_id": "p", "unit": "samples",
                               "diff": "", "confidence": 0.5} for r in rows])
    con.register("f", frame)
    con.execute("INSERT INTO audits SELECT * FROM f")
    sql = files("goblin_assets.dbt_like_sql.marts").joinpath("speedup_calibration.sql").read_text()
    want = con.execute(sql).df().set_index("rule_id")
    history = con.execute(HISTORY_SQL).df()
    assert list(history.columns) == list(HISTORY_COLUMNS) and len(history) == 4
    got = rule_records(history)
    for rid in ("r1", "r2"):
        assert got[rid].audits == want.loc[rid, "audits"]
        assert got[rid].measured_over_predicted == pytest.approx(want.loc[rid, "measured_over_predicted_mid"])
        assert got[rid].within_range == pytest.approx(want.loc[rid, "within_predicted_range"])


def test_history_without_the_columns_is_an_error():
    with pytest.raises(ValueError, match="measured_speedup"):
        rule_records(pd.DataFrame([{"rules": "r1"}]))
