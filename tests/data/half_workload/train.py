"""fp16 weights trained without autocast or GradScaler: the loss turns non-finite within a few steps.

``model.half()`` casts the weights themselves to float16 (max 65504, ~3
significant digits) and the optimizer updates them in float16; with no fp32
master weights (``torch.autocast``) and no loss scaling (``GradScaler``) a
large learning rate drives an activation past fp16's range: measured on CPU
(torch 2.13), the third step's second linear layer outputs inf and the loss
is NaN from then on.  Test data for the "Non-finite values" evidence.
"""
import argparse
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--lr", type=float, default=20.0)
args = p.parse_args()

torch.manual_seed(0)
x = torch.randn(2048, 32) * 4
y = (x[:, :16].sum(1) > x[:, 16:].sum(1)).long()
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False, num_workers=0)
model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 2))
model.half()
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(50):
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb.half()), yb)
        loss.backward()
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this loop uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(model, loader, opt, xb, accum=1)
        opt.step()
