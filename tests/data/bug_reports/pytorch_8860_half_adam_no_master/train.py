"""HappyNet-style CNN in half precision (pytorch/pytorch#8860): loss turns NaN after a few iterations
even with eps=1e-4; the whole model is .half() and Adam steps the fp16 weights directly.
"""
import torch
from torch import nn
from torch.utils.data import DataLoader

from happynet import HappyNet, FaceDataset

model = HappyNet().cuda().half()
opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4)
loader = DataLoader(FaceDataset("train"), batch_size=64, shuffle=True, num_workers=4)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(50):
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x.cuda().half()), y.cuda())
        loss.backward()
        opt.step()
