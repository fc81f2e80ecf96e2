"""A tiny raw PyTorch loop whose every 4th optimizer step sleeps 400 ms (a periodic stall, e.g. a checkpoint save)."""
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.relu(torch.randn(4096, 32))
y = (x.sum(1) > x.sum(1).median()).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for epoch in range(50):
    for xb, yb in loader:
        step += 1
        if step % 4 == 0:
            time.sleep(0.4)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this loop uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(model, loader, opt, xb, accum=1)
        opt.step()
