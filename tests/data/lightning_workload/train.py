"""A small Lightning ``Trainer`` fit on synthetic data (issue 27: a Trainer object's own values observed).

The Trainer, not the loop, decides gradient accumulation (``accumulate_grad_batches``) and precision
(``bf16-mixed``: torch.autocast on the CPU); the optimizer steps inside Lightning's closure.
"""
import argparse
import os
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--accumulate", type=int, default=2)
p.add_argument("--precision", default="bf16-mixed")
args = p.parse_args()

AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class Classifier(L.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        self.lr = lr
        self.last_inputs = None

    def training_step(self, batch, batch_idx):
        xb, yb = batch
        self.last_inputs = xb
        return torch.nn.functional.cross_entropy(self.net(xb), yb)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)

    def on_before_optimizer_step(self, optimizer):
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this run uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(self, self.trainer.train_dataloader, optimizer, self.last_inputs,
                                              accum=self.trainer.accumulate_grad_batches,
                                              autocast=AUTOCAST.get(str(self.trainer.precision)))


torch.manual_seed(0)
x = torch.relu(torch.randn(2048, 32))
y = (x.sum(1) > x.sum(1).median()).long()
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, num_workers=0)
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=20, accumulate_grad_batches=args.accumulate,
                    precision=args.precision, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Classifier(lr=3e-3), loader)
