"""Validate before you benchmark: the patched program runs one step; culprit rules are dropped with its error line."""
from __future__ import annotations

from pathlib import Path

from goblin_assets.audit.session import AuditSession
from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import Citation, Fix, Rule, RuleMatch, RunMetrics, RunProvenance, WasteBucket
from goblin_assets.kb.rules import KnowledgeBase
from goblin_assets.runners.result import RawRun
from goblin_assets.runners.workload import load_workload
from goblin_assets.settings import AuditSettings

SCRIPT = """import torch
from torch.utils.data import DataLoader

torch.set_num_threads(4)
loader = DataLoader(list(range(64)), batch_size=32, num_workers=0)
"""


def _rule(rid: str, config: dict, recovery: float) -> Rule:
    return Rule(id=rid, category="data", platforms=["cpu"], symptom="s", detect=["cores > 0"], fix=Fix(config=config),
                targets_bucket="data_wait", recovery_fraction=recovery, expected_impact="e",
                citation=Citation(title="t", section="s", url="https://example.org"))


class BreaksOn:
    """A runner whose child fails when the script it runs contains ``marker`` (and records what it ran)."""

    kind = "local"

    def __init__(self, marker: str, tmp: Path):
        self.marker, self.tmp, self.ran = marker, tmp, []

    def run(self, workload, mode, steps, warmup=2, script=None, env=None, unset_env=None, tap=None, label=""):
        text = Path(script).read_text()
        self.ran.append((mode, steps, warmup, label, text))
        if self.marker in text:
            return RawRun(ok=False, run_dir=self.tmp, mode=mode, returncode=1,
                          failure="train.py: exited with code 1: ValueError: two workers are not allowed here")
        return RawRun(ok=True, run_dir=self.tmp, mode=mode)

    def fold_metrics(self, raw, metrics):
        return None


def _session(tmp_path: Path, runner) -> AuditSession:
    wl_dir = tmp_path / "wl"
    wl_dir.mkdir()
    (wl_dir / "train.py").write_text(SCRIPT)
    (wl_dir / "workload.yaml").write_text("entry: train.py\n")
    rules = [_rule("data.workers", {"dataloader_workers": 2}, 0.8),
             _rule("data.threads", {"intra_op_threads": 1}, 0.3)]
    kb = KnowledgeBase(rules=rules, path=Path("mem"), sha256="x")
    run = RunMetrics(workload="wl", steps=3, step_time_s=1.0, provenance=RunProvenance(kind="measured"),
                     waste_budget={"useful": WasteBucket(seconds=0.4, status="measured"),
                                   "data_wait": WasteBucket(seconds=0.6, status="measured")})
    wl = load_workload(wl_dir)
    return AuditSession.open(wl, settings=AuditSettings(), runner=runner, kb=kb, out_dir=tmp_path / "out",
                             training_config=parse_config(wl.config_file), profile_run=run,
                             kb_matches=[RuleMatch(rule_id=r.id, fired=True, detect_score=1.0) for r in rules])


def test_the_culprit_is_dropped_with_the_childs_error_line_and_the_rest_kept(tmp_path):
    runner = BreaksOn("num_workers=2", tmp_path)
    s = _session(tmp_path, runner)
    p = s.patch()
    assert [a.rule_id for a in p.applied] == ["data.threads"]
    assert p.dropped == ["data.workers: dropped: the patched program failed in this environment "
                         "(train.py: exited with code 1: ValueError: two workers are not allowed here)"]
    assert "num_workers=2" not in Path(p.patched_file).read_text() and "set_num_threads(1)" in p.diff
    # both, each rule alone, then what survives: every run is one step with no warm-up, never a benchmark
    runs = s.results["patch_validation"]
    assert [(r["rules"], r["ok"]) for r in runs] == [
        (["data.workers", "data.threads"], False), (["data.workers"], False), (["data.threads"], True),
        (["data.threads"], True)]
    assert {(mode, steps, warmup, label) for mode, steps, warmup, label, _ in runner.ran} == {
        ("benchmark", 1, 0, "validate")}
    assert (s.out_dir / "patch.diff").read_text() == p.diff


def test_a_patch_that_runs_is_validated_once(tmp_path):
    runner = BreaksOn("never in the file", tmp_path)
    s = _session(tmp_path, runner)
    assert [a.rule_id for a in s.patch().applied] == ["data.workers", "data.threads"]
    assert len(runner.ran) == 1 and s.patch().dropped == []


TRAINER = """from transformers import Trainer, TrainingArguments

args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=2e-5)
trainer = Trainer(model=None, args=args)
"""


