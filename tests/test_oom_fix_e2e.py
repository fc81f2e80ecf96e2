"""A shipped workload that runs out of memory as configured: the report names the phase and the largest
consumers, proposes a split of the micro-batch that keeps the global batch, and the patched program runs
under the same cap.

tests/data/docstring_lm_oom under the cap the README documents (``GOBLIN_RUNNER_MEM_CAP_GB=1.5``): its logits
over MiniLM's 30,522-token vocabulary need about 1 GB at the configured micro-batch of 32 sequences.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from goblin_assets.audit.session import AuditSession
from goblin_assets.errors import RunFailed
from goblin_assets.runners.workload import load_workload
from goblin_assets.settings import AuditSettings

WORKLOAD = Path(__file__).resolve().parent / "data" / "docstring_lm_oom"
#: The cap README.md documents for this workload (GiB, RLIMIT_AS as LocalRunner applies it).
CAP_GB = 1.5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def oom_audit(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("oom_home")))
    try:
        st = AuditSettings(kind="local", device="cpu", mem_cap_gb=CAP_GB, warmup_steps=1, profiled_steps=2)
        s = AuditSession.open(load_workload(WORKLOAD), settings=st)
        with pytest.raises(RunFailed) as err:
            s.profile_run()
        yield s, str(err.value), s.report_path.read_text(encoding="utf-8")
    finally:
        mp.undo()


def test_the_report_names_the_phase_and_the_largest_consumers(oom_audit):
    s, err, report = oom_audit
    assert "ran out of memory in step 1 (warm-up), during backward" in err
    assert "## Out of memory" in report
    assert "The original ran out of memory in optimizer step 1, during backward, at train.py:" in report
    # the logits (32 x 64 x 30,522 fp32 = 250 MB), then MiniLM's frozen word embeddings (30,522 x 384 fp32)
    assert "largest tensor: other live tensor [32, 64, 30522] float32, 250.04 MB" in report
    assert "largest tensor: parameter (frozen) [30522, 384] float32, 46.88 MB" in report
    assert "- weights (frozen): 46.88 MB" in report
    state = s.results["oom_state"]
    assert state["phase"] == "backward" and state["census"]["frozen_params"] == 30522 * 384


def test_the_fix_keeps_the_global_batch_and_runs_under_the_same_cap(oom_audit):
    s, _, report = oom_audit
    fix = s.results["oom_fix"]
    mb, ga = fix["change"]["batch_size"], fix["change"]["grad_accum_steps"]
    assert mb < 32 and mb * ga == 32 == fix["global_batch_before"] == fix["global_batch_after"]
    assert f'default={mb})' in fix["diff"] and f'default={ga})' in fix["diff"]
    assert fix["predicted_peak_bytes"] < fix["budget_bytes"] < fix["predicted_peak_bytes_before"]
    assert fix["ok"], fix["failure"]
    assert fix["samples_per_sec"] > 0
    assert f"**original: out of memory at step 1 (backward); patched: ran, {fix['samples_per_sec']:.2f} samples/s**" \
        in report
    assert "global batch 32 -> 32" in report
    assert "KB rule `memory.oom_split_micro_batch` (Hugging Face Transformers: GPU training" in report
    # the patched run ran under the same runner, so under the same address-space cap
    assert s.runner.mem_cap_gb == CAP_GB


DEEP = Path(__file__).resolve().parent / "data" / "deep_mlp_oom"


@pytest.fixture(scope="module")
def deep_audit(tmp_path_factory):
    """tests/data/deep_mlp_oom under the same cap: one 8192-position sequence through 12 residual MLP blocks
    keeps ~0.9 GB of activations, and its micro-batch is already 1."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("deep_home")))
    try:
        st = AuditSettings(kind="local", device="cpu", mem_cap_gb=CAP_GB, warmup_steps=1, profiled_steps=2)
        s = AuditSession.open(load_workload(DEEP), settings=st)
        with pytest.raises(RunFailed):
            s.profile_run()
        yield s, s.report_path.read_text(encoding="utf-8")
    finally:
        mp.undo()


