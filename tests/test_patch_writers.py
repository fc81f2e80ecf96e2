"""The per-format writers behind patch.WRITERS, driven directly through the SourceWriter interface."""
from __future__ import annotations

from pathlib import Path

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.errors import PatchError
from goblin_assets.patch.changeset import companions_for
from goblin_assets.patch.propose import WRITERS
from goblin_assets.patch.source_edit import Document, TextWriter
from goblin_assets.patch.write_mapping import JsonWriter, YamlWriter
from goblin_assets.patch.write_python import PythonWriter

V5 = {"transformers": "5.24.0"}
CONFIGS = Path(__file__).parent / "data" / "configs"


def _doc(tmp_path: Path, name: str, text: str) -> Document:
    (tmp_path / name).write_text(text)
    return Document.open(tmp_path / name, V5)


def _write(doc: Document, changes: dict) -> str:
    """The SourceWriter protocol as patch.edit_source drives it; the patched text, read back."""
    writer = WRITERS[doc.kind](doc)
    for fld, value in changes.items():
        if not writer.rewrite(fld, value):
            writer.insert(fld, value)
        for edit in companions_for({fld: value}):
            writer.companion(edit)
    writer.finish()
    return doc.patched(changes)


def test_registry_has_one_writer_per_format(tmp_path):
    assert WRITERS == {"python": PythonWriter, "yaml": YamlWriter, "json": JsonWriter, "text": TextWriter}
    kinds = {name: _doc(tmp_path, name, text).kind for name, text in [
        ("a.py", "x = 1\n"), ("b.py", "def broken(:\n"), ("c.yml", "a: 1\n"), ("d.yaml", "a: 1\n"),
        ("e.json", "{}\n"), ("run.sh", "python train.py --lr 1\n")]}
    assert kinds == {"a.py": "python", "b.py": "text", "c.yml": "yaml", "d.yaml": "yaml", "e.json": "json",
                     "run.sh": "text"}


SCRIPT = '''from transformers import AutoTokenizer, Trainer, TrainingArguments

def main():
    tok = AutoTokenizer.from_pretrained("m")
    enc = tok(["a b", "c"], truncation=True, padding="max_length", max_length=8)
    args = TrainingArguments(output_dir="o", per_device_train_batch_size=4)
    Trainer(model=None, args=args, train_dataset=enc)
'''


def test_python_writer_rewrites_inserts_and_adds_the_companion(tmp_path):
    doc = _doc(tmp_path, "train.py", SCRIPT)
    patched = _write(doc, {"padding": "dynamic", "batch_size": 8, "dataloader_workers": 2})
    assert 'padding=False, max_length=8)' in patched                         # rewritten in place
    assert 'TrainingArguments(output_dir="o", per_device_train_batch_size=8, dataloader_num_workers=2)' in patched
    assert "Trainer(model=None, args=args, train_dataset=enc, data_collator=DataCollatorWithPadding(tok))" in patched
    assert patched.startswith("from transformers import AutoTokenizer, Trainer, TrainingArguments\n"
                              "from transformers import DataCollatorWithPadding\n")
    (tmp_path / "train.py").write_text(patched)
    cfg = parse_config(tmp_path / "train.py")
    assert (cfg.padding, cfg.batch_size, cfg.dataloader_workers) == ("dynamic", 8, 2)


def test_python_writer_refuses_a_collator_that_does_not_pad(tmp_path):
    text = SCRIPT.replace("train_dataset=enc)", "train_dataset=enc, data_collator=my_collate)")
    doc = _doc(tmp_path, "train.py", text)
    with pytest.raises(PatchError, match=r"already has data_collator=my_collate, not known to pad each batch"):
        _write(doc, {"padding": "dynamic"})


def test_yaml_writer_inserts_under_the_tools_key(tmp_path):
    text = "model:\n  model_name: m\ntraining:\n  per_device_train_batch_size: 4  # small\n"
    patched = _write(_doc(tmp_path, "train.yaml", text), {"dataloader_workers": 2, "batch_size": 8})
    assert patched == ("model:\n  model_name: m\ntraining:\n  per_device_train_batch_size: 8  # small\n"
                       "  dataloader_num_workers: 2\n")


