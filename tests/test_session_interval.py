"""The session's report, `--json` object and `audits` row carry the interval and the calibrated prediction.

Seeded stages only: nothing runs (the benchmark results are built here, as a Dagster asset would pass them).
"""
from __future__ import annotations

import pandas as pd
import pytest

from goblin_assets.audit.session import AuditSession
from goblin_assets.contracts import AppliedRule, BenchmarkResult, Citation, ConfigDict, Patch
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse.db import validate
from goblin_assets.warehouse.tables import columns
from tests.conftest import WORKLOADS
from tests.test_report_html import _run

RULE = "data.loader_workers_with_threads"
DIFF = "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-num_workers = 0\n+num_workers = 2\n"


def _bench(label: str, values: list[float], m) -> BenchmarkResult:
    return BenchmarkResult(label=label, metrics=m, throughputs=values, median=sorted(values)[len(values) // 2],
                           spread=max(values) - min(values), cache_key="k", pair_id="p", looks=2,
                           stop_reason="undecided after 4 pairs: the time budget of 120 s has no room for another",
                           budget_s=120.0, elapsed_s=100.0)


def _session(tmp_path, patched: list[float], history=None, diff: str = "") -> AuditSession:
    m = _run(0.01, 0.0, 500.0).model_copy(update={"workload": "digits_mlp", "unit": "samples",
                                                  "samples_per_sec": 500.0})
    applied = [AppliedRule(rule_id=RULE, category="data", targets_bucket="data_wait", predicted_recovery=0.3,
                           citation=Citation(title="t", section="s", url="https://pytorch.org"), rationale="")]
    p = Patch(new_config={}, diff=diff, target_file="train.py", applied=applied, expected_speedup_low=1.2,
              expected_speedup_high=1.4, confidence=0.7)
    bench = {"baseline": _bench("baseline", [500.0, 480.0, 510.0, 495.0], m),
             "patched": _bench("patched", patched, m)}
    return AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), out_dir=tmp_path / "out", history=history,
                             training_config=ConfigDict(batch_size=64), profile_run=m, kb_matches=[], patch=p,
                             benchmarks=bench, patched_run=m)


def test_a_noop_patch_reads_no_significant_change_in_json_report_and_row(goblin_home, tmp_path):
    s = _session(tmp_path, [505.0, 470.0, 520.0, 490.0], diff=DIFF)  # ratios around 1.0: nothing changed
    out = s.to_json()
    iv = out["measured_speedup_interval"]
    assert iv["verdict"] == "no significant change" and iv["low"] < 1.0 < iv["high"]
    assert iv["level"] == 0.95 and iv["looks"] == 2 and iv["pairs"] == 4 and iv["paired"]
    assert out["measured_speedup"] == pytest.approx(iv["point"])
    text = s.report_path.read_text()
    line = next(ln for ln in text.split("\n") if ln.startswith("**Measured speedup"))
    assert "Measured speedup: no significant change" in line and "faster" not in line
    row = validate("audits", s.rows("audit_report")["audits"]).iloc[0]
    assert row.speedup_verdict == "no significant change" and row.speedup_pairs == 4
    assert (row.speedup_low, row.speedup_high) == (pytest.approx(iv["low"]), pytest.approx(iv["high"]))
    assert (row.speedup_pairs_faster, row.speedup_pairs_slower) == (iv["pairs_faster"], iv["pairs_slower"]) == (2, 2)
    assert row.speedup_sign_test_p == iv["sign_test_p"] == 1.0
    assert (row.speedup_budget_s, row.speedup_elapsed_s) == (120.0, 100.0)
    assert "4 pairs in 100 s of a 120 s budget" in line
    # no history: the model's prediction, stored as the model's
    assert out["predicted_speedup"] == out["predicted_speedup_model"] == [1.2, 1.4]
    assert out["calibration"]["audits"] == 0 and row.calibration_audits == 0