def _bf16_rule():
    from goblin_assets.contracts import KeywordEdit

    return Rule(id="precision.cpu_bf16", category="precision", platforms=["cpu"], symptom="s", detect=["cores > 0"],
                fix=Fix(config={"precision": "bf16"}, keywords=[KeywordEdit(
                    call="<args>", signature="transformers.TrainingArguments", names=["use_cpu", "no_cuda"],
                    value=True)]),
                targets_bucket="useful", recovery_fraction=0.3, expected_impact="e",
                citation=Citation(title="t", section="s", url="https://example.org"))


def _bf16_patch(tmp_path: Path, text: str, signatures):
    from goblin_assets.patch.propose import propose_patch

    f = tmp_path / "train.py"
    f.write_text(text)
    rule = _bf16_rule()
    run = RunMetrics(workload="wl", steps=3, step_time_s=1.0, provenance=RunProvenance(kind="measured"),
                     waste_budget={"useful": WasteBucket(seconds=1.0, status="measured")})
    return propose_patch(parse_config(f), KnowledgeBase(rules=[rule], path=Path("mem"), sha256="x"),
                         [RuleMatch(rule_id=rule.id, fired=True, detect_score=1.0)], run, cores=2, source=f,
                         signatures=signatures)


def test_a_fix_writes_the_keyword_the_installed_library_accepts(tmp_path):
    new = _bf16_patch(tmp_path, TRAINER, lambda d: ["output_dir", "bf16", "use_cpu", "no_cuda"])
    assert "+    output_dir=\"out\"" not in new.diff and "bf16=True" in new.diff and "use_cpu=True" in new.diff
    old = _bf16_patch(tmp_path, TRAINER, lambda d: ["output_dir", "bf16", "no_cuda"])   # transformers < 4.34
    assert "no_cuda=True" in old.diff and "use_cpu" not in old.diff
    already = _bf16_patch(tmp_path, TRAINER.replace("learning_rate=2e-5", "learning_rate=2e-5, use_cpu=False"),
                          lambda d: ["bf16", "use_cpu"])
    assert "-args = TrainingArguments(" in already.diff and already.diff.count("use_cpu=True") == 1


def test_a_fix_the_library_cannot_take_is_dropped_with_the_reason_never_written_blind(tmp_path):
    none = _bf16_patch(tmp_path, TRAINER, lambda d: ["bf16"])
    assert none.applied == [] and none.diff == ""
    assert "the installed transformers.TrainingArguments accepts none of use_cpu, no_cuda" in none.dropped[0]
    unknown = _bf16_patch(tmp_path, TRAINER, lambda d: None)        # transformers not importable there
    assert unknown.applied == [] and "cannot be inspected in the job's interpreter" in unknown.dropped[0]
    # a script that builds no TrainingArguments needs no keyword: nothing is asked of the library
    raw = "import torch\nprecision = 'fp32'\nmodel = torch.nn.Linear(2, 2)\n"
    asked = []
    _bf16_patch(tmp_path, raw, lambda d: asked.append(d) or None)
    assert asked == []


def test_a_patch_that_crashes_the_real_script_is_dropped_and_the_rest_benchmarked(tmp_path, goblin_home, capsys):
    """goblin audit with a rule the installed torch rejects (a negative learning rate): exit 0, the rule dropped
    with the child's own error line, the other rule validated and benchmarked, the report lists both."""
    import json
    import shutil

    import yaml

    from goblin_assets.cli import main
    from tests.conftest import WORKLOADS

    wl = tmp_path / "digits"
    shutil.copytree(WORKLOADS / "digits_mlp", wl, ignore=shutil.ignore_patterns("__pycache__"))
    rule = {"category": "optimizer", "platforms": ["cpu"], "symptom": "s", "detect": ["cores > 0"],
            "targets_bucket": "useful", "expected_impact": "e",
            "citation": {"title": "t", "section": "s", "url": "https://example.org"}}
    kb = tmp_path / "rules.yaml"
    kb.write_text(yaml.safe_dump({"rules": [
        {**rule, "id": "test.smaller_batch", "fix": {"config": {"batch_size": 32}}, "recovery_fraction": 0.2},
        {**rule, "id": "test.negative_lr", "fix": {"config": {"lr": -1.0}}, "recovery_fraction": 0.5}]}))
    assert main(["audit", str(wl), "--kb", str(kb), "--steps", "2", "--bench-steps", "4", "--repeats", "1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rules"] == ["test.smaller_batch"]
    # (a patch measured slower would add "not recommended" lines: a timing outcome, not this test's subject)
    (dropped,) = [d for d in doc["dropped_rules"] if ": not recommended: " not in d]
    assert dropped.startswith("test.negative_lr: dropped: the patched program failed") and "-1.0" in dropped
    assert "ValueError" in dropped
    assert doc["benchmark"]["patched"]["median"] > 0 and "default=32" in doc["diff"]
    report = Path(doc["report_path"]).read_text()
    assert "test.negative_lr" in report and "ValueError" in report
