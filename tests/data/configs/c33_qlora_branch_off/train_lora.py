# Launched as: deepspeed train_lora.py --deepspeed ds.json (flags are optional)
import os
from dataclasses import dataclass, field
from typing import List

import torch
import transformers
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import BitsAndBytesConfig, Trainer


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="lmsys/vicuna-7b-v1.5")


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    optim: str = field(default="adamw_torch")
    model_max_length: int = field(default=512, metadata={"help": "longest sequence; longer ones are cut"})


@dataclass
class LoraArguments:
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_target_modules: List[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    q_lora: bool = False


def train():
    parser = transformers.HfArgumentParser((ModelArguments, TrainingArguments, LoraArguments))
    model_args, training_args, lora_args = parser.parse_args_into_dataclasses()

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    ddp = world_size != 1
    device_map = None
    if lora_args.q_lora:
        device_map = {"": int(os.environ.get("LOCAL_RANK") or 0)} if ddp else None

    compute_dtype = torch.float16 if training_args.fp16 else (torch.bfloat16 if training_args.bf16 else torch.float32)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        device_map=device_map,
        quantization_config=quant if lora_args.q_lora else None,
    )
    if lora_args.q_lora:
        model = prepare_model_for_kbit_training(model)
        model.gradient_checkpointing_enable()

    model = get_peft_model(model, LoraConfig(r=lora_args.lora_r, lora_alpha=lora_args.lora_alpha,
                                             lora_dropout=lora_args.lora_dropout,
                                             target_modules=lora_args.lora_target_modules, task_type="CAUSAL_LM"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, model_max_length=training_args.model_max_length, padding_side="right")
    tokenizer.pad_token = tokenizer.unk_token
    trainer = Trainer(model=model, tokenizer=tokenizer, args=training_args)
    trainer.train()


if __name__ == "__main__":
    train()
