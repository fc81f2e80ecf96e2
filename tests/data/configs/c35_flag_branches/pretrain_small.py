import argparse
import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from model import TinyGPT
from data import TokenShards

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=24)
parser.add_argument("--block_size", type=int, default=512)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--bf16", action="store_true", help="cast the model to bfloat16")
parser.add_argument("--checkpoint_activations", action="store_true")
parser.add_argument("--workers", type=int, default=4)
args = parser.parse_args()

model = TinyGPT(block_size=args.block_size).cuda()
if args.bf16:
    model = model.to(torch.bfloat16)
if args.checkpoint_activations:
    model.gradient_checkpointing_enable()

loader = DataLoader(TokenShards("shards/", args.block_size), batch_size=args.batch_size, num_workers=args.workers,
                    pin_memory=True)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))

for step, (x, y) in enumerate(loader):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
