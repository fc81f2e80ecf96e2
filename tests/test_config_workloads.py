"""parse_config on the project's own workloads (workloads/*/train.py)."""
from __future__ import annotations

from pathlib import Path

from goblin_assets.config.parse import parse_config

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"


def _span_text(path: Path, span) -> str:
    l0, c0, l1, c1 = span
    assert l0 == l1
    return path.read_text().split("\n")[l0 - 1][c0:c1]


def test_digits_mlp():
    path = WORKLOADS / "digits_mlp" / "train.py"
    cfg = parse_config(path)
    p = cfg.provenance
    lines = path.read_text().split("\n")

    assert cfg.batch_size == 64 and p["batch_size"].kind == "default"
    assert _span_text(path, p["batch_size"].span) == "64"
    assert '"--batch-size"' in lines[p["batch_size"].span[0] - 1]

    assert cfg.dataloader_workers == 0 and p["dataloader_workers"].kind == "default"
    assert _span_text(path, p["dataloader_workers"].span) == "0"
    assert '"--num-workers"' in lines[p["dataloader_workers"].span[0] - 1]

    assert cfg.lr == 0.05 and _span_text(path, p["lr"].span) == "0.05"
    assert cfg.optimizer == "sgd"
    assert cfg.precision == "fp32" and p["precision"].kind == "inferred"
    assert cfg.grad_accum_steps == 1 and p["grad_accum_steps"].kind == "inferred"
    assert cfg.intra_op_threads is None
    assert p["intra_op_threads"].detail == "not set: torch default, one intra-op thread per core"
    assert cfg.attention_impl in ("unknown", None)
    # The MLP is built in code: no model id, and the reason says what was looked for.
    assert cfg.model_name is None and p["model_name"].kind == "unset" and p["model_name"].detail
    assert cfg.gradient_checkpointing is False
    assert cfg.lora_rank is None
    assert cfg.source_format == "python:torch"


def test_every_workload_parses():
    for script in sorted(WORKLOADS.glob("*/train.py")):
        cfg = parse_config(script)
        assert cfg.batch_size is not None, script
