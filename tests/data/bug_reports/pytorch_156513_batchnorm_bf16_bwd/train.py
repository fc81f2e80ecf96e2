"""A CNN trained with bfloat16 activations and fp32 BatchNorm parameters on an AMD GPU through PyTorch's native
(non-MIOpen) NCHW batch-norm path (pytorch/pytorch#156513): its backward disagrees with MIOpen's and the CPU's."""
import torch
import torchvision

model = torchvision.models.resnet18(num_classes=10).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
torch.backends.cudnn.enabled = False  # the native batch-norm kernels instead of MIOpen's
for x, y in torch.utils.data.DataLoader(torchvision.datasets.FakeData(4096, (3, 64, 64), 10,
                                        transform=torchvision.transforms.ToTensor()), batch_size=64):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    loss.backward()
    opt.step()
    opt.zero_grad()
