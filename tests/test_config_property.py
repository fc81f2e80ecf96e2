"""Property: a TrainingArguments keyword set written as Python, JSON or YAML parses back the same."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goblin_assets.config.parse import parse_config

#: TrainingArguments keyword -> (ConfigDict field, strategy)
KEYWORDS = {
    "per_device_train_batch_size": ("batch_size", st.integers(1, 1024)),
    "gradient_accumulation_steps": ("grad_accum_steps", st.integers(1, 256)),
    "learning_rate": ("lr", st.floats(1e-8, 1.0, allow_nan=False, allow_infinity=False)),
    "warmup_steps": ("warmup_steps", st.integers(0, 100_000)),
    "dataloader_num_workers": ("dataloader_workers", st.integers(0, 64)),
    "gradient_checkpointing": ("gradient_checkpointing", st.booleans()),
    "optim": ("optimizer", st.sampled_from(["adamw_torch", "adamw_torch_fused", "adafactor", "sgd",
                                            "paged_adamw_8bit", "adamw_bnb_8bit"])),
    "max_seq_length": ("seq_len", st.integers(16, 131_072)),
    "model_name_or_path": ("model_name", st.sampled_from(["gpt2", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B"])),
}
#: What the HF defaults give for a missing keyword (config_formats.md).
DEFAULTS = {"batch_size": 8, "grad_accum_steps": 1, "lr": 5e-5, "warmup_steps": 0, "dataloader_workers": 0,
            "gradient_checkpointing": False, "seq_len": None, "model_name": None, "lora_rank": None,
            "optimizer": None}

kwargs_strategy = st.fixed_dictionaries(
    {},
    optional={k: s for k, (_, s) in KEYWORDS.items()},
).flatmap(lambda kw: st.sampled_from(["none", "fp16", "bf16", "fp16_false", "bf16_false"]).map(
    lambda p: _with_precision(kw, p)))


def _with_precision(kw: dict, choice: str) -> dict:
    kw = dict(kw)
    if choice in ("fp16", "bf16"):
        kw[choice] = True
    elif choice.endswith("_false"):
        kw[choice.split("_")[0]] = False
    return kw


def _expected(kw: dict) -> dict:
    out = dict(DEFAULTS)
    for key, value in kw.items():
        if key in KEYWORDS:
            out[KEYWORDS[key][0]] = value
    out["precision"] = "fp16" if kw.get("fp16") else "bf16" if kw.get("bf16") else "fp32"
    return out


def _python(kw: dict) -> str:
    args = "".join(f"    {k}={v!r},\n" for k, v in kw.items())
    return f'from transformers import TrainingArguments\n\nargs = TrainingArguments(\n    output_dir="out",\n{args})\n'


WRITERS = {
    "train.py": _python,
    "args.json": lambda kw: json.dumps({"output_dir": "out", **kw}, indent=2),
    "args.yaml": lambda kw: yaml.safe_dump({"output_dir": "out", **kw}, sort_keys=False),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs_strategy)
def test_roundtrip(kw: dict):
    want = _expected(kw)
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in WRITERS.items():
            folder = Path(tmp) / name.replace(".", "_")
            folder.mkdir()
            path = folder / name
            path.write_text(write(kw))
            cfg = parse_config(path)
            for field_name, value in want.items():
                got = getattr(cfg, field_name)
                if isinstance(value, float):
                    assert got is not None and math.isclose(got, value, rel_tol=1e-12), (name, field_name, got, value)
                else:
                    assert got == value and type(got) is type(value), (name, field_name, got, value, kw)
                prov = cfg.provenance[field_name]
                if field_name in (KEYWORDS.get(k, ("",))[0] for k in kw):
                    assert prov.kind == "literal" and prov.span is not None, (name, field_name, prov)
