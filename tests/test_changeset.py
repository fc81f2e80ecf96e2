"""resolve_changes: the fired rules as one change-set, as data (no file read), and write_changes on it."""
from __future__ import annotations

from pathlib import Path

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import Citation, ConfigDict, Fix, Rule, RuleMatch, RunMetrics, RunProvenance, WasteBucket
from goblin_assets.kb.rules import KnowledgeBase
from goblin_assets.patch.changeset import ChangeSet, resolve_changes
from goblin_assets.patch.propose import propose_patch, write_changes
from tests.conftest import WORKLOADS

# a config that names a file that does not exist: resolving reads no file
CFG = ConfigDict(precision="fp32", dataloader_workers=0, padding="max_length", attention_impl="eager",
                 source_file="/nonexistent/train.py")


def _rule(rid: str, config: dict, recovery: float, bucket: str = "data_wait", detect: list[str] | None = None,
          **fix) -> Rule:
    return Rule(id=rid, category="data", platforms=["cpu"], symptom="s", detect=detect or ["cores > 0"],
                fix=Fix(config=config, **fix), targets_bucket=bucket, recovery_fraction=recovery,
                expected_impact="e", citation=Citation(title="t", section="s", url="https://example.org"))


def _resolve(rules: list[Rule], cfg: ConfigDict = CFG, exclude=None, cores: int = 4) -> ChangeSet:
    kb = KnowledgeBase(rules=rules, path=Path("mem"), sha256="x")
    return resolve_changes(cfg, kb, _matches(rules), _run(), cores=cores, exclude=exclude)


def _matches(rules: list[Rule]) -> list[RuleMatch]:
    return [RuleMatch(rule_id=r.id, fired=True, detect_score=1.0) for r in rules]


def _run() -> RunMetrics:
    """data_wait 60%, useful 30%, precision_path 10% of the step; all measured."""
    wb = {"useful": WasteBucket(seconds=0.3, status="measured"),
          "data_wait": WasteBucket(seconds=0.6, status="measured"),
          "precision_path": WasteBucket(seconds=0.1, status="measured")}
    return RunMetrics(workload="w", steps=3, step_time_s=1.0, waste_budget=wb,
                      provenance=RunProvenance(kind="measured", cpu_count=4))


def test_conflict_names_the_winner_and_why():
    cs = _resolve([_rule("a.small", {"dataloader_workers": 1}, 0.2), _rule("b.big", {"dataloader_workers": 2}, 0.8)])
    assert [d.rule_id for d in cs.decisions] == ["b.big", "a.small"]          # uplift order
    (c,) = cs.outcomes("conflict")
    assert (c.rule_id, c.winner, c.on) == ("a.small", "b.big", "dataloader_workers")
    assert c.uplift == pytest.approx(0.2 * 0.6)
    assert cs.dropped == ["a.small: conflicts with b.big on dataloader_workers (1 vs 2); b.big wins with the "
                          "larger predicted uplift (48.0% vs 12.0% of the step)"]
    assert cs.changes == {"dataloader_workers": 2} and cs.owner == {"dataloader_workers": "b.big"}
    assert cs.applied[0].changes == {"dataloader_workers": {"from": 0, "to": 2}}
    # rule_consistency: 1 applied of 2 agreeing; one rule per bucket, so no overlap
    assert cs.rule_consistency == pytest.approx(0.5) and cs.confidence == pytest.approx(0.5)
    assert cs.recoverable == pytest.approx(0.8 * 0.6)
    assert cs.expected_speedup_high == pytest.approx(1 / (1 - 0.48))
    assert cs.expected_speedup_low == pytest.approx(1 / (1 - 0.24))


