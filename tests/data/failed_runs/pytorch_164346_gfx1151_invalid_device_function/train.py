"""A small CNN trained on a Ryzen AI Max (Radeon 8060S, gfx1151) with a ROCm 7.0 nightly of PyTorch
(pytorch/pytorch#164346).

The first kernel launch fails with "HIP error: invalid device function": the nightly's ROCm build held no
kernels for gfx1151 at the time.  Reported workaround: HSA_OVERRIDE_GFX_VERSION=11.0.0 (a gfx1100 target).
"""
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loader = DataLoader(datasets.CIFAR10("data", download=True, transform=transforms.ToTensor()), batch_size=128,
                    shuffle=True, num_workers=4)

for images, labels in loader:
    loss = nn.functional.cross_entropy(model(images.cuda()), labels.cuda())
    opt.zero_grad()
    loss.backward()
    opt.step()
