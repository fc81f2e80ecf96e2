from typing import Annotated

import typer
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments

app = typer.Typer(help="Causal-LM fine-tuning from the command line")


@app.command()
def train(
    model_name: str = typer.Option("EleutherAI/pythia-410m", help="hub id of the base model"),
    dataset: str = "roneneldan/TinyStories",
    batch_size: int = typer.Option(12, "--batch-size", "-b"),
    grad_accum: int = 3,
    lr: Annotated[float, typer.Option(help="peak learning rate")] = 6e-5,
    max_len: Annotated[int, typer.Option("--max-len")] = 384,
    workers: int = typer.Option(6),
    epochs: int = 1,
):
    tok = AutoTokenizer.from_pretrained(model_name)
    tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_name)
    ds = load_dataset(dataset, split="train[:5%]")
    ds = ds.map(lambda b: tok(b["text"], truncation=True, max_length=max_len), batched=True, remove_columns=["text"])
    args = TrainingArguments(
        output_dir="out",
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum,
        learning_rate=lr,
        num_train_epochs=epochs,
        dataloader_num_workers=workers,
        bf16=True,
    )
    Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorForLanguageModeling(tok, mlm=False)).train()


if __name__ == "__main__":
    app()