def test_history_scales_the_prediction_and_the_row_keeps_the_models(goblin_home, tmp_path):
    history = [{"audit_id": f"a{i}", "workload": "digits_mlp", "rules": RULE, "measured_speedup": 1.0 + i / 100,
                "predicted_speedup_low": 1.2, "predicted_speedup_high": 1.4} for i in range(3)]
    s = _session(tmp_path, [700.0, 690.0, 720.0, 700.0], history=history)
    out = s.to_json()
    assert out["measured_speedup_interval"]["verdict"] == "faster"
    assert out["predicted_speedup"][1] < 1.4 and out["predicted_speedup_model"] == [1.2, 1.4]
    assert out["calibration"]["audits"] == 3 and out["confidence"] < 0.7
    row = validate("audits", s.rows("audit_report")["audits"]).iloc[0]
    assert (row.predicted_speedup_low, row.predicted_speedup_high, row.confidence) == (1.2, 1.4, 0.7)
    assert row.calibrated_speedup_high == pytest.approx(out["predicted_speedup"][1])
    assert row.calibration_audits == 3
    assert "scaled by the record of 3 measured audits" in s.report_path.read_text()
    # a what-if child keeps the history
    assert s.what_if({"batch_size": 32}).history is history



def test_a_patch_measured_slower_is_not_offered_and_its_measurement_is_kept(goblin_home, tmp_path):
    s = _session(tmp_path, [330.0, 340.0, 320.0, 335.0], diff=DIFF)      # every pair slower: about 0.67x
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "patch.diff").write_text(DIFF)                 # what the patch stage wrote
    out = s.to_json()
    v = out["verdict"]
    assert v["status"] == "slower" and v["patch_offered"] is False and v["not_recommended"].startswith("measured 0.")
    assert out["measured_speedup"] < 1 and out["measured_speedup_interval"]["high"] < 1   # the measurement stays
    assert any(d.startswith(f"{RULE}: not recommended: measured 0.") for d in out["dropped_rules"])
    assert not (tmp_path / "out" / "patch.diff").exists()              # no patch.diff is offered
    text = s.report_path.read_text()
    assert text.splitlines()[2].startswith("**Verdict: patch not recommended: measured 0.")
    assert "## Not recommended: measured 0." in text and "## Patch to your file" not in text
    assert "Not recommended: measured 0." in (tmp_path / "out" / "report.html").read_text()
    row = validate("audits", s.rows("audit_report")["audits"]).iloc[0]
    assert (row.verdict, row.patch_offered, row.speedup_verdict) == ("slower", False, "slower")


def test_an_empty_patch_is_not_benchmarked(goblin_home, tmp_path):
    class NoRuns:  # any run would be a benchmark of two identical programs
        kind, python = "local", None

        def run(self, *a, **k):
            raise AssertionError("an empty patch was run")

    m = _run(0.01, 0.0, 500.0).model_copy(update={"workload": "digits_mlp", "unit": "samples"})
    p = Patch(new_config={}, diff="", target_file="train.py", applied=[], dropped=[
        "precision.cpu_bf16_amx: no place to write precision"])
    s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), out_dir=tmp_path / "out", runner=NoRuns(),
                          training_config=ConfigDict(batch_size=64), profile_run=m, kb_matches=[], patch=p,
                          tensor_sketches=pd.DataFrame(columns=columns("sketches")))
    assert s.benchmarks() is None and s.patched_run() is None
    assert "changes nothing" in s.not_observable["benchmarks"] and "no place to write precision" in \
        s.not_observable["benchmarks"]
    v = s.verdict()
    assert v.status == "no patch" and not v.patch_offered


def test_no_cache_reaches_the_benchmark(goblin_home, tmp_path, monkeypatch):
    """``--no-cache`` / ``GOBLIN_RUNNER_BENCH_CACHE=0`` (AuditSettings.bench_cache) is what the session passes on."""
    from goblin_assets.audit import session as session_module
    from goblin_assets.settings import AuditSettings

    seen = {}
    monkeypatch.setattr(session_module, "benchmark", lambda *a, **k: seen.update(k) or {})
    m = _run(0.01, 0.0, 500.0).model_copy(update={"workload": "digits_mlp", "unit": "samples"})
    p = Patch(new_config={}, diff=DIFF, target_file="train.py", applied=[])
    s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), settings=AuditSettings(bench_cache=False),
                          out_dir=tmp_path / "out", training_config=ConfigDict(batch_size=64), profile_run=m, patch=p)
    s.benchmarks()
    assert seen["use_cache"] is False
