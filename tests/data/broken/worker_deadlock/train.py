"""A DataLoader whose worker deadlocks: from item ``--items`` on, ``__getitem__`` waits on a lock it already holds.

The worker process blocks for ever (a ``threading.Lock`` is not re-entrant);
the DataLoader has no ``timeout`` and the worker is alive, so the main process
waits on the worker's result queue without end.
"""
import argparse
import threading

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--items", type=int, default=48)
args = p.parse_args()


class Records(Dataset):
    def __init__(self):
        self.lock = threading.Lock()

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        if i >= args.items:
            self.lock.acquire()
            self.lock.acquire()  # never returns: the lock is held by this same thread
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), i % 4


if __name__ == "__main__":
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Records(), batch_size=8, num_workers=1, prefetch_factor=2):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
