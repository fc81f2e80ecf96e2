"""LoRA fine-tuning with Lightning Fabric; every knob is an argument of setup()."""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import lightning as L
import torch

from mylib.lora import GPT, Config, mark_only_lora_as_trainable
from mylib.data import Alpaca


@dataclass
class TrainArgs:
    global_batch_size: int = 64
    micro_batch_size: int = 1
    learning_rate: float = 1e-3
    lr_warmup_steps: int = 50
    max_seq_length: Optional[int] = None
    epochs: int = 1


def setup(
    checkpoint_dir: Path = Path("checkpoints/meta-llama/Llama-2-7b-hf"),
    precision: Optional[str] = None,
    devices: int = 1,
    lora_r: int = 16,
    lora_alpha: int = 32,
    train: TrainArgs = TrainArgs(global_batch_size=128, micro_batch_size=4, lr_warmup_steps=100,
                                 learning_rate=3e-4, max_seq_length=512),
    optimizer: str = "AdamW",
) -> None:
    precision = precision or "bf16-mixed"
    fabric = L.Fabric(devices=devices, strategy="auto", precision=precision)
    fabric.launch(main, devices, checkpoint_dir, lora_r, lora_alpha, train)


def main(fabric, devices, checkpoint_dir, lora_r, lora_alpha, train):
    config = Config.from_name(checkpoint_dir.name, lora_r=lora_r, lora_alpha=lora_alpha)
    with fabric.init_module():
        model = GPT(config)
    mark_only_lora_as_trainable(model)
    model = fabric.setup_module(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=train.learning_rate)
    optimizer = fabric.setup_optimizers(optimizer)
    data = Alpaca(batch_size=train.micro_batch_size, max_seq_length=train.max_seq_length)
    loader = fabric.setup_dataloaders(data.train_dataloader())
    accum = train.global_batch_size // (devices * train.micro_batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / train.lr_warmup_steps))
    for iter_num, batch in enumerate(loader, start=1):
        is_accumulating = iter_num % accum != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = model(batch["input_ids"], batch["labels"])
            fabric.backward(loss / accum)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()


if __name__ == "__main__":
    from jsonargparse import CLI

    CLI(setup)
