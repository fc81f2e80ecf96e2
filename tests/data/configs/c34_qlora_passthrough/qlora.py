import argparse

import torch
from datasets import load_dataset
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import (AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, DataCollatorForSeq2Seq, Trainer,
                          TrainingArguments)

p = argparse.ArgumentParser()
p.add_argument("--model", default="tiiuae/falcon-7b")
p.add_argument("--rank", type=int, default=64)
p.add_argument("--grad-ckpt", action="store_true")
p.add_argument("--max-len", type=int, default=1024)
a = p.parse_args()

bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(a.model, quantization_config=bnb, attn_implementation="eager")
tok = AutoTokenizer.from_pretrained(a.model)
tok.pad_token = tok.eos_token

targs = TrainingArguments(
    output_dir="falcon-qlora",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=4,
    learning_rate=2e-4,
    bf16=True,
    gradient_checkpointing=a.grad_ckpt,
    optim="paged_adamw_32bit",
    warmup_steps=50,
)
# peft only turns checkpointing on if the trainer does
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=targs.gradient_checkpointing)
model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=16, task_type="CAUSAL_LM"))

ds = load_dataset("timdettmers/openassistant-guanaco", split="train")
ds = ds.map(lambda r: tok(r["text"], truncation=True, max_length=a.max_len), batched=True)
Trainer(model=model, args=targs, train_dataset=ds, data_collator=DataCollatorForSeq2Seq(tok)).train()
