"""ResNet-50 without avgpool/fc on random 400-600 px inputs (pytorch/pytorch#2759): with cudnn.benchmark=True
every new input size is slow; a fixed 600x600 input runs at 0.02 s a step.
"""
import numpy as np
import torch
import torch.backends.cudnn as cudnn
from torchvision.models import resnet50

net = torch.nn.DataParallel(torch.nn.Sequential(*list(resnet50().children())[:-2]).cuda())
cudnn.benchmark = True
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
for i in range(1000):
    h, w = np.random.randint(400, 600), np.random.randint(400, 600)
    x = torch.randn(1, 3, h, w).cuda()
    opt.zero_grad()
    net(x).mean().backward()
    opt.step()
