"""Bad input: a typed ConfigParseError or a partial result with warnings, each within 2 s."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import ConfigDict
from goblin_assets.errors import ConfigParseError

BILLION_LAUGHS_SEQ = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
)
BILLION_LAUGHS_MAP = "\n".join(
    ["a: &a {x: lol, y: lol, z: lol}"]
    + [f"{c}: &{c} {{{', '.join(f'k{i}: *{p}' for i in range(9))}}}" for p, c in zip("abcdefgh", "bcdefghi")]
)

#: name -> (file name, bytes, "error" | "partial")
CASES: dict[str, tuple[str, bytes, str]] = {
    "python-syntax-error": ("train.py", b"args = TrainingArguments(per_device_train_batch_size=8,\n", "partial"),
    "python-garbage": ("train.py", b"def (((:\n  ]]] 0x\n", "partial"),
    "python-deep-parens": ("train.py", b"x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n", "partial"),
    "python-long-chain": ("train.py", b"x = " + b"1 + " * 100_000 + b"1\n", "partial"),
    "python-power-bomb": ("train.py", b"B = 10 ** 10 ** 10\nS = 'a' * 10 ** 12\n"
                                      b"TrainingArguments(per_device_train_batch_size=B, learning_rate=S)\n", "partial"),
    "python-self-reference": ("train.py", b"a = b\nb = a\nTrainingArguments(per_device_train_batch_size=a)\n",
                              "partial"),
    "binary": ("model.bin", bytes(range(256)) * 64, "error"),
    "binary-as-yaml": ("config.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "error"),
    "non-utf8": ("config.yaml", "learning_rate: 1e-4\nnote: caf\u00e9\n".encode("latin-1"), "error"),
    "utf16": ("train.py", "x = 1\n".encode("utf-16"), "error"),
    "empty": ("train.py", b"", "error"),
    "whitespace-only": ("config.yaml", b"\n\n   \n\t\n", "error"),
    "yaml-billion-laughs-seq": ("config.yaml", BILLION_LAUGHS_SEQ.encode(), "any"),
    "yaml-billion-laughs-map": ("config.yaml", BILLION_LAUGHS_MAP.encode(), "error"),
    "yaml-recursive-alias": ("config.yaml", b"a: &a [*a]\nb: 1\n", "any"),
    "yaml-invalid": ("config.yaml", b"a: [1, 2\nb: : :\n", "error"),
    "yaml-scalar-top": ("config.yaml", b"just a string\n", "error"),
    "yaml-two-documents": ("config.yaml", b"a: 1\n---\nb: 2\n", "error"),
    "yaml-deep-flow": ("config.yaml", b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "error"),
    "yaml-deep-block": ("config.yaml", "".join(f"{'  ' * i}k{i}:\n" for i in range(300)).encode(), "error"),
    "json-deep": ("args.json", b"[" * 200_000 + b"]" * 200_000, "error"),
    "json-deep-object": ("args.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "error"),
    "json-invalid": ("args.json", b'{"learning_rate": 1e-4,, }', "error"),
    "json-trailing": ("args.json", b'{"learning_rate": 1e-4} {"x": 1}', "error"),
    "json-list-top": ("args.json", b"[1, 2, 3]", "error"),
    "json-wrong-types": ("args.json", b'{"per_device_train_batch_size": "eight", "learning_rate": true, '
                                      b'"bf16": "maybe", "warmup_steps": -1.5}', "partial"),
    "shell-noise": ("run.sh", b"#!/bin/sh\necho hello --- -- --=\n\\\n", "partial"),
    "unknown-text": ("notes.txt", b"this is not a config at all\n", "partial"),
}


def _run(tmp_path: Path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    start = time.perf_counter()
    try:
        result = parse_config(path)
    except ConfigParseError as exc:
        result = exc
    return result, time.perf_counter() - start


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(tmp_path: Path, case: str):
    name, data, outcome = CASES[case]
    result, elapsed = _run(tmp_path, name, data)
    assert elapsed < 2.0, f"{case} took {elapsed:.2f} s"
    if outcome == "error":
        assert isinstance(result, ConfigParseError), result
        assert name in str(result) and result.problem
    elif outcome == "partial":
        assert isinstance(result, ConfigDict), result
        assert result.warnings or any(p.kind == "unset" for p in result.provenance.values())
    else:
        assert isinstance(result, (ConfigDict, ConfigParseError))


def test_oversized_file(tmp_path: Path):
    path = tmp_path / "big.yaml"
    with path.open("wb") as fh:
        fh.write(b"learning_rate: 1e-4\n")
        fh.truncate(5 * 1024 * 1024 + 1)
    start = time.perf_counter()
    with pytest.raises(ConfigParseError, match="MB"):
        parse_config(path)
    assert time.perf_counter() - start < 2.0


def test_large_but_allowed_file(tmp_path: Path):
    """Just under 5 MB of real YAML still parses within 2 s."""
    path = tmp_path / "big.yaml"
    body = "".join(f"key_{i}: {i}\n" for i in range(250_000))
    path.write_text("per_device_train_batch_size: 3\n" + body[: 4_900_000 - 40])
    start = time.perf_counter()
    try:
        cfg = parse_config(path)
        assert cfg.batch_size == 3
    except ConfigParseError:
        pass
    assert time.perf_counter() - start < 2.0


def test_missing_and_directory(tmp_path: Path):
    with pytest.raises(ConfigParseError, match="no such file"):
        parse_config(tmp_path / "nope.py")
    with pytest.raises(ConfigParseError, match="not a regular file"):
        parse_config(tmp_path)


def test_wrong_types_are_undetermined_not_guessed(tmp_path: Path):
    path = tmp_path / "args.json"
    path.write_text('{"per_device_train_batch_size": "eight", "learning_rate": true}')
    cfg = parse_config(path)
    assert cfg.batch_size is None and "eight" in cfg.provenance["batch_size"].detail
    assert cfg.lr is None and cfg.provenance["lr"].kind == "unset"


def test_syntax_error_falls_back_with_warning(tmp_path: Path):
    path = tmp_path / "train.py"
    path.write_text("TrainingArguments(per_device_train_batch_size=8, learning_rate=3e-4\n")
    cfg = parse_config(path)
    assert cfg.batch_size == 8 and cfg.lr == 3e-4
    assert any("does not parse" in w for w in cfg.warnings)


def test_missing_deepspeed_companion_warns(tmp_path: Path):
    path = tmp_path / "args.json"
    path.write_text('{"per_device_train_batch_size": 2, "deepspeed": "ds_missing.json"}')
    cfg = parse_config(path)
    assert cfg.batch_size == 2
    assert any("ds_missing.json" in w for w in cfg.warnings)


def test_exponential_name_chain_is_bounded(tmp_path: Path):
    lines = ["x0 = 1"] + [f"x{i} = x{i - 1} + x{i - 1}" for i in range(1, 60)]
    lines.append("TrainingArguments(per_device_train_batch_size=x59, gradient_accumulation_steps=x10)")
    path = tmp_path / "train.py"
    path.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    cfg = parse_config(path)
    assert time.perf_counter() - start < 2.0
    assert cfg.grad_accum_steps == 2 ** 10
    assert cfg.batch_size is None  # 2**59 is past the number limit: undetermined, not guessed


def test_out_of_range_values_are_undetermined(tmp_path: Path):
    path = tmp_path / "args.json"
    path.write_text('{"per_device_train_batch_size": 0, "learning_rate": -1e-4, "dataloader_num_workers": -1}')
    cfg = parse_config(path)
    assert cfg.batch_size is None and cfg.lr is None and cfg.dataloader_workers is None
    assert sum("below the smallest valid" in w for w in cfg.warnings) == 3