def test_json_writer_inserts_into_the_object(tmp_path):
    text = '{"output_dir": "o", "per_device_train_batch_size": 4}\n'
    patched = _write(_doc(tmp_path, "args.json", text), {"dataloader_workers": 2})
    assert patched == '{"output_dir": "o", "per_device_train_batch_size": 4, "dataloader_num_workers": 2}\n'


def test_text_writer_rewrites_a_launch_line_in_place_and_inserts_nothing(tmp_path):
    text = (CONFIGS / "c18_shell_variables" / "run.sh").read_text()
    doc = _doc(tmp_path, "run.sh", text)
    assert isinstance(WRITERS[doc.kind](doc), TextWriter)
    patched = _write(doc, {"dataloader_workers": 4})
    assert "  --dataloader_num_workers 4 \\\n" in patched
    assert [ln for ln in patched.splitlines() if ln not in text.splitlines()] == ["  --dataloader_num_workers 4 \\"]
    with pytest.raises(PatchError, match="run.sh: attention_impl is not written in the file and nothing can be "
                                         "inserted into a text file"):
        _write(_doc(tmp_path, "run.sh", text), {"attention_impl": "sdpa"})


def test_read_back_catches_an_edit_that_does_not_state_the_value(tmp_path):
    doc = _doc(tmp_path, "args.json", '{"dataloader_num_workers": 0}\n')
    at = doc.text.text.index("0")
    doc.edits.add(at, at + 1, "1")
    with pytest.raises(PatchError, match=r"args.json: after the edit dataloader_workers reads 1, not 3"):
        doc.patched({"dataloader_workers": 3})



OPTIM_SCRIPT = '''from torch.optim import AdamW
import torch

model = torch.nn.Linear(4, 4)
opt = AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-6)
'''


def test_python_writer_replaces_the_optimizer_constructor(tmp_path):
    """An optimizer the script constructs is replaced by the class of the new ``optim`` name; the keywords that
    mean something else there go, AdamW's default weight decay (0.01) is stated where the new default differs,
    and the text reads back as the new optimizer."""
    out = _write(_with(tmp_path, {"torch": "2.13.0", "bitsandbytes": None}), {"optimizer": "adafactor"})
    assert "opt = torch.optim.Adafactor(model.parameters(), lr=3e-4, weight_decay=0.01)\n" in out
    assert parse_config(_save(tmp_path, "patched.py", out)).optimizer == "adafactor"
    compile(out, "patched.py", "exec")
    # an 8-bit AdamW needs bitsandbytes: refused when it is not installed, written (with its import) when it is
    with pytest.raises(PatchError, match="bitsandbytes, and the installed version is none"):
        _write(_with(tmp_path, {"torch": "2.13.0", "bitsandbytes": None}), {"optimizer": "adamw_bnb_8bit"})
    out = _write(_with(tmp_path, {"torch": "2.13.0", "bitsandbytes": "0.49.0"}), {"optimizer": "adamw_bnb_8bit"})
    assert "import bitsandbytes\n" in out
    assert "bitsandbytes.optim.AdamW8bit(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-6)" in out
    # torch before 2.5 has no torch.optim.Adafactor
    with pytest.raises(PatchError, match="torch.optim.Adafactor needs torch >= 2.5"):
        _write(_with(tmp_path, {"torch": "2.4.1"}), {"optimizer": "adafactor"})
    # a name no class is known for, and positional arguments beyond lr, are refused, never written blind
    with pytest.raises(PatchError, match="no optimizer class is known"):
        _write(_with(tmp_path, {"torch": "2.13.0"}), {"optimizer": "lion_32bit"})
    positional = _with(tmp_path, {"torch": "2.13.0"}, OPTIM_SCRIPT.replace("lr=3e-4, betas=", "3e-4, "))
    with pytest.raises(PatchError, match="by position"):
        _write(positional, {"optimizer": "adafactor"})


def _with(tmp_path: Path, packages: dict, text: str = OPTIM_SCRIPT) -> Document:
    doc = _doc(tmp_path, "train.py", text)
    doc.packages = packages
    return doc


def _save(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name
