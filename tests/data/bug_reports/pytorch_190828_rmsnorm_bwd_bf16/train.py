"""A small residual stack with a final RMSNorm trained in bfloat16 on a ROCm GPU (pytorch/pytorch#190828):
the loss looks fine, but the norm weight's gradients are much larger than the same step on the CPU."""
import torch

class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.mix = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        return x + torch.tanh(self.mix(x))

model = torch.nn.Sequential(*[Block(512) for _ in range(8)], torch.nn.RMSNorm(512)).to("cuda", torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(100):
    x = torch.randn(16, 128, 512, device="cuda", dtype=torch.bfloat16)
    loss = model(x).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
