"""Full fine-tune of Qwen2.5-1.5B with the HF Trainer; attention forced to eager (left from a debugging session)."""
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

MODEL = "Qwen/Qwen2.5-1.5B"
MAX_LENGTH = 1024

tokenizer = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype="bfloat16", attn_implementation="eager")

raw = load_dataset("wikitext", "wikitext-103-raw-v1", split="train[:2%]")
train = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=MAX_LENGTH), batched=True,
                remove_columns=["text"])

args = TrainingArguments(
    output_dir="qwen-1.5b-wikitext",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    learning_rate=2e-5,
    warmup_steps=100,
    bf16=True,
    optim="adamw_torch_fused",
    dataloader_num_workers=4,
    train_sampling_strategy="group_by_length",
    report_to="none",
)
trainer = Trainer(model=model, args=args, train_dataset=train,
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
trainer.train()
