"""propose_patch / edit_source on Python, YAML and JSON files: edits in place, insertions under the
tool's own key, comments kept, the diff accepted by `git apply` and `patch -p1`; conflicts and overlaps."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import Citation, Fix, Rule, RuleMatch, RunMetrics, RunProvenance, WasteBucket
from goblin_assets.errors import PatchError
from goblin_assets.kb.rules import KnowledgeBase, detect_context, load_kb, match_rules
from goblin_assets.patch.propose import edit_source, propose_patch, unified_diff
from tests.conftest import WORKLOADS

V5 = {"transformers": "5.24.0"}
V4 = {"transformers": "4.46.3"}


def _applies(folder: Path, name: str, diff: str, patched: str, tmp_path: Path) -> None:
    """The diff turns the original file into ``patched`` with git apply and with patch -p1."""
    for tool in (["git", "apply", "--whitespace=nowarn"], ["patch", "-p1", "--quiet"]):
        work = tmp_path / f"apply-{tool[0]}"
        shutil.copytree(folder, work)
        if tool[0] == "git":
            subprocess.run(["git", "init", "-q"], cwd=work, check=True)
            subprocess.run(["git", "apply", "--check"], input=diff, text=True, cwd=work, check=True)
        subprocess.run(tool, input=diff, text=True, cwd=work, check=True)
        assert (work / name).read_text() == patched


def _patch(tmp_path: Path, name: str, text: str, changes: dict, packages=None) -> tuple[str, str]:
    """Patch ``text`` (written to ``tmp_path/wl/name``); check the diff applies; leave the patched file there."""
    folder = tmp_path / "wl"
    folder.mkdir(parents=True)
    (folder / name).write_text(text)
    cfg = parse_config(folder / name)
    patched = edit_source(cfg, changes, folder / name, packages=packages or V5)
    diff = unified_diff(text, patched, name)
    _applies(folder, name, diff, patched, tmp_path)
    (folder / name).write_text(patched)
    return patched, diff


# ----------------------------------------------------------------------------------------- Python

HF_SCRIPT = '''"""A Trainer script."""
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained(
    "gpt2",  # the base model
)
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=8,  # per GPU, keep small
    fp16=True,
)
trainer = Trainer(model=model, args=args)
'''


def test_python_keywords_edited_and_inserted_into_the_right_calls(tmp_path):
    patched, diff = _patch(tmp_path, "train.py", HF_SCRIPT,
                           {"attention_impl": "flash", "dataloader_workers": 4, "precision": "bf16",
                            "batch_size": 16})
    # ConfigDict "flash" is HF's "flash_attention_2", added to the model's from_pretrained call
    assert '    "gpt2",  # the base model\n    attn_implementation="flash_attention_2",\n)' in patched
    # edits in place keep the comment; new keywords go into TrainingArguments(...)
    assert "    per_device_train_batch_size=16,  # per GPU, keep small\n" in patched
    assert "    fp16=False,\n" in patched
    assert "    dataloader_num_workers=4,\n    bf16=True,\n)" in patched
    assert "trainer = Trainer(model=model, args=args)\n" in patched   # untouched
    cfg = parse_config(tmp_path / "wl" / "train.py")
    assert (cfg.attention_impl, cfg.dataloader_workers, cfg.precision, cfg.batch_size) == ("flash", 4, "bf16", 16)
    added = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert len(added) == 5 and len(removed) == 2, diff


def test_python_single_line_call_and_version_gated_key(tmp_path):
    text = ("from transformers import TrainingArguments\n"
            "args = TrainingArguments(output_dir='o', per_device_train_batch_size=4)  # one line\n")
    patched, _ = _patch(tmp_path / "v5", "t.py", text, {"group_by_length": True})
    assert ("args = TrainingArguments(output_dir='o', per_device_train_batch_size=4, "
            "train_sampling_strategy=\"group_by_length\")  # one line\n") in patched
    # transformers v4 has no train_sampling_strategy: the key follows the installed version (kb_facts F30)
    patched4, _ = _patch(tmp_path / "v4", "t.py", text, {"group_by_length": True}, packages=V4)
    assert "per_device_train_batch_size=4, group_by_length=True)" in patched4


def test_python_without_a_place_for_the_field_is_a_patch_error(tmp_path):
    text = "import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    (tmp_path / "t.py").write_text(text)
    cfg = parse_config(tmp_path / "t.py")
    with pytest.raises(PatchError, match="no place to write attention_impl"):
        edit_source(cfg, {"attention_impl": "sdpa"}, tmp_path / "t.py", packages=V5)


# ----------------------------------------------------------------------------------------- YAML

AXOLOTL = """base_model: Qwen/Qwen2.5-0.5B   # the model
micro_batch_size: 2
sequence_len: 2048
flash_attention: true
bf16: auto
# memory
gradient_checkpointing: true   # we were OOM once
learning_rate: 2e-4
"""


def test_yaml_keys_edited_in_place_and_inserted_with_the_tools_synonym(tmp_path):
    patched, diff = _patch(tmp_path, "qwen.yml", AXOLOTL,
                           {"gradient_checkpointing": False, "dataloader_workers": 4, "attention_impl": "sdpa"})
    assert "gradient_checkpointing: false   # we were OOM once\n" in patched
    assert "flash_attention: false\n" in patched            # the legacy flag says "not flash" ...
    assert patched.endswith("learning_rate: 2e-4\ndataloader_num_workers: 4\nattn_implementation: sdpa\n")
    assert "base_model: Qwen/Qwen2.5-0.5B   # the model\n" in patched   # comments kept
    cfg = parse_config(tmp_path / "wl" / "qwen.yml")
    assert (cfg.gradient_checkpointing, cfg.dataloader_workers, cfg.attention_impl) == (False, 4, "sdpa")


OUMI = """model:
  model_name: HuggingFaceTB/SmolLM2-135M
