"""Sentiment classifier; the optimizer is built by hand and handed to the Trainer."""
import torch
from datasets import load_dataset
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                          TrainingArguments, get_linear_schedule_with_warmup)

model_id = "distilbert/distilbert-base-uncased"
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModelForSequenceClassification.from_pretrained(model_id, num_labels=2)

imdb = load_dataset("stanfordnlp/imdb")
imdb = imdb.map(lambda b: tokenizer(b["text"], truncation=True, max_length=256), batched=True)

optimizer = torch.optim.AdamW(model.parameters(), weight_decay=0.01)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=300, num_training_steps=5000)

args = TrainingArguments(
    output_dir="distilbert-imdb",
    per_device_train_batch_size=32,
    max_steps=5000,
    fp16=True,
    dataloader_num_workers=2,
)
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=imdb["train"],
    data_collator=DataCollatorWithPadding(tokenizer),
    optimizers=(optimizer, scheduler),
)
trainer.train()
