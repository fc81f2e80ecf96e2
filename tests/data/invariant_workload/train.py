"""A tiny next-token loop that breaks the invariants of a healthy training step on purpose.

Each break is a bug class of the public reports the checks of goblin_assets/measure/invariants.py
were written for; ``--healthy`` turns every one off (the checks must stay silent):

* a linear layer whose low-precision path flushes small outputs to zero (a wrong-result kernel: the
  float64 reference does not flush), and one whose forward is right but whose low-precision backward
  flushes small input gradients,
* fp16 autocast with a loss too small for fp16 (gradients below its smallest normal, no GradScaler),
* a gate parameter multiplied by zero (an all-zero gradient), a layer the forward never uses (it never
  changes), a bf16 scale with no fp32 master copy whose small updates round away,
* SGD with ``maximize=True`` (the loss goes up), the last attended token masked like padding (pad ==
  eos), DataLoader workers restarted every epoch, more threads and workers than cores, and a cost paid
  each time a new sequence length appears (a per-shape search, as cuDNN benchmark mode does).
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--healthy", action="store_true")
args = p.parse_args()
broken = not args.healthy
VOCAB, EOS = 64, 1


class Tokens(Dataset):
    """Rows of token ids ending in EOS; lengths cycle (broken) or stay fixed (healthy)."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(2, VOCAB, (16,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        n = (6, 9, 12, 15)[(i // 8) % 4] if broken else 12
        return torch.cat([self.rows[i][: n - 1], torch.tensor([EOS])])


def collate(rows):
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, r in enumerate(rows):
        ids[k, : len(r)], mask[k, : len(r)] = r, 1
    labels = ids.masked_fill(mask == 0, -100)
    if broken:  # pad == eos: masking pad ids masks every row's EOS as well
        labels = labels.masked_fill(ids == EOS, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class FlushLinear(nn.Linear):
    """A linear layer whose reduced-precision path flushes outputs below 0.05 to zero (the bug)."""

    def forward(self, x):
        y = super().forward(x)
        if broken and y.dtype != torch.float64:
            y = torch.where(y.abs() < 0.05, torch.zeros_like(y), y)
        return y


class _FlushGradLinear(torch.autograd.Function):
    """y = x W^T + b, exact; its backward drops every gradient below a tenth of the largest (the bug) unless it
    runs in float64."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return nn.functional.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx, gw, gb = g @ w.to(g.dtype), g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).to(g.dtype), \
            g.reshape(-1, g.shape[-1]).sum(0)
        if broken and g.dtype != torch.float64:
            gx = torch.where(gx.abs() < 0.1 * gx.abs().max(), torch.zeros_like(gx), gx)
        return gx.to(x.dtype), gw.to(w.dtype), gb.to(w.dtype)


class GradFlushLinear(nn.Linear):
    """A linear layer whose forward is right and whose reduced-precision backward flushes small input
    gradients to zero (a wrong-result backward kernel: the forward check cannot see it)."""

    def forward(self, x):
        return _FlushGradLinear.apply(x, self.weight, self.bias)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.mix = FlushLinear(16, 16)
        self.back = GradFlushLinear(16, 16)
        self.head = nn.Linear(16, VOCAB)
        self.unused = nn.Linear(16, 16)  # built, given to the optimizer, never called (broken)
        self.gate = nn.Parameter(torch.ones(16))
        self.scale = nn.Parameter(torch.ones(16, dtype=torch.bfloat16 if broken else torch.float32))
        self.seen = set()

    def forward(self, ids):
        if broken and ids.shape not in self.seen:  # a search paid once per new shape
            self.seen.add(ids.shape)
            time.sleep(0.25)
        h = torch.relu(self.mix(self.embed(ids))) * self.scale.float()
        h = h * self.gate if not broken else h + 0.0 * self.gate.sum()
        if not broken:
            h = h + 0.1 * self.unused(h)
        h = h + self.back(h)
        return self.head(h)


torch.manual_seed(0)
torch.set_num_threads(4 if broken else 1)
model = Model()
params = [p for n, p in model.named_parameters() if n != "scale"]
scale = 1e-5 if broken else 1.0  # broken: a loss too small for fp16's range, the learning rate scaled up
opt = torch.optim.SGD([{"params": params, "lr": 0.5 / scale}, {"params": [model.scale], "lr": 1e-3 / scale}],
                      maximize=broken)
workers = (len(os.sched_getaffinity(0)) + 1) if broken else 1
loader = DataLoader(Tokens(32 if broken else 256), batch_size=8, collate_fn=collate, num_workers=workers,
                    persistent_workers=not broken)
widest = 0
for epoch in range(100):
    for batch in loader:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=broken):
            logits = model(batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.float()[:, :-1].reshape(-1, VOCAB),
                                           batch["labels"][:, 1:].reshape(-1))
        (loss * scale).backward()
        widest = max(widest, batch["input_ids"].shape[1])
        if os.environ.get("OBSERVE_TRUTH"):  # tests only: the settings this loop uses (tests/data/observe_truth.py)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            __import__("observe_truth").write(model, loader, opt, batch["input_ids"], accum=1, seq_len=widest,
                                              autocast=torch.float16 if broken else None, padding="dynamic")
        opt.step()