training:
  per_device_train_batch_size: 4   # small GPU
  learning_rate: 2.0e-5
peft:
  lora_r: 8
"""


def test_yaml_nested_key_goes_into_its_block(tmp_path):
    patched, _ = _patch(tmp_path, "train.yaml", OUMI, {"dataloader_workers": 2, "batch_size": 8})
    assert ("training:\n  per_device_train_batch_size: 8   # small GPU\n  learning_rate: 2.0e-5\n"
            "  dataloader_num_workers: 2\npeft:\n") in patched
    cfg = parse_config(tmp_path / "wl" / "train.yaml")
    # peft.lora_r without training.use_peft: true: oumi trains no adapter, so no rank
    assert (cfg.dataloader_workers, cfg.batch_size, cfg.lora_rank) == (2, 8, None)


# ----------------------------------------------------------------------------------------- JSON

HF_JSON = """{
  "output_dir": "out",
  "per_device_train_batch_size": 8,
  "fp16": true,
  "dataloader_num_workers": 0
}
"""


def test_json_flags_rewritten_and_keys_inserted(tmp_path):
    patched, _ = _patch(tmp_path, "training_args.json", HF_JSON,
                        {"precision": "bf16", "dataloader_workers": 2, "group_by_length": True})
    assert '"fp16": false,' in patched and '"dataloader_num_workers": 2,' in patched
    assert patched.rstrip().endswith('"dataloader_num_workers": 2,\n  "bf16": true,\n'
                                     '  "train_sampling_strategy": "group_by_length"\n}')
    cfg = parse_config(tmp_path / "wl" / "training_args.json")
    assert (cfg.precision, cfg.dataloader_workers, cfg.group_by_length) == ("bf16", 2, True)


def test_json_nested_object_inserted(tmp_path):
    text = '{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {\n    "stage": 2\n  }\n}\n'
    patched, _ = _patch(tmp_path, "ds_config.json", text, {"precision": "bf16"})
    assert patched == ('{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {\n    "stage": 2\n  },\n'
                       '  "bf16": {"enabled": true}\n}\n')
    assert parse_config(tmp_path / "wl" / "ds_config.json").precision == "bf16"


# ----------------------------------------------------------------------------------------- the real MiniLM script

def _minilm_run() -> RunMetrics:
    """Shaped like the measured MiniLM profile: compute-bound, 49% padding, eager attention."""
    wb = {"useful": WasteBucket(seconds=3.5, status="measured"), "data_wait": WasteBucket(seconds=0.002,
                                                                                           status="measured"),
          "host_gap": WasteBucket(seconds=0.07, status="measured"), "comm_excess": WasteBucket(status="measured"),
          "precision_path": WasteBucket(status="not_observable"), "kernel_shape": WasteBucket(status="not_observable")}
    return RunMetrics(workload="minilm_lora_cls", unit="tokens", steps=5, step_time_s=3.6, tokens_per_sec=123.0,
                      padding_share=0.49, attention_kernel_loaded=False, waste_budget=wb,
                      provenance=RunProvenance(kind="measured", device="cpu", cpu_count=2,
                                               torch_version="2.13.0+cpu"))


def test_minilm_patch_comes_from_kb_rules_and_applies(tmp_path, plain_host):
    root = WORKLOADS / "minilm_lora_cls"
    cfg = parse_config(root / "train.py")
    assert (cfg.padding, cfg.attention_impl, cfg.group_by_length) == ("max_length", "eager", False)
    kb = load_kb()
    run = _minilm_run()
    matches = match_rules(kb, detect_context(cfg, run, env={}, cores=2))
    p = propose_patch(cfg, kb, matches, run, cores=2, workload_root=root, out_dir=tmp_path / "out", packages=V5)
    assert {a.rule_id for a in p.applied} == {"data.dynamic_padding", "attention.eager_to_sdpa"}
    assert all(kb.by_id[a.rule_id].citation.url.startswith("https://") for a in p.applied)
    for needle in ('+    train_enc = tokenizer([t for t, _ in train], truncation=True, padding=False,',
                   'attn_implementation="sdpa")', '+        train_sampling_strategy="group_by_length",',
                   "+        data_collator=DataCollatorWithPadding(tokenizer),",
                   "+from transformers import DataCollatorWithPadding"):
        assert needle in p.diff, needle
    patched = Path(p.patched_file).read_text()
    _applies(root, "train.py", p.diff, patched, tmp_path)
    again = parse_config(Path(p.patched_file))
    assert (again.padding, again.attention_impl, again.group_by_length) == ("dynamic", "sdpa", True)
    # both rules target `useful`: combined, not summed, and the report is told so
    assert p.rule_consistency < 1.0 and any("both target `useful`" in n for n in p.consistency_notes)
    assert 1.0 < p.expected_speedup_low < p.expected_speedup_high < 1.0 / (1.0 - 0.8 * 0.98)
    assert p.confidence == pytest.approx(p.evidence_coverage * p.rule_consistency)


# ----------------------------------------------------------------------------------------- conflicts

def _rule(rid: str, workers: int, recovery: float, bucket: str = "data_wait") -> Rule:
    return Rule(id=rid, category="data", platforms=["cpu"], symptom="s", detect=["cores > 0"],
                fix=Fix(config={"dataloader_workers": workers}), targets_bucket=bucket, recovery_fraction=recovery,
                expected_impact="e", citation=Citation(title="t", section="s", url="https://example.org"))


def test_conflicting_rules_are_not_stacked(tmp_path):
    root = WORKLOADS / "digits_mlp"
    cfg = parse_config(root / "train.py")
    rules = [_rule("a.small", 1, 0.2), _rule("b.big", 2, 0.8), _rule("c.same_bucket_threads", 2, 0.1)]
    rules[2].fix = Fix(config={"intra_op_threads": 1})
    kb = KnowledgeBase(rules=rules, path=Path("mem"), sha256="x")
    wb = {"useful": WasteBucket(seconds=0.01, status="measured"), "data_wait": WasteBucket(seconds=0.09,
                                                                                           status="measured")}
    run = RunMetrics(workload="digits_mlp", steps=3, step_time_s=0.1, waste_budget=wb,
                     provenance=RunProvenance(kind="measured", cpu_count=2))
    matches = [RuleMatch(rule_id=r.id, fired=True, detect_score=1.0) for r in rules]
    p = propose_patch(cfg, kb, matches, run, cores=2, workload_root=root)
    assert [a.rule_id for a in p.applied] == ["b.big", "c.same_bucket_threads"]
    assert len(p.dropped) == 1 and p.dropped[0].startswith("a.small: conflicts with b.big on dataloader_workers")
    assert "b.big wins with the larger predicted uplift (72.0% vs 18.0% of the step)" in p.dropped[0]
    # consistency: 2 of 3 agreeing rules x overlap (1-(0.2*0.9)=0.82 combined vs 0.9 summed)
    assert p.rule_consistency == pytest.approx((2 / 3) * (0.82 / 0.9))
    assert any("b.big and c.same_bucket_threads both target `data_wait`" in n for n in p.consistency_notes)
    # recoverable = 0.82 x 0.9 of the step: speedup high 1 / (1 - 0.738)
    assert p.expected_speedup_high == pytest.approx(1 / (1 - 0.82 * 0.9))
    assert p.expected_speedup_low == pytest.approx(1 / (1 - 0.82 * 0.9 / 2))
