"""A training loop fed by a producer thread that dies: the loop then waits on the queue forever.

The producer raises after ``--batches`` batches (a corrupt record, say);
an exception in a thread only prints its traceback, so nothing stops the
consumer, which blocks in ``queue.get()`` without a timeout.
"""
import argparse
import queue
import threading

import torch

p = argparse.ArgumentParser()
p.add_argument("--batches", type=int, default=5)
args = p.parse_args()

batches: queue.Queue = queue.Queue(maxsize=4)


def produce():
    g = torch.Generator().manual_seed(0)
    for i in range(1_000_000):
        if i == args.batches:
            raise ValueError(f"corrupt record {i}")
        batches.put((torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)))


threading.Thread(target=produce, name="producer", daemon=True).start()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    x, y = batches.get()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
