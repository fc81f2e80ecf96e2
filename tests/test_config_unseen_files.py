"""The parser on files nobody here wrote.

One test per mechanism, on small inputs written here (the cases with
expected values are in tests/data/configs, held-out ones in
tests/data/configs/heldout): format detection with a confidence and an
explicit ``unknown`` (no defaults, no patch), TOML, launch line + script,
entry-function signatures (fire / typer / click / Fabric ``setup``),
branches under default values, guarded optimizer steps, library-default
sets keyed by class, the attention transformers picks, accumulation from a
DeepSpeed global batch, and the redactor's treatment of ordinary words.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import class_chain, tool_defaults
from goblin_assets.config.parse import config_to_json, detect_format, parse_config
from goblin_assets.errors import PatchError
from goblin_assets.patch.propose import edit_source, write_changes
from goblin_assets.redact import redact, secret_shaped, shannon_entropy
from tests.test_changeset import _resolve, _rule
from tests.test_redact import SECRETS


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).write_text(text)
    return root / next(iter(files))


# ------------------------------------------------------------------ formats

@pytest.mark.parametrize("name,text,fmt", [
    ("x.cfg", '{"learning_rate": 1e-4, "num_train_epochs": 2}', "json"),
    ("run", "#!/bin/bash\ntorchrun --nproc_per_node 2 train.py --lr 1e-3\n", "shell"),
    ("job", "[training]\nlocal_batch_size = 2\nseq_len = 4096\n", "toml"),
    ("cfg", "learning_rate: 3e-4\nper_device_train_batch_size: 4\n", "yaml"),
    ("train.gin", "include 'base.gin'\ntrain.batch_size = 64\n", "unknown"),
])
def test_detect_format_sniffs_content(tmp_path, name, text, fmt):
    path = tmp_path / name
    path.write_text(text)
    got, confidence = detect_format(path, text)
    assert got == fmt
    assert (confidence == 0.0) == (fmt == "unknown")


def test_unknown_yaml_gets_no_defaults_and_no_patch(tmp_path):
    path = _write(tmp_path, {"hydra.yaml": "runner:\n  precision: 16-mixed\n  max_epochs: 3\n"
                                           "data:\n  batch_size: 48\n  num_workers: 3\n"})
    cfg = parse_config(path)
    assert cfg.source_format == "yaml:unknown" and cfg.format_confidence == 0.0
    assert (cfg.batch_size, cfg.dataloader_workers, cfg.precision) == (48, 3, "fp16")   # read by name
    assert cfg.lr is None and cfg.grad_accum_steps is None and cfg.gradient_checkpointing is None
    assert "no tool's defaults" in cfg.provenance["lr"].detail
    doc = config_to_json(cfg)
    assert doc["format"] == "unknown" and doc["format_confidence"] == 0.0
    with pytest.raises(PatchError, match="does not know this file's format"):
        edit_source(cfg, {"batch_size": 8}, path, packages={})


def test_lightning_yaml_gets_lightnings_own_defaults_only(tmp_path):
    """The same keys under ``trainer:`` are a Lightning Trainer file (issue 27): its own documented defaults."""
    path = _write(tmp_path, {"hydra.yaml": "trainer:\n  precision: 16-mixed\n  max_epochs: 3\n"
                                           "data:\n  batch_size: 48\n  num_workers: 3\n"})
    cfg = parse_config(path)
    assert cfg.source_format == "yaml:lightning" and "'trainer." in cfg.format_reason
    assert (cfg.batch_size, cfg.dataloader_workers, cfg.precision, cfg.grad_accum_steps) == (48, 3, "fp16", 1)
    assert "Lightning Trainer default" in cfg.provenance["grad_accum_steps"].detail
    assert cfg.lr is None and cfg.warmup_steps is None and cfg.optimizer is None   # nothing borrowed
    with pytest.raises(PatchError, match="unknown to its writers"):
        edit_source(cfg, {"batch_size": 8}, path, packages={})


def test_write_changes_drops_every_rule_for_an_unknown_format(tmp_path):
    text = '{"hidden_size": 1024, "num_attention_heads": 16, "num_workers": 0}'
    path = _write(tmp_path, {"model.json": text})
    cfg = parse_config(path)
    rule = _rule("data.workers", {"dataloader_workers": 2}, 0.5)
    patch = write_changes(cfg, _resolve([rule], cfg), path, packages={})
    assert patch.diff == "" and not patch.applied
    assert any("does not know this file's format" in d for d in patch.dropped)
    assert path.read_text() == text


def test_hf_args_json_is_still_hf(tmp_path):
    path = _write(tmp_path, {"args.json": '{"learning_rate": 2e-5, "per_device_train_batch_size": 2}'})
    cfg = parse_config(path)
    assert cfg.source_format == "json:hf" and cfg.grad_accum_steps == 1 and cfg.format_confidence > 0


def test_toml_reads_and_patches_in_place(tmp_path):
    path = _write(tmp_path, {"job.toml": '[optimizer]\nname = "AdamW"\nimplementation = "foreach"\nlr = 2e-4\n'
                                         '[training]\nlocal_batch_size = 3\nseq_len = 1024\n'
                                         '[activation_checkpoint]\nmode = "full"\n'})
    cfg = parse_config(path)
    assert cfg.source_format == "toml:torchtitan"
    assert (cfg.optimizer, cfg.lr, cfg.batch_size, cfg.gradient_checkpointing) == ("adamw_torch", 2e-4, 3, True)
    assert cfg.warmup_steps == 200 and "torchtitan" in cfg.provenance["warmup_steps"].detail
    patched = edit_source(cfg, {"batch_size": 6, "gradient_checkpointing": False}, path, packages={})
    assert "local_batch_size = 6" in patched and 'mode = "none"' in patched


# ------------------------------------------------------------------ launch line + script

def test_launch_flags_override_script_defaults(tmp_path):
    path = _write(tmp_path, {
        "run.sh": "accelerate launch --config_file acc.yaml --num_processes 2 train.py \\\n"
                  "  --learning_rate 3e-5 --batch-size 6\n",
        "acc.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: fp16\n",
        "train.py": "import argparse, torch\nfrom accelerate import Accelerator\n"
                    "from torch.utils.data import DataLoader\n"
                    "p = argparse.ArgumentParser()\np.add_argument('--learning_rate', type=float, default=1e-4)\n"
                    "p.add_argument('--batch-size', type=int, default=32)\na = p.parse_args()\n"
                    "acc = Accelerator()\nm = torch.nn.Linear(2, 2)\n"
                    "opt = torch.optim.AdamW(m.parameters(), lr=a.learning_rate)\n"
                    "for x in DataLoader(range(8), batch_size=a.batch_size):\n    opt.step()\n",
    })
    cfg = parse_config(path)
    assert (cfg.lr, cfg.batch_size, cfg.precision) == (3e-5, 6, "fp16")
    assert cfg.provenance["batch_size"].file == "run.sh" and cfg.provenance["batch_size"].span is not None
    assert "acc.yaml" in cfg.provenance["precision"].detail
    with pytest.raises(PatchError, match="set in run.sh, not in train.py"):
        edit_source(cfg, {"batch_size": 4}, tmp_path / "train.py", packages={})


def test_launch_without_script_beside_is_not_read_as_the_trainer(tmp_path):
    path = _write(tmp_path, {"go.sh": "torchrun --nproc_per_node 8 elsewhere/main.py --batch-size 128\n"})
    cfg = parse_config(path)
    assert cfg.source_format == "shell:unknown"
    assert cfg.batch_size == 128 and cfg.lr is None          # read by name, no TrainingArguments defaults


def test_deepspeed_global_batch_and_gpu_count(tmp_path):
    _write(tmp_path, {"ds.json": '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}'})
    alone = parse_config(tmp_path / "ds.json")
    assert alone.grad_accum_steps is None
    assert "GPU" in alone.provenance["grad_accum_steps"].detail and "16 on 1 GPU" in alone.provenance[
        "grad_accum_steps"].detail
    path = _write(tmp_path, {"launch.sh": "deepspeed --num_gpus 8 train.py --deepspeed ds.json --bf16\n"})
    assert parse_config(path).grad_accum_steps == 2


# ------------------------------------------------------------------ Python: signatures, branches, steps

def test_typer_and_click_defaults(tmp_path):
    typer_cfg = parse_config(_write(tmp_path, {"t.py": (
        "import typer\nfrom typing import Annotated\nfrom transformers import TrainingArguments\n"
        "app = typer.Typer()\n@app.command()\n"
        "def main(bs: int = typer.Option(24, '--bs'), lr: Annotated[float, typer.Option()] = 7e-5):\n"
        "    TrainingArguments(output_dir='o', per_device_train_batch_size=bs, learning_rate=lr)\n")}))
    assert (typer_cfg.batch_size, typer_cfg.lr) == (24, 7e-5)
    assert "command line may override" in typer_cfg.provenance["batch_size"].detail
    click_cfg = parse_config(_write(tmp_path, {"c.py": (
        "import click\nfrom transformers import TrainingArguments\n@click.command()\n"
        "@click.option('--train-batch-size', default=5)\n@click.option('--gc/--no-gc', default=True)\n"
        "def main(train_batch_size, gc):\n"
        "    TrainingArguments(output_dir='o', per_device_train_batch_size=train_batch_size,"
        " gradient_checkpointing=gc)\n")}))
    assert (click_cfg.batch_size, click_cfg.gradient_checkpointing) == (5, True)


def test_branches_under_default_values(tmp_path):
    cfg = parse_config(_write(tmp_path, {"b.py": (
        "import os, torch\nfrom torch.utils.data import DataLoader\nUSE_CKPT = False\n"
        "world = int(os.environ.get('WORLD_SIZE', 1))\naccum = 8\n"
        "if world != 1:\n    accum = accum // world\n"
        "m = torch.nn.Linear(2, 2)\nif USE_CKPT:\n    m.gradient_checkpointing_enable()\n"
        "if torch.cuda.is_available():\n    m = m.half()\nelse:\n    m = m.bfloat16()\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i, x in enumerate(DataLoader(range(8))):\n    if (i + 1) % accum == 0:\n        opt.step()\n")}))
    assert (cfg.gradient_checkpointing, cfg.precision, cfg.grad_accum_steps) == (False, "fp16", 8)


def test_guarded_step_is_unknown_not_one(tmp_path):
    cfg = parse_config(_write(tmp_path, {"g.py": (
        "import torch\nfrom torch.utils.data import DataLoader\nfrom sched import ready\n"
        "m = torch.nn.Linear(2, 2)\nopt = torch.optim.AdamW(m.parameters())\n"
        "for i, x in enumerate(DataLoader(range(8))):\n    if ready(i):\n        opt.step()\n")}))
    assert cfg.grad_accum_steps is None and "ready(i)" in cfg.provenance["grad_accum_steps"].detail
    assert cfg.lr == 1e-3 and "torch" in cfg.provenance["lr"].detail


def test_bitsandbytes_warning_only_when_the_kbit_load_runs(tmp_path):
    text = ("from transformers import AutoModelForCausalLM, BitsAndBytesConfig\nQ = {q}\n"
            "bnb = BitsAndBytesConfig(load_in_4bit=True)\n"
            "m = AutoModelForCausalLM.from_pretrained('x/y', quantization_config=bnb if Q else None)\n")
    off = parse_config(_write(tmp_path, {"off.py": text.format(q=False)}))
    on = parse_config(_write(tmp_path, {"on.py": text.format(q=True)}))
    assert not any("bitsandbytes" in w for w in off.warnings)
    assert any("bitsandbytes" in w for w in on.warnings)


# ------------------------------------------------------------------ library defaults

def test_every_class_default_set_names_library_version_and_source():
    for cls, (library, versions, source, base, values) in F.CLASS_DEFAULTS.items():
        assert library and versions and source and values, cls
        assert base is None or base in F.CLASS_DEFAULTS, cls
        assert class_chain(cls)[0] == cls
    for tool, cls in F.TOOL_CLASS.items():
        assert cls in F.CLASS_DEFAULTS, tool


@pytest.mark.parametrize("cls,lr", [("SFTConfig", 2e-5), ("DPOConfig", 1e-6), ("GRPOConfig", 1e-6),
                                    ("KTOConfig", 1e-6), ("RewardConfig", 1e-4), ("ORPOConfig", 1e-6)])
def test_trl_config_family_shares_the_base_defaults(cls, lr):
    got = tool_defaults("trl", cls)
    assert got["lr"][0] == lr and cls in got["lr"][2]
    assert got["gradient_checkpointing"][0] is True and "TRL" in got["gradient_checkpointing"][2]
    assert got["precision"][0] == "bf16"


@pytest.mark.parametrize("model,expected", [("meta-llama/Llama-3.2-1B", "sdpa"), ("Qwen/Qwen2.5-7B", "sdpa"),
                                            ("google/gemma-2-9b", "unknown"), ("my-org/custom-net", "unknown")])
def test_attention_transformers_picks(tmp_path, model, expected):
    cfg = parse_config(_write(tmp_path, {"m.py": (
        "from transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({model!r})\n")}))
    assert cfg.attention_impl == expected
    if expected == "sdpa":
        assert "library default" in cfg.provenance["attention_impl"].detail
        assert "transformers >= 4." in cfg.provenance["attention_impl"].detail


# ------------------------------------------------------------------ redaction

@pytest.mark.parametrize("text", [
    "# cut the corpus into token sequences of 1024",
    "tok.pad_token = tok.eos_token",
    "A basic training loop on top of the Trainer",
    "eos_token: endoftext",
    "auth_mode = os.environ.get('AUTH_MODE', 'token')",
    "--hub_token $HF_TOKEN",
    "export TOKENIZERS_PARALLELISM=false",
])
def test_ordinary_words_are_not_redacted(text):
    assert redact(text) == text


def test_secrets_still_removed_by_shape():
    for secret, line in SECRETS:
        assert secret not in redact(line)
    assert "<redacted>" in redact("Authorization: Token 3f8a9c2b1d7e6f5a4b3c")
    assert "<redacted>" in redact("password: correcthorse")          # a password key needs no shape
    assert secret_shaped("s3cr3t-v4lue") and not secret_shaped("sequences")
    assert shannon_entropy("aaaa") == 0.0 and shannon_entropy("abcd") == 2.0


# ------------------------------------------------------------------ time

def test_every_case_parses_in_under_two_seconds():
    """Measured on a warm parser (imports done): each case, shared, local and held out."""
    root = Path(__file__).resolve().parent / "data" / "configs"
    cases = [p for r in (root, root / "heldout", root.parents[2].parent / "shared" / "cases" / "configs")
             if r.is_dir() for p in r.iterdir() if (p / "expected.yaml").is_file()]
    import yaml
    slowest = 0.0
    for case in cases:
        entry = case / yaml.safe_load((case / "expected.yaml").read_text())["entry"]
        parse_config(entry)
        start = time.perf_counter()
        parse_config(entry)
        slowest = max(slowest, time.perf_counter() - start)
    assert slowest < 2.0, slowest
