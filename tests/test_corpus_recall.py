"""The synthetic corpus (workloads/synthetic): every scenario, replayed, fires exactly what it should.

Each scenario is parsed (parse_config on its config file in a real tool's
format), its recorded RunMetrics comes back through the replay runner, and the
KB's detect conditions are checked against the scenario's *recorded*
environment (environment.yaml: env, host, packages, cores), not this
machine's.  Every rule in ``must_fire`` fires; no rule in ``must_not_fire``
does.  The patch stage then runs on each scenario and its diff must apply.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from goblin_assets.audit.corpus import corpus_recall, replay_scenario, scenarios
from goblin_assets.config.parse import parse_config
from goblin_assets.kb.rules import PROFILER_ENV, load_kb, match_rules
from goblin_assets.patch.propose import propose_patch
from goblin_assets.runners.replay import RECORDING_NAME
from tests.conftest import WORKLOADS

SCENARIOS = scenarios(WORKLOADS / "synthetic")


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def _scenario(folder: Path):
    sc = replay_scenario(folder, load_kb())
    return sc.spec, sc.env, sc.config, sc.metrics, sc.context


def test_corpus_has_the_issue_scenarios():
    names = {p.name for p in SCENARIOS}
    assert len(names) >= 8
    for needed in ("no_loader_workers", "fp32_on_mi300x", "eager_attention_mi300x", "compile_off_launch_bound",
                   "checkpointing_without_pressure", "unfused_adamw", "bnb_8bit_old_rocm", "profiler_vars_as_knobs",
                   "two_gpus_of_eight"):
        assert needed in names


@pytest.mark.parametrize("folder", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_scenario_files_and_labels(folder: Path):
    spec = yaml.safe_load((folder / "expected_findings.yaml").read_text())
    assert (folder / spec["config"]).is_file()
    assert (folder / RECORDING_NAME).is_file() and (folder / "environment.yaml").is_file()
    assert not (folder / "workload.yaml").exists(), "corpus scenarios are not runnable workloads"
    assert spec["must_fire"] and set(spec["must_fire"]).isdisjoint(spec.get("must_not_fire", []))
    rec = json.loads((folder / RECORDING_NAME).read_text())["provenance"]
    if rec["kind"] == "measured":       # recorded on this project's CPU machines
        assert rec["device"] == "cpu" and "measured-on-CPU" in rec["source"], rec
    else:                               # GPU-only: modelled, and says from what
        assert rec["kind"] == "modelled" and rec["source"].startswith("modelled") and len(rec["source"]) > 80


@pytest.mark.parametrize("folder", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_expected_rules_fire_and_forbidden_rules_do_not(folder: Path, kb):
    spec, _, cfg, metrics, ctx = _scenario(folder)
    assert metrics.provenance.kind in ("replayed", "modelled")     # never presented as measured
    fired = {m.rule_id: m for m in match_rules(kb, ctx)}
    missing = [r for r in spec["must_fire"] if not fired[r].fired]
    assert not missing, {r: fired[r].reason for r in missing}
    wrong = [r for r in spec.get("must_not_fire", []) if fired[r].fired]
    assert not wrong, wrong
    for needle in spec.get("warnings_contain", []):
        assert any(needle in w for w in cfg.warnings), cfg.warnings


def test_corpus_recall_over_all_scenarios(kb):
    res = corpus_recall(kb, WORKLOADS / "synthetic")
    assert res["scenarios"] >= 8 and res["expected"] >= 12
    assert res["recall"] == 1.0, res["per_scenario"]
    assert not any(v["forbidden"] for v in res["per_scenario"].values())


@pytest.mark.parametrize("folder", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_patch_on_each_scenario_applies(folder: Path, kb, tmp_path):
    """The fired rules become a patch of the scenario's own file; the diff applies; no profiler knob is set."""
    spec, envdoc, cfg, metrics, ctx = _scenario(folder)
    matches = match_rules(kb, ctx)
    p = propose_patch(cfg, kb, matches, metrics, cores=envdoc["cores"], workload_root=folder,
                      source=folder / spec["config"], packages=envdoc["packages"], out_dir=tmp_path / "out")
    assert {a.rule_id for a in p.applied} <= {m.rule_id for m in matches if m.fired}
    assert not [v for v in p.env if PROFILER_ENV.match(v)]
    if folder.name == "profiler_vars_as_knobs":   # profiler variables: a warning, never a fix with a recovery
        assert "env_vars.unset_rocprofsys" in {m.rule_id for m in matches if m.fired}
        assert "env_vars.unset_rocprofsys" not in [a.rule_id for a in p.applied]
        assert not [v for v in p.unset_env if v.startswith("ROCPROFSYS_")]
    if folder.name == "fp32_on_mi300x":    # bf16 makes the TF32-for-fp32 rule moot: not stacked
        assert [a.rule_id for a in p.applied] == ["precision.bf16_on_mi300x"]
        assert p.dropped[0].startswith("precision.tf32_on_mi300x: superseded by precision.bf16_on_mi300x")
        assert p.rule_consistency == pytest.approx(0.5)
    if p.diff:
        work = tmp_path / "work"
        shutil.copytree(folder, work)
        subprocess.run(["patch", "-p1", "--quiet"], input=p.diff, text=True, cwd=work, check=True)
        assert (work / spec["config"]).read_text() == Path(p.patched_file).read_text()
        again = parse_config(work / spec["config"])
        for a in p.applied:
            for fld, change in a.changes.items():
                if not fld.startswith("env."):
                    assert getattr(again, fld) == change["to"], (a.rule_id, fld)
