import argparse

import torch
from accelerate import Accelerator
from datasets import load_dataset
from torch.optim import AdamW
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup


def get_dataloaders(batch_size):
    tokenizer = AutoTokenizer.from_pretrained("google-bert/bert-base-cased")
    ds = load_dataset("glue", "mrpc")
    ds = ds.map(lambda e: tokenizer(e["sentence1"], e["sentence2"], truncation=True, max_length=None), batched=True,
                remove_columns=["idx", "sentence1", "sentence2"]).rename_column("label", "labels")

    def collate(examples):
        return tokenizer.pad(examples, padding="longest", return_tensors="pt")

    return DataLoader(ds["train"], shuffle=True, collate_fn=collate, batch_size=batch_size)


def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    batch_size = int(config["batch_size"])
    gradient_accumulation_steps = int(args.gradient_accumulation_steps)

    train_dataloader = get_dataloaders(batch_size)
    model = AutoModelForSequenceClassification.from_pretrained("google-bert/bert-base-cased", return_dict=True)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=100,
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader,
                                                                          lr_scheduler)
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            if step % gradient_accumulation_steps != 0:
                with accelerator.no_sync(model):
                    accelerator.backward(model(**batch).loss / gradient_accumulation_steps)
            else:
                accelerator.backward(model(**batch).loss / gradient_accumulation_steps)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()


def main():
    parser = argparse.ArgumentParser(description="MRPC with accelerate")
    parser.add_argument("--mixed_precision", type=str, default="fp16", choices=["no", "fp16", "bf16"])
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    config = {"lr": 3e-5, "num_epochs": 3, "seed": 42, "batch_size": 32}
    training_function(config, args)


if __name__ == "__main__":
    main()
