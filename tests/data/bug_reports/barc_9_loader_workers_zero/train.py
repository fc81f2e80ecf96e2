"""Dog shape-and-pose network training (runa91/barc_release#9): GPU utilisation swings between 0% and 90%,
mostly 0% while it waits for data; the reporter had set the DataLoader workers to 0 on a 64-core machine.
"""
import argparse

import torch
from torch.utils.data import DataLoader

from barc.datasets import StanfordExtra
from barc.model import ModelImageTo3d
from barc.loss import Loss

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=24)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--lr", type=float, default=5e-4)
p.add_argument("--epochs", type=int, default=300)
args = p.parse_args()

train = StanfordExtra(split="train", augment=True)          # image decoding + augmentation per sample on the CPU
loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True)
model = ModelImageTo3d().cuda()
criterion = Loss()
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    for img, target in loader:
        out = model(img.cuda(non_blocking=True))
        loss = criterion(out, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