def test_superseded_rule_loses_its_condition_to_a_higher_uplift_change():
    bf16 = _rule("p.bf16", {"precision": "bf16"}, 0.9, bucket="precision_path", detect=["config.precision == fp32"])
    tf32 = _rule("p.tf32", {}, 0.5, bucket="precision_path", detect=["config.precision == fp32"],
                 env={"TORCH_ALLOW_TF32": "1"})
    cs = _resolve([tf32, bf16])
    (s,) = cs.outcomes("superseded")
    assert (s.rule_id, s.winner, s.on, s.condition) == ("p.tf32", "p.bf16", "precision", "config.precision == fp32")
    assert s.reason.startswith("superseded by p.bf16: after its change (precision 'fp32' -> 'bf16') "
                               "`config.precision == fp32` no longer holds; p.bf16 wins")
    assert cs.env == {} and cs.changes == {"precision": "bf16"}
    assert cs.rule_consistency == pytest.approx(0.5)      # superseded counts as a conflict


def test_excluded_rule_is_dropped_with_its_reason_and_the_rest_re_resolved():
    rules = [_rule("a.small", {"dataloader_workers": 1}, 0.2), _rule("b.big", {"dataloader_workers": 2}, 0.8)]
    why = "patched run failed: ValueError: Your setup doesn't support bf16/gpu."
    cs = _resolve(rules, exclude={"b.big": why, "not.fired": "ignored"})
    assert cs.dropped == [f"b.big: {why}"]
    (e,) = cs.outcomes("excluded")
    assert (e.rule_id, e.reason) == ("b.big", why)
    # without the winner, a.small no longer conflicts: it is applied, and nothing counts as a conflict
    assert [a.rule_id for a in cs.applied] == ["a.small"] and cs.changes == {"dataloader_workers": 1}
    assert cs.rule_consistency == pytest.approx(1.0)
    # the same from the set itself, and from its JSON form (what Patch.change_set holds)
    full = _resolve(rules)
    again = ChangeSet.model_validate(full.model_dump(mode="json")).without({"b.big": why})
    assert again.dropped == cs.dropped and again.changes == cs.changes and again.excluded == {"b.big": why}
    assert full.excluded == {}                               # without() returns a new set


def test_companion_edit_for_dynamic_padding():
    cs = _resolve([_rule("data.dynamic_padding", {"padding": "dynamic"}, 0.5, bucket="useful")])
    (c,) = cs.companions
    assert (c.field, c.value, c.template) == ("padding", "dynamic", "DataCollatorWithPadding({tokenizer})")
    assert c.import_line == "from transformers import DataCollatorWithPadding"
    assert ("data_collator" in dict((kw, p) for p, kw in c.consumers)) and "DataCollatorWithPadding" in c.met_by


def test_satisfied_not_applicable_and_env_rules():
    rules = [_rule("s.same", {"dataloader_workers": 0}, 0.3),
             _rule("n.unknown", {"dataloader_workers": "=cores - lora_rank"}, 0.2),   # lora_rank is null
             _rule("e.env", {}, 0.1, env={"OMP_NUM_THREADS": "=1"}, unset_env=["HIP_LAUNCH_BLOCKING"]),
             _rule("w.workers", {"dataloader_workers": "=max(1, cores - 1)"}, 0.05)]
    cs = _resolve(rules)
    out = {d.rule_id: d.outcome for d in cs.decisions}
    assert out == {"s.same": "satisfied", "n.unknown": "not_applicable", "e.env": "applied", "w.workers": "applied"}
    assert cs.dropped[0] == "s.same: the config already has the values this rule sets"
    assert cs.dropped[1].startswith("n.unknown: transform not applicable (")
    assert cs.changes == {"dataloader_workers": 3}              # cores 4 - 1
    assert cs.env == {"OMP_NUM_THREADS": "=1"} and cs.unset_env == ["HIP_LAUNCH_BLOCKING"]
    assert cs.owner["env.HIP_LAUNCH_BLOCKING"] == "e.env"
    assert cs.applied[0].changes == {"env.OMP_NUM_THREADS": {"to": "=1"}, "env.HIP_LAUNCH_BLOCKING": {"to": None}}
    assert [d.fields for d in cs.decisions if d.outcome == "applied"] == [{}, {"dataloader_workers": 3}]


