"""A tiny raw PyTorch loop whose every 4th optimizer step stalls 400 ms: a sleep, or with ``--stall save`` a
checkpoint save (``torch.save``) to a slow disk (an object that takes 400 ms to write)."""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--stall", choices=("sleep", "save"), default="sleep")
args = p.parse_args()


class SlowDisk:
    """Pickles as an empty dict after 400 ms: the write of a large checkpoint to a slow disk."""

    def __reduce__(self):
        time.sleep(0.4)
        return dict, ()


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
        if step % 4 == 0 and args.stall == "sleep":
            time.sleep(0.4)
        elif step % 4 == 0:
            torch.save({"model": model.state_dict(), "disk": SlowDisk()}, Path(tempfile.gettempdir()) / "sleepy.pt")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this loop uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(model, loader, opt, xb, accum=1)
        opt.step()
