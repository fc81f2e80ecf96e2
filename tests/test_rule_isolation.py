"""A patch of several rules measured slower: each rule is measured alone and only the slower one is withdrawn.

The patch is real (the digits workload's own file, two fired rules written by the patch stage); the
benchmark is replaced by one whose throughputs depend on what each patched program changes, so the test
decides which rule is slower without asserting anything the machine's timing could flip.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from goblin_assets.audit import session as session_module
from goblin_assets.audit.session import AuditSession
from goblin_assets.contracts import BenchmarkResult, RuleMatch
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse.tables import columns
from tests.conftest import WORKLOADS
from tests.test_report_html import _run

WORKERS = "data.loader_workers_with_threads"   # edits num_workers in train.py: measured 1.3x alone here
LAUNCH_BLOCKING = "env_vars.unset_cuda_launch_blocking"    # unsets CUDA_LAUNCH_BLOCKING: measured 0.6x alone here
BASE = [500.0, 490.0, 510.0, 505.0]


def _fake_benchmark(calls: list[dict]):
    def bench(workload, runner, arms, **kw) -> dict[str, BenchmarkResult]:
        patched = arms["patched"]
        edited = Path(patched["script"]).read_text() != (workload.root / "train.py").read_text()
        factor = (1.3 if edited else 1.0) * (0.6 if "CUDA_LAUNCH_BLOCKING" in (patched.get("unset_env") or []) else 1.0)
        calls.append({"edited": edited, "env": list(patched.get("unset_env") or []), "budget_s": kw.get("budget_s")})
        m = _run(0.01, 0.0, 500.0).model_copy(update={"workload": "digits_mlp", "unit": "samples"})
        pair = f"p{len(calls)}"
        out = {}
        for label, values in (("baseline", BASE), ("patched", [v * factor for v in BASE])):
            out[label] = BenchmarkResult(label=label, metrics=m, throughputs=values, median=sorted(values)[2],
                                         spread=max(values) - min(values), cache_key="k" * 64, pair_id=pair,
                                         looks=1, stop_reason="decided after 4 pairs", budget_s=kw.get("budget_s"),
                                         elapsed_s=10.0)
        return out
    return bench


def test_the_slower_rule_of_a_slower_patch_is_withdrawn_alone(goblin_home, tmp_path, monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(session_module, "benchmark", _fake_benchmark(calls))
    monkeypatch.setattr(AuditSession, "_validation_failure", lambda self, p: None)  # no run: the benchmark decides
    m = _run(0.01, 0.0, 500.0).model_copy(update={"workload": "digits_mlp", "unit": "samples",
                                                  "samples_per_sec": 500.0})
    fired = [RuleMatch(rule_id=r, fired=True, detect_score=1.0, reason="seeded") for r in (WORKERS, LAUNCH_BLOCKING)]
    s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), out_dir=tmp_path / "out", profile_run=m,
                          kb_matches=fired, patched_run=m, tensor_sketches=pd.DataFrame(columns=columns("sketches")))
    assert sorted(a.rule_id for a in s.patch().applied) == sorted([WORKERS, LAUNCH_BLOCKING])

    s.benchmarks()
    # the whole patch (0.78x), then each rule alone, then nothing more: the one rule left reuses its measurement
    seen = [(c["edited"], bool(c["env"])) for c in calls]
    assert seen[0] == (True, True) and sorted(seen[1:]) == [(False, True), (True, False)]
    assert calls[0]["budget_s"] == s.settings.bench_budget_s and calls[1]["budget_s"] < calls[0]["budget_s"]
    iso = {r["rule_id"]: r for r in s.results["rule_isolation"]}
    assert iso[LAUNCH_BLOCKING]["slower"] and not iso[WORKERS]["slower"]
    assert iso[LAUNCH_BLOCKING]["interval"]["high"] < 1.0 < iso[WORKERS]["interval"]["low"]

    p = s.patch()
    assert [a.rule_id for a in p.applied] == [WORKERS] and not p.unset_env
    assert any(d.startswith(f"{LAUNCH_BLOCKING}: ") and "not recommended: measured alone 0.6" in d for d in p.dropped)
    out = s.to_json()
    assert out["verdict"]["status"] == "faster" and out["verdict"]["patch_offered"] is True
    assert out["rules"] == [WORKERS] and out["rule_isolation"] == s.results["rule_isolation"]
    diff = (tmp_path / "out" / "patch.diff").read_text()
    assert "--num-workers" in diff and "CUDA_LAUNCH_BLOCKING" not in diff
    assert "not recommended: measured alone 0.6" in s.report_path.read_text()


def test_a_single_rule_patch_measured_slower_is_not_isolated(goblin_home, tmp_path, monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(session_module, "benchmark", _fake_benchmark(calls))
    monkeypatch.setattr(AuditSession, "_validation_failure", lambda self, p: None)
    m = _run(0.01, 0.0, 500.0).model_copy(update={"workload": "digits_mlp", "unit": "samples"})
    s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), out_dir=tmp_path / "out", profile_run=m,
                          kb_matches=[RuleMatch(rule_id=LAUNCH_BLOCKING, fired=True, detect_score=1.0)], patched_run=m,
                          tensor_sketches=pd.DataFrame(columns=columns("sketches")))
    s.benchmarks()
    assert len(calls) == 1 and "rule_isolation" not in s.results
    assert s.verdict().status == "slower" and not s.verdict().patch_offered
