"""An fp16 denoiser trained on MI250X (ROCm/composable_kernel#671): the convolutions run through
composable_kernel, which after PR #603 uses BF16 MMA for FP16 inputs on gfx90a.
"""
import torch

from unet import UNet
from data import noisy_pairs

model = UNet(in_ch=3, width=64).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.cuda.amp.GradScaler()
for x, y in noisy_pairs(batch_size=16, size=256):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.l1_loss(model(x.cuda()), y.cuda())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
