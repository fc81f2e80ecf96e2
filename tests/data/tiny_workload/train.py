"""A tiny raw PyTorch loop on synthetic data, for tests that need many fast runs."""
import argparse
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--lr", type=float, default=0.1)
args = p.parse_args()

torch.manual_seed(0)
x = torch.relu(torch.randn(2048, 32))
y = (x.sum(1) > x.sum(1).median()).long()
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, num_workers=0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(50):
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this loop uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(model, loader, opt, xb, accum=1)
        opt.step()
