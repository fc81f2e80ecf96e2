import torch
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

MODEL_ID = "Qwen/Qwen2.5-1.5B-Instruct"
tokenizer = AutoTokenizer.from_pretrained(MODEL_ID, model_max_length=32768)
model = AutoModelForCausalLM.from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16)

news = load_dataset("abisee/cnn_dailymail", "3.0.0", split="train[:20000]")


def to_tokens(batch):
    texts = [a + "\nTL;DR: " + h for a, h in zip(batch["article"], batch["highlights"])]
    return tokenizer(texts, truncation=True, max_length=2048)


news = news.map(to_tokens, batched=True, remove_columns=news.column_names)

args = TrainingArguments(
    output_dir="qwen-summ",
    per_device_train_batch_size=2,
    gradient_accumulation_steps=16,
    learning_rate=1e-5,
    lr_scheduler_type="cosine",
    warmup_steps=100,
    bf16=True,
    gradient_checkpointing=True,
    optim="adamw_torch_fused",
)
Trainer(model=model, args=args, train_dataset=news,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()
