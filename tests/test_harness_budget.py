"""The harness's step budget reaches into HF TrainingArguments (max_steps) without editing the script."""
from __future__ import annotations

import textwrap

from goblin_assets.runners.harness import MAX_PREFETCH_WARMUP
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload

SCRIPT = """\
    import sys
    import torch
    from transformers import TrainingArguments

    long = TrainingArguments(output_dir="out", max_steps=1000, report_to=[])
    short = TrainingArguments(output_dir="out", max_steps=2, report_to=[])
    epochs = TrainingArguments(output_dir="out", num_train_epochs=3, report_to=[])
    print("max_steps", long.max_steps, short.max_steps, epochs.max_steps, file=sys.stderr)
    w = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(100):
        w.grad = torch.ones(3)
        opt.step()
    """


def test_trainer_max_steps_is_capped_to_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    script = tmp_path / "hf_args.py"
    script.write_text(textwrap.dedent(SCRIPT))
    raw = LocalRunner(device="cpu", timeout_s=120).run(load_workload(script), "benchmark", steps=2, warmup=1)
    assert raw.ok, raw.failure
    # warm-up 1 + 2 measured steps, plus room for the steps that drain a DataLoader's prefetch queue
    # (harness.MAX_PREFETCH_WARMUP; none are taken here: no DataLoader); a script's own smaller max_steps is kept
    cap = 1 + 2 + MAX_PREFETCH_WARMUP
    assert f"max_steps {cap} 2 {cap}" in raw.stderr_tail
    assert len(raw.result.per_step) == 2
    assert all(p.batches == 0 for p in raw.result.per_step)  # no DataLoader in this script
