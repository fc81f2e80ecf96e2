import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from nets import ResNet50
from imagedata import ImageFolderDataset

fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp", precision="bf16-mixed")
fabric.launch()

model = ResNet50(num_classes=1000)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
model, optimizer = fabric.setup(model, optimizer)

loader = DataLoader(ImageFolderDataset("/data/imagenet/train"), batch_size=256, shuffle=True, num_workers=12)
loader = fabric.setup_dataloaders(loader)

for epoch in range(90):
    for images, labels in loader:
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
