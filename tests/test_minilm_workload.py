"""End to end: profile the Hugging Face Trainer + LoRA workload (real MiniLM weights, real text)."""
from __future__ import annotations

import pytest

from goblin_assets import REPO_ROOT
from goblin_assets.audit.profile import profile_run
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload


@pytest.mark.slow
def test_minilm_lora_cls_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path))
    wl = load_workload(REPO_ROOT / "workloads" / "minilm_lora_cls")
    m = profile_run(wl, LocalRunner(device="cpu", timeout_s=300), steps=2, warmup=1)
    assert m.ok, (m.failure, m.stderr_tail)
    assert m.provenance.kind == "measured"
    assert m.steps == 2
    assert m.unit == "tokens"
    # tokens come from the real input_ids the Trainer's (accelerate-wrapped) DataLoader yields
    assert m.tokens_per_sec and m.tokens_per_sec > 0
    assert m.samples_per_step == 8
    assert 0.1 < m.padding_share < 0.7
    assert m.attention_kernel_loaded is False  # attn_implementation="eager"
    total = sum(b.seconds for b in m.waste_budget.values())
    assert total == pytest.approx(m.step_time_s, rel=0.05)
    assert m.trace_path and (tmp_path / "runs").is_dir()
