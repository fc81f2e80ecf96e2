"""A small GPT trained with bf16 storage (workofart/ml-by-hand#85): weights, activations and gradients in
bf16 and Adam's result written back to the bf16 weights, with no fp32 master copy.
"""
import torch

from gpt import GPT, GPTConfig, batches

model = GPT(GPTConfig(n_layer=6, n_embd=768)).cuda().to(torch.bfloat16)
opt = torch.optim.Adam(model.parameters(), lr=6e-4)
for step, (x, y) in enumerate(batches(batch_size=32, block_size=256)):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
