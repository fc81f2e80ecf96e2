"""Full fine-tune of a 1B causal LM with the HF Trainer on one MI300X, PyTorch 2.6.0 for ROCm 6.2.4.

Attention is deliberately left on eager: on this release, SDPA's memory-efficient backend (AOTriton 0.8.0)
returns wrong outputs when transformers passes a padded 4D attention mask (pytorch/pytorch#147460), so
padded batches came out different from the math path.  Do not switch this back to "sdpa" until PyTorch
is upgraded.
"""
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorWithPadding, Trainer,
                          TrainingArguments)

MODEL = "meta-llama/Llama-3.2-1B"

tokenizer = AutoTokenizer.from_pretrained(MODEL)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(
    MODEL,
    torch_dtype="bfloat16",
    attn_implementation="eager",  # workaround: SDPA + padding mask is wrong on torch 2.6 ROCm (pytorch#147460)
)

raw = load_dataset("json", data_files="chat.jsonl", split="train")
train = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=2048), batched=True,
                remove_columns=["text"])

args = TrainingArguments(
    output_dir="llama-1b-chat",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    learning_rate=1e-5,
    bf16=True,
    optim="adamw_torch_fused",
    dataloader_num_workers=4,
    group_by_length=True,
    report_to="none",
)
Trainer(model=model, args=args, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer)).train()
