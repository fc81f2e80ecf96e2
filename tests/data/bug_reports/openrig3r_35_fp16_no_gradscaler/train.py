"""Open-Rig3R training (engichang1467/Open-Rig3R#35): autocast without a dtype (fp16 on CUDA) and no
GradScaler; the raymap terms are bounded cosine losses with gradients far below the depth term's.
"""
import torch
from torch.amp import autocast

from rig3r import Rig3R, MultiTaskLoss, rig_loader

device = torch.device("cuda")
model = Rig3R().to(device)
criterion = MultiTaskLoss()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
for images, metadata, targets in rig_loader(batch_size=4, num_workers=8):
    opt.zero_grad()
    with autocast(device_type=str(device)):
        outputs = model(images.to(device), metadata)
        loss = criterion(outputs, targets)
    loss.backward()
    opt.step()
