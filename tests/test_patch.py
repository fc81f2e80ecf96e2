"""propose_patch on the real digits script: KB-driven, a diff that git apply / patch -p1 accept."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import RunMetrics, RunProvenance, WasteBucket
from goblin_assets.kb.rules import detect_context, load_kb, match_rules
from goblin_assets.patch.propose import propose_patch
from tests.conftest import WORKLOADS


def _loader_bound_run(cores=2) -> RunMetrics:
    """A RunMetrics shaped like the measured digits profile (93% data wait)."""
    wb = {"useful": WasteBucket(seconds=0.003, status="measured"),
          "data_wait": WasteBucket(seconds=0.068, status="measured"),
          "host_gap": WasteBucket(seconds=0.002, status="measured"),
          "comm_excess": WasteBucket(seconds=0.0, status="measured"),
          "precision_path": WasteBucket(status="not_observable"),
          "kernel_shape": WasteBucket(status="not_observable")}
    return RunMetrics(workload="digits_mlp", steps=10, step_time_s=0.073, waste_budget=wb,
                      attention_kernel_loaded=False,
                      provenance=RunProvenance(kind="measured", device="cpu", cpu_count=cores,
                                               torch_version="2.13.0+cpu"))


@pytest.fixture
def digits_patch(tmp_path):
    cfg = parse_config(WORKLOADS / "digits_mlp" / "train.py")
    kb = load_kb()
    run = _loader_bound_run()
    matches = match_rules(kb, detect_context(cfg, run, env={}, cores=2))
    return cfg, propose_patch(cfg, kb, matches, run, cores=2, workload_root=WORKLOADS / "digits_mlp",
                              out_dir=tmp_path / "out")


def test_kb_rule_sizes_workers_and_threads_together(digits_patch):
    cfg, p = digits_patch
    assert cfg.dataloader_workers == 0 and cfg.intra_op_threads is None
    assert [a.rule_id for a in p.applied] == ["data.loader_workers_with_threads"]
    assert p.new_config["dataloader_workers"] == 2
    assert p.new_config["intra_op_threads"] == 1
    assert "+    parser.add_argument(\"--num-workers\", type=int, default=2)" in p.diff
    assert "+torch.set_num_threads(1)" in p.diff
    assert p.applied[0].citation.url.startswith("https://")
    assert 1.0 < p.expected_speedup_low <= p.expected_speedup_high
    assert 0 < p.confidence <= 1


def test_diff_applies_with_git_apply_and_patch(digits_patch, tmp_path):
    _, p = digits_patch
    for tool in (["git", "apply"], ["patch", "-p1", "--quiet"]):
        work = tmp_path / tool[0]
        shutil.copytree(WORKLOADS / "digits_mlp", work)
        if tool[0] == "git":
            subprocess.run(["git", "init", "-q"], cwd=work, check=True)
        subprocess.run([*tool], input=p.diff, text=True, cwd=work, check=True)
        assert (work / "train.py").read_text() == (tmp_path / "out" / "workload" / "train.py").read_text()


def test_patched_copy_leaves_the_users_file_alone(digits_patch):
    _, p = digits_patch
    original = (WORKLOADS / "digits_mlp" / "train.py").read_text()
    assert "set_num_threads" not in original
    assert p.patched_file and "torch.set_num_threads(1)" in open(p.patched_file).read()


def test_no_rule_fires_when_loader_is_not_the_bottleneck(tmp_path, plain_host):
    cfg = parse_config(WORKLOADS / "digits_mlp" / "train.py")
    run = _loader_bound_run()
    run.waste_budget["data_wait"].seconds = 0.001
    run.waste_budget["useful"].seconds = 0.070
    kb = load_kb()
    matches = match_rules(kb, detect_context(cfg, run, env={}, cores=2))
    assert not [m for m in matches if m.fired]
    p = propose_patch(cfg, kb, matches, run, cores=2, workload_root=WORKLOADS / "digits_mlp")
    assert p.diff == "" and p.applied == [] and p.expected_speedup_high == 1.0
