from dataclasses import dataclass, field
from typing import Optional

import transformers
from transformers import Trainer


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default="facebook/opt-125m")


@dataclass
class DataArguments:
    data_path: str = field(default=None)


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    optim: str = field(default="adamw_torch")
    model_max_length: int = field(default=2048)


def train():
    parser = transformers.HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path,
                                                           model_max_length=training_args.model_max_length,
                                                           padding_side="right", use_fast=False)
    trainer = Trainer(model=model, tokenizer=tokenizer, args=training_args)
    trainer.train()


if __name__ == "__main__":
    train()
