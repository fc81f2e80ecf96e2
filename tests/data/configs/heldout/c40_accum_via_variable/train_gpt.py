import argparse

import torch
from torch.utils.data import DataLoader

from gpt import GPT, GPTConfig
from shards import ShardDataset

ap = argparse.ArgumentParser()
ap.add_argument("--micro-batch", type=int, default=16)
ap.add_argument("--accum-steps", type=int, default=8)
ap.add_argument("--seq-len", type=int, default=1024)
ap.add_argument("--lr", type=float, default=6e-4)
args = ap.parse_args()

model = GPT(GPTConfig(block_size=args.seq_len)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
loader = DataLoader(ShardDataset("data/", args.seq_len), batch_size=args.micro_batch, num_workers=8)

for it, (x, y) in enumerate(loader):
    x, y = x.cuda(), y.cuda()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        _, loss = model(x, y)
    (loss / args.accum_steps).backward()
    is_accumulating = (it + 1) % args.accum_steps != 0
    if not is_accumulating:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