def test_when_no_split_can_help_checkpointing_is_written_and_runs_under_the_same_cap(deep_audit):
    s, report = deep_audit
    cfg = s.training_config()
    # the checkpoint(...) call runs only when the flag is set: the flag's default decides, not the call's presence
    assert cfg.gradient_checkpointing is False and cfg.batch_size == 1
    fix = s.results["oom_fix"]
    assert fix["lever"] == "gradient_checkpointing" and fix["rule"] == "memory.oom_gradient_checkpointing"
    assert fix["change"] == {"gradient_checkpointing": True}
    assert '"--gradient-checkpointing", action="store_true", default=True)' in fix["diff"]
    assert fix["global_batch_before"] == fix["global_batch_after"] == 1
    # the probes run with the cap lifted (they measure; the cap is the budget): even one sequence is over it
    assert "no micro-batch split of the configured batch fits the budget (micro-batch 1: predicted peak" \
        in fix["why_not_split"]
    assert fix["ok"], fix["failure"]
    assert fix["samples_per_sec"] > 0 and fix["predicted_peak_bytes"] is None
    assert "Turn on gradient checkpointing: gradient_checkpointing=True" in report
    assert "**original: out of memory at step 1 (forward" in report
    assert f"patched: ran, {fix['samples_per_sec']:.2f} samples/s**" in report
    doc = s.failure_json()
    assert doc["oom_fix"]["lever"] == "gradient_checkpointing" and doc["oom_fix"]["ok"]
    assert "memory.oom_gradient_checkpointing" in doc["fired_rules"]
    assert "the runner's address-space cap" in doc["failure"]
    from goblin_assets.cli import _plain_summary

    lines = _plain_summary(s, None)   # what goblin audit prints: the verdict first, then the validated fix
    assert lines[0].startswith("verdict: the original program failed as written (out of memory)")
    assert lines[1] == (f"fix: gradient_checkpointing=True (global batch 1 -> 1): ran under the same memory limit, "
                        f"{fix['samples_per_sec']:.2f} samples/s")
    rows = s.failure_rows()["run_failures"]
    assert rows.fix_ran[0] and rows.oom_phase[0].startswith("forward") and rows.oom_step[0] == 1


ADAM = Path(__file__).resolve().parent / "data" / "adam_state_oom"


@pytest.fixture(scope="module")
def adam_audit(tmp_path_factory):
    """tests/data/adam_state_oom under the same cap: AdamW's two fp32 states per parameter (268 MB for 34M
    parameters) are made at the first optimizer step and do not fit beside the weights and gradients."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("adam_home")
    mp.setenv("GOBLIN_HOME", str(home))
    try:
        st = AuditSettings(kind="local", device="cpu", mem_cap_gb=CAP_GB, warmup_steps=1, profiled_steps=2)
        s = AuditSession.open(load_workload(ADAM), settings=st)
        with pytest.raises(RunFailed):
            s.profile_run()
        yield s, s.report_path.read_text(encoding="utf-8"), home
    finally:
        mp.undo()


def test_an_oom_in_the_optimizer_step_is_fixed_by_a_lower_memory_optimizer_under_the_same_cap(adam_audit):
    s, report, home = adam_audit
    state = s.results["oom_state"]
    assert state["phase"] == "optimizer step" and state["census"]["optimizer_state_bytes"] > 0
    fix = s.results["oom_fix"]
    # no bitsandbytes here: Adafactor (torch.optim, torch >= 2.5) is the lower-memory optimizer the stack has
    assert fix["lever"] == "optimizer" and fix["rule"] == "memory.oom_lower_memory_optimizer"
    assert fix["change"] == {"optimizer": "adafactor"} and fix["optimizer"] == "adamw_torch"
    assert "+    opt = torch.optim.Adafactor(model.parameters(), lr=args.lr, weight_decay=0.01)" in fix["diff"]
    assert fix["global_batch_before"] == fix["global_batch_after"] == 8
    assert "inside the optimizer step" in fix["why_not_split"]
    assert fix["ok"], fix["failure"]
    assert fix["samples_per_sec"] > 0
    assert "Use a lower-memory optimizer: optimizer=adafactor (was adamw_torch)" in report
    assert "This changes the update rule: compare the loss curves" in report
    assert f"**original: out of memory at step 1 (optimizer step); patched: ran, {fix['samples_per_sec']:.2f} " \
           "samples/s**" in report
    assert "KB rule `memory.oom_lower_memory_optimizer` (Adafactor: Adaptive Learning Rates" in report
    doc = s.failure_json()
    assert doc["oom_fix"]["lever"] == "optimizer" and doc["oom_fix"]["ok"]
    assert "memory.oom_lower_memory_optimizer" in doc["fired_rules"]
    # the split and checkpointing were never run: they cannot shrink what the optimizer step allocates
    runs = sorted(p.name for p in home.rglob("*-oom-fix*") if p.is_dir())
    assert len(runs) == 1 and "-oom-fix-adafactor-" in runs[0], runs
    assert not list(home.rglob("*-fit-b*")), "no memory probe runs: the split was not tried"
