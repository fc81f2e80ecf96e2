"""Hazards beside tuning rules: version ranges, devices, blocks; the run's own signals; per-node sizing; levers
pulled back elsewhere in the script."""
from __future__ import annotations

from pathlib import Path

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import (
    Citation,
    ConfigDict,
    Fix,
    Rule,
    RuleMatch,
    RunMetrics,
    RunProvenance,
    VersionRange,
    WasteBucket,
)
from goblin_assets.errors import KBError
from goblin_assets.host import HostFacts
from goblin_assets.kb.rules import KnowledgeBase, detect_context, load_kb, local_world_size, match_rules
from goblin_assets.measure.signals import run_signals, signal_counts
from goblin_assets.patch.changeset import resolve_changes
from goblin_assets.patch.propose import propose_patch
from goblin_assets.runners.devices import device_facts
from goblin_assets.runners.result import HarnessResult

CITE = Citation(title="a public issue", section="s", url="https://example.org/issue/1")
HOST = HostFacts(source="set", cores=80, online_cpus=80, affinity_cpus=80, amx_bf16=False, avx512_bf16=False)


def _rule(rid: str, **kw) -> Rule:
    base = dict(category="attention", platforms=["rocm", "cuda", "cpu"], symptom="s " * 8, detect=["cores > 0"],
                expected_impact="e", citation=CITE)
    return Rule(id=rid, **{**base, **kw})


def _run(device: str = "cpu", hip: str | None = None, torch: str = "2.13.0", arch: str | None = None) -> RunMetrics:
    return RunMetrics(steps=3, step_time_s=1.0, waste_budget={"useful": WasteBucket(seconds=1.0, status="measured")},
                      provenance=RunProvenance(kind="measured", device=device, arch=arch, hip_version=hip,
                                               cuda_version=None if hip else "12.4", torch_version=torch))


def _fired(rules: list[Rule], run: RunMetrics, cfg: ConfigDict = ConfigDict(), **ctx) -> set[str]:
    kb = KnowledgeBase(rules=rules, path=Path("mem"), sha256="x")
    return {m.rule_id for m in match_rules(kb, detect_context(cfg, run, HOST, **ctx)) if m.fired}


def test_a_hazard_names_the_affected_versions():
    bad = _rule("hazard.sdpa_mask_wrong", kind="hazard", category="correctness",
                affected_versions=[VersionRange(package="torch", specifier=">=2.5,<2.6")])
    assert _fired([bad], _run("AMD Instinct MI300X", hip="6.2", torch="2.5.1+rocm6.2"))
    assert not _fired([bad], _run("AMD Instinct MI300X", hip="6.2", torch="2.6.0+rocm6.2"))
    missing = _rule("hazard.bnb", kind="hazard", affected_versions=[VersionRange(package="bitsandbytes",
                                                                                 specifier="<0.45")])
    assert not _fired([missing], _run(), packages={"bitsandbytes": None})
    assert _fired([missing], _run(), packages={"bitsandbytes": "0.43.1"})


def test_rules_know_the_device():
    mi300 = _rule("precision.mi300_only", devices=["gfx942"], fix=Fix(config={"precision": "bf16"}))
    on_mi300 = _run("AMD Instinct MI300X", hip="6.2")
    assert _fired([mi300], on_mi300) and not _fired([mi300], _run("NVIDIA A100-SXM4-80GB"))
    bf16 = _rule("precision.bf16_units", detect=["device.bf16 == true"], fix=Fix(config={"precision": "bf16"}))
    assert not _fired([bf16], _run("Tesla V100-SXM2-32GB")) and _fired([bf16], _run("NVIDIA A10G"))
    assert device_facts("AMD Instinct MI210")["memory_gb"] == 64 and device_facts("Tesla V100-SXM2-32GB")["arch"] == "sm_70"
    # the measured architecture and memory win over the table
    assert device_facts("AMD Radeon Graphics", arch="gfx942:sramecc+:xnack-", memory_gb=63.9) == {
        "name": "AMD Radeon Graphics", "arch": "gfx942", "bf16": True, "fp8": True, "memory_gb": 63.9, "known": False}


def test_a_fired_hazard_blocks_patches_into_its_path_and_says_why():
    hazard = _rule("hazard.sdpa_padding_rocm", kind="hazard", category="correctness", blocks=["config.attention_impl"])
    tuning = _rule("attention.eager_to_sdpa", fix=Fix(config={"attention_impl": "sdpa"}), recovery_fraction=0.5)
    other = _rule("data.workers", fix=Fix(config={"dataloader_workers": 4}), recovery_fraction=0.2,
                  targets_bucket="useful")
    kb = KnowledgeBase(rules=[hazard, tuning, other], path=Path("mem"), sha256="x")
    cs = resolve_changes(ConfigDict(attention_impl="eager", dataloader_workers=0), kb,
                         [RuleMatch(rule_id=r.id, fired=True, detect_score=1) for r in kb.rules], _run(), cores=4)
    assert cs.changes == {"dataloader_workers": 4}
    (blocked,) = cs.outcomes("blocked")
    assert blocked.rule_id == "attention.eager_to_sdpa"
    assert blocked.reason.startswith("blocked by hazard hazard.sdpa_padding_rocm") and CITE.url in blocked.reason


