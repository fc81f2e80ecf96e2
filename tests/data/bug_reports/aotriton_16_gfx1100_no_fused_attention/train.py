"""Transformer encoder training on a Radeon RX 7900 XTX (gfx1100) with PyTorch for ROCm (ROCm/aotriton#16).

The run warns that torch was not compiled with memory-efficient attention: the AOTriton fused attention
kernels only targeted MI200/MI300 at the time, so attention on gfx1100 runs SDPA's math path; the reporter
sees about 1.6 it/s where an RTX 4090 does about 3.
"""
import torch
from torch import nn
from torch.utils.data import DataLoader

from data import TextClassificationDataset

model = nn.Sequential(
    nn.Embedding(32000, 1024),
    nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096,
                                                     batch_first=True, norm_first=True), num_layers=12),
).cuda()
head = nn.Linear(1024, 4).cuda()
opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-4)
loader = DataLoader(TextClassificationDataset("train.jsonl", max_len=1024), batch_size=16, shuffle=True,
                    num_workers=8)

for tokens, labels in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        logits = head(model(tokens.cuda()).mean(dim=1))
        loss = nn.functional.cross_entropy(logits, labels.cuda())
    opt.zero_grad()
    loss.backward()
    opt.step()
