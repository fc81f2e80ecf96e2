"""A linear-attention language model whose short causal convolutions come from flash-linear-attention, trained in
bfloat16 on an MI355X (fla-org/flash-linear-attention#1156): the convolution's Triton backward is wrong."""
import torch
from fla.modules import ShortConvolution

class Mixer(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.conv = ShortConvolution(d, kernel_size=4, activation="silu")

    def forward(self, x):
        y, _ = self.conv(self.proj(x))
        return x + y

model = torch.nn.Sequential(*[Mixer(256) for _ in range(4)]).to("cuda", torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(200):
    x = torch.randn(1, 128, 256, device="cuda", dtype=torch.bfloat16)
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
