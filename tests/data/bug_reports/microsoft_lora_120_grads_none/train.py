"""loralib adapters inside transformer blocks that run under torch.utils.checkpoint (a raw PyTorch loop).

Rebuilt from microsoft/LoRA#120: with gradient checkpointing the LoRA A/B matrices get no gradient and are
never updated; without checkpointing the same script trains.
"""
import argparse

import loralib as lora
import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader

from model import Block, Embeddings, Head, load_pretrained   # the reporter's own transformer
from data import TokenDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--lr", type=float, default=2e-4)
p.add_argument("--lora-r", type=int, default=8)
p.add_argument("--grad-ckpt", action="store_true")
args = p.parse_args()

emb, blocks, head = load_pretrained(lora_r=args.lora_r)       # q/v projections are lora.Linear(r=8)
lora.mark_only_lora_as_trainable(torch.nn.ModuleList([emb, *blocks, head]))
params = [p for m in (emb, *blocks, head) for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=args.lr)
loader = DataLoader(TokenDataset("train.bin", 512), batch_size=args.batch_size, shuffle=True, num_workers=4)

for x, y in loader:
    x, y = x.cuda(), y.cuda()
    h = emb(x)                                   # frozen embeddings: h does not require grad
    for blk in blocks:
        h = checkpoint(blk, h) if args.grad_ckpt else blk(h)
    loss = torch.nn.functional.cross_entropy(head(h).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
