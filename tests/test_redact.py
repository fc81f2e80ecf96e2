"""redact(): secrets and personal paths never reach stored or shown output."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from goblin_assets.config.parse import config_to_json, parse_config, render_config_table
from goblin_assets.redact import redact

#: (secret that must disappear, the line that carries it)
SECRETS: list[tuple[str, str]] = [
    ("hf_Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVb", 'login(token="hf_Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVb")'),
    ("sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe", 'OPENAI_KEY = "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe"'),
    ("sk-ant-api03-AAAABBBBCCCCDDDDEEEEFFFF", 'client = Anthropic(api_key="sk-ant-api03-AAAABBBBCCCCDDDDEEEEFFFF")'),
    ("AKIAIOSFODNN7EXAMPLE", 'AWS_ID = "AKIAIOSFODNN7EXAMPLE"'),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", 'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"'),
    ("9a8b7c6d5e4f3g2h1i0j", 'HEADERS = {"Authorization": "Bearer 9a8b7c6d5e4f3g2h1i0j"}'),
    ("eyJhbGciOiJSUzI1NiJ9", 'JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJlLXZhbHVl"'),
    ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", 'KEY = """-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n'
                                          'c2VjcmV0LWtleS1ib2R5\n-----END PRIVATE KEY-----"""'),
    ("S3cr3tP4ss", 'DB = "postgresql://admin:S3cr3tP4ss@db.internal:5432/metrics"'),
    ("acme-secret-bucket", 'DATA = "s3://acme-secret-bucket/datasets/train.jsonl"'),
    ("private-gcs-ckpts", 'CKPT = "gs://private-gcs-ckpts/run7/"'),
    ("stream.internal.example", 'FEED = "wss://stream.internal.example:443/feed"'),
    ("alice", 'CACHE = "/home/alice/.cache/huggingface"'),
    ("bobsmith", 'OUT = "/Users/bobsmith/experiments/run1"'),
    ("0123456789abcdef0123456789abcdef01234567", 'os.environ["WANDB_API_KEY"] = "0123456789abcdef0123456789abcdef01234567"'),
    ("ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", 'GH = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"'),
    ("xoxb-1234567890-abcdefghij", 'SLACK = "xoxb-1234567890-abcdefghij"'),
    ("AIzaSyA1B2C3D4E5F6G7H8I9J0K1L2M3N4O5P6Q", 'GOOGLE = "AIzaSyA1B2C3D4E5F6G7H8I9J0K1L2M3N4O5P6Q"'),
    ("hunter2hunter2", 'db_password = "hunter2hunter2"'),
    ("carol", r'WIN = "C:\\Users\\carol\\models"'),
]

SCRIPT_HEAD = '''import os
from huggingface_hub import login
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
'''
SCRIPT_TAIL = '''
os.environ["ROCPROFSYS_SAMPLING_FREQ"] = "50"
model = AutoModelForCausalLM.from_pretrained("/home/alice/models/llama", cache_dir=CACHE)
args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=4, bf16=True, logging_dir="/Users/bobsmith/tb")
Trainer(model=model, args=args).train()
'''


def test_twenty_secrets_never_reach_output(tmp_path: Path):
    assert len(SECRETS) == 20
    path = tmp_path / "train.py"
    path.write_text(SCRIPT_HEAD + "\n".join(line for _, line in SECRETS) + "\n" + SCRIPT_TAIL)
    cfg = parse_config(path)
    assert cfg.batch_size == 4 and cfg.precision == "bf16"
    console = Console(record=True, width=300, file=io.StringIO())
    console.print(render_config_table(cfg))
    outputs = {
        "json": json.dumps(config_to_json(cfg)),
        "raw_source": cfg.raw_source,
        "table": console.export_text(),
        "warnings": "\n".join(cfg.warnings),
        "model_dump": cfg.model_dump_json(),
    }
    for secret, _ in SECRETS:
        for where, text in outputs.items():
            assert secret not in text, f"{secret!r} leaked into {where}"
    assert cfg.model_name == "/home/<user>/models/llama"
    assert any("ROCPROFSYS_SAMPLING_FREQ" in w for w in cfg.warnings)


@pytest.mark.parametrize("secret,line", SECRETS, ids=[s[:12] for s, _ in SECRETS])
def test_each_secret_alone(secret: str, line: str):
    out = redact(line)
    assert secret not in out
    assert "<redacted" in out or "<user>" in out


@pytest.mark.parametrize("text", [
    "tokenizer = AutoTokenizer.from_pretrained(BASE)",
    "max_new_tokens: 512",
    "pad_token_id=0",
    "learning_rate: 3e-4",
    'password = os.environ["DB_PASSWORD"]',
    "use_auth_token: true",
    "author: Jane",
    "https://huggingface.co/docs/transformers",
    "hf_hub_download(repo_id)",
    "per_device_train_batch_size=8, gradient_accumulation_steps=4",
])
def test_harmless_text_is_kept(text: str):
    assert redact(text) == text


def test_idempotent_and_cli_flags():
    text = "python train.py --hf_token abcdefgh12345678 --api-key=zyxwvut987654 --lr 3e-4\nexport HF_TOKEN=secretvalue99"
    once = redact(text)
    assert "abcdefgh12345678" not in once and "zyxwvut987654" not in once and "secretvalue99" not in once
    assert "--lr 3e-4" in once
    assert redact(once) == once


def test_yaml_and_json_values():
    assert "s3cr3t-v4lue" not in redact("wandb:\n  api_key: s3cr3t-v4lue\n")
    assert "s3cr3t-v4lue" not in redact('{"hub_token": "s3cr3t-v4lue"}')
    assert redact("") == ""
