"""fp16 weights whose first linear layer overflows fp16 at every step, while the loss stays finite.

``model.half()`` makes every matmul compute in float16 (largest finite value
65504).  The first layer's weights are scaled by 20,000, so its outputs have a
standard deviation of about 46,000 and some exceed 65504: they become +-inf.
The tanh after it saturates them to +-1 (its gradient there is 0), so the loss,
the gradients and the weights stay finite and training goes on: the overflow
is silent, only the sketches of the matmul output see it.  Test data for the
tensor findings' fp16-overflow -> bf16 rule (tests/test_tensor_findings.py).
"""
import argparse
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
args = p.parse_args()

torch.manual_seed(0)
x = torch.randn(2048, 16) * 4
y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).long()
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False, num_workers=0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
with torch.no_grad():
    model[0].weight.mul_(20000.0)
model.half()
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(50):
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb.half()).float(), yb)
        loss.backward()
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this loop uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(model, loader, opt, xb, accum=1)
        opt.step()