def test_propose_patch_is_resolve_then_write_and_carries_the_set(tmp_path):
    root = WORKLOADS / "digits_mlp"
    cfg = parse_config(root / "train.py")
    rules = [_rule("a.small", {"dataloader_workers": 1}, 0.2), _rule("b.big", {"dataloader_workers": 2}, 0.8)]
    kb = KnowledgeBase(rules=rules, path=Path("mem"), sha256="x")
    p = propose_patch(cfg, kb, _matches(rules), _run(), cores=2, workload_root=root)
    cs = resolve_changes(cfg, kb, _matches(rules), _run(), cores=2)
    assert write_changes(cfg, cs, workload_root=root) == p
    assert ChangeSet.model_validate(p.change_set) == cs
    assert p.dropped == cs.dropped and p.confidence == cs.confidence and p.new_config == cs.new_config


def test_a_rule_the_file_cannot_carry_is_dropped_and_the_set_re_resolved():
    """digits_mlp has no from_pretrained call: attention_impl cannot be written there."""
    root = WORKLOADS / "digits_mlp"
    cfg = parse_config(root / "train.py")
    rules = [_rule("x.attn", {"attention_impl": "sdpa", "dataloader_workers": 4}, 0.9),
             _rule("y.workers", {"dataloader_workers": 2}, 0.5)]
    kb = KnowledgeBase(rules=rules, path=Path("mem"), sha256="x")
    cs = resolve_changes(cfg, kb, _matches(rules), _run(), cores=2)
    assert [d.outcome for d in cs.decisions] == ["applied", "conflict"]    # on paper, x.attn wins
    p = write_changes(cfg, cs, workload_root=root)
    assert p.dropped[0].startswith("x.attn: cannot edit the file (no place to write attention_impl")
    assert [a.rule_id for a in p.applied] == ["y.workers"] and p.new_config["dataloader_workers"] == 2
    assert '+    parser.add_argument("--num-workers", type=int, default=2)' in p.diff
    assert p.rule_consistency == pytest.approx(1.0)   # re-resolved: y.workers no longer conflicts with anything
    assert p.change_set["excluded"] == {"x.attn": p.dropped[0].removeprefix("x.attn: ")}


def test_a_warning_that_states_its_remedy_becomes_the_rules_change():
    """config.warning_states_its_remedy ("*": "=warned"): each ConfigDict field a warning of the run names is
    set to the value it names, converted like the parser's value ("2" -> 2); a remedy for a field the patch
    cannot write stays out; with no such warning the rule is not applicable, never a guess."""
    from goblin_assets.contracts import Invariant
    from goblin_assets.kb.rules import load_kb
    from goblin_assets.measure.invariants import warning_remedies

    kb = load_kb()
    rule = kb.by_id["config.warning_states_its_remedy"]
    text = ("This DataLoader will create 8 worker processes in total. Our suggested max number of worker in "
            "current system is 2, which is smaller than what this DataLoader is going to create.")
    remedies = warning_remedies([("dataloader.py:1", text), ("w.py:3", "setting `use_cache=False`")])
    assert [(r["field"], r["value"], r["patchable"]) for r in remedies] == [
        ("dataloader_workers", "2", True), (None, "False", False)]
    fired = Invariant(id="warning_remedy", status="fired", value=1.0,
                      evidence={"remedies": [r for r in remedies if r["patchable"]]})
    run = _run().model_copy(update={"invariants": [fired]})
    one = KnowledgeBase(rules=[rule], path=Path("mem"), sha256="x")
    cs = resolve_changes(CFG.model_copy(update={"dataloader_workers": 8}), one, _matches([rule]), run, cores=4)
    assert cs.changes == {"dataloader_workers": 2}
    assert cs.applied[0].changes == {"dataloader_workers": {"from": 8, "to": 2}}
    # no warning named a value: not applicable, with the reason
    cs = resolve_changes(CFG, one, _matches([rule]), _run(), cores=4)
    (d,) = cs.decisions
    assert d.outcome == "not_applicable" and "no warning of the run names a value" in d.reason
