import torch
from accelerate import Accelerator
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator, get_cosine_schedule_with_warmup

MODEL = "Qwen/Qwen2.5-0.5B"
ACCUM = 4

accelerator = Accelerator(gradient_accumulation_steps=ACCUM, mixed_precision="bf16")
tokenizer = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(MODEL)

raw = load_dataset("wikitext", "wikitext-2-raw-v1", split="train")
tokenized = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=768, padding="max_length"),
                    batched=True, remove_columns=["text"])
train_dl = DataLoader(tokenized, batch_size=6, shuffle=True, collate_fn=default_data_collator, num_workers=3)

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=200, num_training_steps=10_000)
model, optimizer, train_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, scheduler)

model.train()
for batch in train_dl:
    with accelerator.accumulate(model):
        out = model(**batch, labels=batch["input_ids"])
        accelerator.backward(out.loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
