"""Supervised fine-tune of a TinyLlama checkpoint with the HF Trainer (jzhang38/TinyLlama#32).

To fit four RTX 3090s the reporter cast the whole model to float16 with model.half() after loading; from
then on the training loss logs 0 and the evaluation loss is nan, whatever the learning rate or data.
"""
from dataclasses import dataclass, field

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Trainer, TrainingArguments

from sft_data import make_supervised_data_module   # alpaca-style prompt formatting


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="TinyLlama/TinyLlama-1.1B-intermediate-step-240k-503b")


@dataclass
class DataArguments:
    data_path: str = field(default="yahma/alpaca-cleaned")
    model_max_length: int = field(default=1024)


def main():
    model_args, data_args, training_args = HfArgumentParser(
        (ModelArguments, DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path,
                                              model_max_length=data_args.model_max_length, padding_side="right")
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    model = model.half()            # added to avoid CUDA out of memory
    data_module = make_supervised_data_module(tokenizer, data_args)
    trainer = Trainer(model=model, tokenizer=tokenizer, args=training_args, **data_module)
    trainer.train()


if __name__ == "__main__":
    main()
