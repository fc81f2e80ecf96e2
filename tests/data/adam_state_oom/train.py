"""A small language model whose AdamW state does not fit beside its weights under the documented cap.

A vocabulary of 49152 tokens embedded in 1024 dimensions (50M parameters,
201 MB in fp32, the output head tied to the embedding) and one MLP block.
AdamW keeps two fp32 states per parameter (``exp_avg`` and ``exp_avg_sq``,
403 MB more), made at the first optimizer step: that step runs out of memory
under a 1.5 GB address-space cap.  The activations of a micro-batch of 8
sequences of 32 tokens are small (the logits are 50 MB), so neither a smaller
micro-batch nor checkpointing helps; a lower-memory optimizer does
(Adafactor factors the second moment into a row and a column vector and
keeps no first moment).
"""
import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset):
    """64 random token sequences made on demand (seeded by index)."""

    def __init__(self, seq_len: int, vocab: int, n: int = 64):
        self.seq_len, self.vocab, self.n = seq_len, vocab, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = self.norm(h + self.mlp(h))
        return h @ self.embed.weight.T          # the output head is tied to the embedding


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Tokens(args.seq_len, args.vocab), batch_size=args.batch_size, shuffle=True)
    model = TinyLM(args.vocab, args.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for _ in range(args.epochs):
        for seq in loader:
            logits = model(seq[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), seq[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
