"""Validate before you benchmark: the patched program runs one step; culprit rules are dropped with its error line."""
from __future__ import annotations

from pathlib import Path

from goblin_assets.audit.config import parse_config
from goblin_assets.audit.kb import KnowledgeBase
from goblin_assets.audit.session import AuditSession
from goblin_assets.contracts import Citation, Fix, Rule, RuleMatch, RunMetrics, RunProvenance, WasteBucket
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
