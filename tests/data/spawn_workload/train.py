"""A DataLoader whose workers start with ``spawn`` or ``forkserver`` (``--context``; Linux's default is ``fork``).

Such a worker is a fresh interpreter that unpickles its target, torch's ``_worker_loop``, by name: whatever
the harness puts in its place must pickle as that name, or the loader stops before its first batch.
"""
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--context", default="spawn")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    torch.manual_seed(0)
    x, y = torch.randn(1024, 8), torch.randint(0, 2, (1024,))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, num_workers=1,
                        multiprocessing_context=args.context, persistent_workers=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(20):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
