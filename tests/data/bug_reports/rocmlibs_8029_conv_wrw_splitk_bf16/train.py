"""A small 3D U-Net trained in bfloat16 on MI300X (ROCm/rocm-libraries#8029): the 1x1x1 convolutions' weight
gradients go through a split-k kernel that rounds every split's partial sum to bf16."""
import torch

class Down(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pointwise = torch.nn.Conv3d(c, c, kernel_size=1)
        self.spatial = torch.nn.Conv3d(c, c, kernel_size=3, padding=1)

    def forward(self, x):
        return x + self.spatial(torch.nn.functional.gelu(self.pointwise(x)))

model = torch.nn.Sequential(Down(16), Down(16)).to("cuda", torch.bfloat16).to(memory_format=torch.channels_last_3d)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for step in range(500):
    x = torch.randn(8, 16, 16, 16, 16, device="cuda", dtype=torch.bfloat16)
    model(x).float().abs().mean().backward()
    opt.step()
    opt.zero_grad()
