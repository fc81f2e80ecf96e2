"""The real-problem corpus (tests/data/bug_reports/): public bug reports rebuilt as replay scenarios and audited.

Every scenario is audited in process with ``goblin audit PATH --json``
(``goblin_assets.cli.main``, benchmarks/bug_reports.py).  On all of them the
audit completes (exit 0, a written report) and proposes no change the
scenario forbids (``must_not_fire`` applied).  On the two-thirds that rules
were written against, the audit names the cause and the fix (``must_fire``
fired and applied, or reported as a hazard/warning); the held-out third
(``heldout.txt``, and ``heldout_invariants.txt`` for the scenarios added for the
run-time invariant checks, scored on its own) is scored and printed, never
asserted on, so that it stays a held-out score.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from tests.conftest import REPO

CORPUS = REPO / "tests" / "data" / "bug_reports"


def _bench():
    spec = importlib.util.spec_from_file_location("bug_reports_bench", REPO / "benchmarks" / "bug_reports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
SCENARIOS = BENCH.scenarios(CORPUS)
HELDOUT = BENCH.heldout(CORPUS)

#: Training scenarios whose must_fire rule fires but that the patch writers cannot carry yet (the rule is
#: dropped with "cannot edit the file (...)" and named under "Not applied"); the reason, for the lead.
WRITER_GAPS = {
    "deit_81_workers_per_rank": "the text writer cannot rewrite --num_workers on a torch.distributed.launch line",
    "litllama_396_group_by_length": "a raw lit-llama script has no call that takes group_by_length",
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("goblin_home")))
    try:
        res = BENCH.run()
    finally:
        mp.undo()
    print("\n" + "\n".join(BENCH._line(r) for r in res["scenarios"]))
    print(f"train: {json.dumps(res['train'])}\nheldout: {json.dumps(res['heldout'])}\n"
          f"heldout_invariants: {json.dumps(res['heldout_invariants'])}\n"
          f"heldout_backward: {json.dumps(res['heldout_backward'])}")
    return res


def test_corpus_size_split_and_files():
    names = {p.name for p in SCENARIOS}
    assert len(names) >= 25
    assert HELDOUT <= names and len(HELDOUT) >= len(names) // 3 - 1
    for folder in SCENARIOS:
        spec = yaml.safe_load((folder / "expected_findings.yaml").read_text())
        assert spec["source"].startswith("https://"), folder.name
        assert (folder / spec["config"]).is_file(), folder.name
        assert spec["must_fire"] and set(spec["must_fire"]).isdisjoint(spec.get("must_not_fire", [])), folder.name
        assert not (folder / "workload.yaml").exists(), "a replay scenario, never run"
        rec = json.loads((folder / "cached_metrics.json").read_text())
        prov = rec["provenance"]
        assert prov["kind"] == "modelled" and prov["source"].startswith("modelled") and len(prov["source"]) > 80
        env = yaml.safe_load((folder / "environment.yaml").read_text())
        assert {"cores", "env", "host", "packages"} <= set(env), folder.name


def test_every_audit_completes_with_a_report(verdicts):
    failed = {r["name"]: r["error"] for r in verdicts["scenarios"] if not r["completed"]}
    assert not failed, failed


def test_no_forbidden_change_is_proposed(verdicts):
    bad = {r["name"]: r["forbidden"] for r in verdicts["scenarios"] if r["forbidden"]}
    assert not bad, bad


def test_cause_and_fix_are_named_on_the_training_scenarios(verdicts):
    train = [r for r in verdicts["scenarios"] if not r["heldout"]]
    # the knowledge: every expected rule fires on every training scenario
    not_fired = {r["name"]: [m for m in r["missing"] if m not in r["fired"]] for r in train}
    assert not {k: v for k, v in not_fired.items() if v}, not_fired
    # and is applied or reported, except where a patch writer cannot carry it yet
    missed = {r["name"] for r in train if not r["named"]}
    assert missed <= set(WRITER_GAPS), {r["name"]: r["dropped"] for r in train if r["name"] in missed - set(WRITER_GAPS)}
    assert verdicts["train"]["named_share"] >= 0.85


def test_heldout_score_is_reported(verdicts):
    held, held_inv, held_bwd = verdicts["heldout"], verdicts["heldout_invariants"], verdicts["heldout_backward"]
    # the held-aside thirds of the invariant scenarios (issue 28) and of the backward / remedy ones are scored alone
    assert held["scenarios"] + held_inv["scenarios"] + held_bwd["scenarios"] == len(HELDOUT)
    assert held_inv["scenarios"] == len(BENCH.heldout_invariants(CORPUS)) >= 4
    assert held_bwd["scenarios"] == len(BENCH.heldout_backward(CORPUS)) >= 2
    for h in (held, held_inv, held_bwd):
        assert h["completed"] == h["scenarios"] and h["forbidden"] == 0
