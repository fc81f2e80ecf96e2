"""A DataLoader whose workers start with ``spawn`` or ``forkserver`` (``--context``; Linux's default is ``fork``).

Such a worker is a fresh interpreter that unpickles its target, torch's ``_worker_loop``, by name: whatever
the harness puts in its place must pickle to something the worker can import, or the loader stops before its
first batch.  ``--hang-after N``: from item N on, the worker waits on an event nobody sets (a hung worker).
"""
import argparse
import threading

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __init__(self, n: int, hang_after: int | None):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)
        self.hang_after = hang_after

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.hang_after is not None and i >= self.hang_after:
            threading.Event().wait()  # never set: this worker blocks for ever
        return self.x[i], self.y[i]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--context", default="spawn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hang-after", type=int, default=None)
    args = p.parse_args()
    loader = DataLoader(Items(1024, args.hang_after), batch_size=args.batch_size, num_workers=1,
                        multiprocessing_context=args.context, persistent_workers=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(20):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
