"""A deep residual MLP over long sequences whose activations do not fit one sample under the documented cap.

Each of the 12 blocks keeps its input (8192 x 256 fp32, 8 MB) and two
8192 x 1024 intermediates (32 MB each) for backward: about 0.9 GB of
activations for a micro-batch of one sequence, next to 25 MB of weights.  No
micro-batch split can help (the micro-batch is already 1); with
``--gradient-checkpointing`` each block keeps only its input and recomputes
the rest during backward (``torch.utils.checkpoint``), about 0.1 GB.
"""
import argparse

import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset


class Sequences(Dataset):
    """16 random sequences made on demand (seeded by index): the data holds no memory of its own."""

    def __init__(self, seq_len: int, dim: int = 256, n: int = 16):
        self.seq_len, self.dim, self.n = seq_len, dim, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.seq_len, self.dim, generator=g), torch.randn((), generator=g)


class Block(torch.nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class DeepMLP(torch.nn.Module):
    def __init__(self, layers: int = 12, dim: int = 256, hidden: int = 1024, checkpointing: bool = False):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(dim, 1)
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing and self.training else block(x)
        return self.head(x).mean(dim=(1, 2))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--gradient-checkpointing", action="store_true", default=False)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Sequences(args.seq_len), batch_size=args.batch_size, shuffle=True)
    model = DeepMLP(checkpointing=args.gradient_checkpointing)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for _ in range(args.epochs):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / args.gradient_accumulation_steps
            loss.backward()
            if (i + 1) % args.gradient_accumulation_steps == 0:
                opt.step()
                opt.zero_grad()
