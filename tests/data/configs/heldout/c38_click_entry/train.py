import click
import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments

BASE = "EleutherAI/gpt-neo-125m"
SEED = 42


@click.command()
@click.argument("output-dir", type=click.Path(file_okay=False))
@click.option("--epochs", "-e", type=int, default=3)
@click.option("--train-batch-size", type=int, default=8)
@click.option("--lr", type=float, default=1e-5)
@click.option("--warmup", type=int, default=40)
@click.option("--seed", type=int, default=SEED)
@click.option("--gradient-checkpointing/--no-gradient-checkpointing", default=True)
def main(output_dir, epochs, train_batch_size, lr, warmup, seed, gradient_checkpointing):
    tokenizer = AutoTokenizer.from_pretrained(BASE)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(BASE, use_cache=not gradient_checkpointing)
    data = load_dataset("tatsu-lab/alpaca", split="train")
    data = data.map(lambda r: tokenizer(r["text"], truncation=True, max_length=1024), batched=True)
    args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=epochs,
        per_device_train_batch_size=train_batch_size,
        learning_rate=lr,
        warmup_steps=warmup,
        seed=seed,
        gradient_checkpointing=gradient_checkpointing,
        fp16=torch.cuda.is_available(),
    )
    Trainer(model=model, args=args, train_dataset=data,
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()


if __name__ == "__main__":
    main()
