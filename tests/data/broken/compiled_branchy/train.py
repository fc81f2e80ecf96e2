"""A small compiled model whose forward branches on a tensor value, fed a new sequence length now and then.

``torch.compile(backend="eager")``: dynamo traces and guards as it does with
inductor, without a C++ toolchain.  ``if h.abs().mean().item() > ...`` is a
graph break (``Tensor.item()`` leaves the graph); the sequence length
changes from 16 to 24 after step ``--switch``, so dynamo recompiles for the
new size (its size guard fails) and then, on the third length, marks the
dimension dynamic.  Batches are made in the loop, with no DataLoader.
"""
import argparse

import torch

class Branchy(torch.nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        if h.abs().mean().item() > 10.0:  # data-dependent branch: a graph break
            h = h / h.abs().mean()
        return self.head(h)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--switch", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    torch.manual_seed(0)
    model = Branchy()
    step_fn = torch.compile(model, backend="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        seq = 16 if step < args.switch else 24 if step < 2 * args.switch else 32
        ids = torch.randint(0, 64, (8, seq), generator=g)
        logits = step_fn(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
