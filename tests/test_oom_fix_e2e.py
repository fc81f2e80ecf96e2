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