def test_kinds_are_checked_when_the_kb_loads(tmp_path):
    import yaml

    rule = {"id": "env.profiler", "kind": "warning", "category": "env_vars", "platforms": ["cpu"],
            "symptom": "s " * 8, "detect": ["cores > 0"], "expected_impact": "e", "targets_bucket": "host_gap",
            "recovery_fraction": 0.3, "citation": CITE.model_dump()}
    f = tmp_path / "kb.yaml"
    f.write_text(yaml.safe_dump({"rules": [rule]}))
    with pytest.raises(KBError, match="a warning has no fix and no recovery_fraction"):
        load_kb(f)
    f.write_text(yaml.safe_dump({"rules": [{**rule, "kind": "hazard", "recovery_fraction": 0, "blocks": ["nope"]}]}))
    with pytest.raises(KBError, match="'nope' is neither a rule id nor config.<field>"):
        load_kb(f)
    f.write_text(yaml.safe_dump({"rules": [{**rule, "kind": "hazard", "recovery_fraction": 0,
                                            "affected_versions": [{"package": "torch", "specifier": "2.5!"}]}]}))
    with pytest.raises(KBError, match="not a version specifier"):
        load_kb(f)
    # the shipped KB: profiler variables are a warning, never a fix with a predicted recovery
    rocprof = load_kb().by_id["env_vars.unset_rocprofsys"]
    assert rocprof.kind == "warning" and rocprof.recovery_fraction == 0 and not rocprof.fix.unset_env


def test_the_runs_own_signals_are_deduplicated_and_become_evidence():
    result = HarnessResult(
        reached_budget=True, steps_seen=4, device="cpu", torch_version="2.13.0", num_threads=2, max_rss_gb=1.0,
        python_warnings=[{"category": "UserWarning", "where": "checkpoint.py:61", "count": 4, "step": 1,
                          "message": "None of the inputs have requires_grad=True. Gradients will be None"}],
        losses=[2.3, 2.1, "nan", "nan"], grads_missing=[0, 12, 12, 12], params_trainable=24)
    sigs = run_signals(result, "some log line\nUserWarning: None of the inputs have requires_grad=True\n")
    by_id = {s.id: s for s in sigs}
    assert by_id["inputs_no_requires_grad"].count == 5 and by_id["inputs_no_requires_grad"].where == "checkpoint.py:61"
    assert by_id["loss_nonfinite"].step == 3 and by_id["loss_nonfinite"].count == 2
    assert by_id["grads_missing"].count == 12 and by_id["grads_missing"].step == 2
    counts = signal_counts(sigs)
    assert counts["inputs_no_requires_grad"] == 5 and counts["sdpa_fallback"] == 0
    lora = _rule("hazard.lora_reentrant", kind="hazard", detect=["signals.inputs_no_requires_grad > 0",
                                                                 "config.lora_rank != null"])
    assert _fired([lora], _run().model_copy(update={"signals": sigs}), ConfigDict(lora_rank=8))
    assert not _fired([lora], _run(), ConfigDict(lora_rank=8))   # not recorded: never a guess


def test_workers_and_threads_are_sized_per_process_of_the_node():
    assert local_world_size({"LOCAL_WORLD_SIZE": "8"}) == 8 and local_world_size({}) == 1
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.runners.workload import load_workload
    from tests.conftest import WORKLOADS

    host = HOST.model_copy(update={"env": {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16"}})
    s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), host=host)
    assert s.cores() == 10                         # 80 CPUs shared by 8 ranks, not 80 per rank


def test_a_lever_pulled_back_elsewhere_in_the_script_is_not_edited(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from transformers import TrainingArguments\n"
                      "model.gradient_checkpointing_enable()\n"
                      "args = TrainingArguments(output_dir='o', gradient_checkpointing=True)\n")
    rule = _rule("memory.no_checkpointing", category="memory", fix=Fix(config={"gradient_checkpointing": False}),
                 recovery_fraction=0.3)
    kb = KnowledgeBase(rules=[rule], path=Path("mem"), sha256="x")
    p = propose_patch(parse_config(script), kb, [RuleMatch(rule_id=rule.id, fired=True, detect_score=1)], _run(),
                      cores=2, source=script)
    assert p.applied == [] and p.diff == ""
    assert "gradient_checkpointing_enable(...) at line 2 sets gradient_checkpointing back to True" in p.dropped[0]


def test_a_hazard_whose_fix_is_only_a_keyword_is_written(tmp_path):
    """LoRA + reentrant checkpointing: the fix is gradient_checkpointing_kwargs={"use_reentrant": False} in the
    user's TrainingArguments, under the installed signature; shown in the report's changes."""
    script = tmp_path / "train.py"
    script.write_text("from transformers import TrainingArguments\n"
                      "args = TrainingArguments(output_dir='o', gradient_checkpointing=True)\n")
    kb = load_kb()
    rule = kb.by_id["correctness.checkpoint_inputs_without_grad"]
    p = propose_patch(parse_config(script), kb, [RuleMatch(rule_id=rule.id, fired=True, detect_score=1)], _run(),
                      cores=2, source=script, signatures=lambda d: ["output_dir", "gradient_checkpointing_kwargs"])
    assert [a.rule_id for a in p.applied] == [rule.id]
    assert "gradient_checkpointing_kwargs={'use_reentrant': False}" in p.diff
    assert p.applied[0].changes == {"keyword.gradient_checkpointing_kwargs": {"to": {"use_reentrant": False}}}
