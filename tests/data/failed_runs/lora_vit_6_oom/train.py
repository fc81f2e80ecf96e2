"""LoRA on a ViT-B/16 image classifier, one 16 GB GPU (JamesQFreeman/LoRA-ViT#6).

Forward passes of the frozen ViT run fine; training the LoRA adapters (under 1 M trainable parameters)
stops on the first step with a CUDA out-of-memory error: the activations of the whole batch are kept for
backward, which inference under no_grad never keeps.  The reporter's fix: a smaller batch.
"""
import timm
import torch
from torch.utils.data import DataLoader

from lora import LoRA_ViT
from data import ImageFolderDataset

vit = timm.create_model("vit_base_patch16_224", pretrained=True)
model = LoRA_ViT(vit, r=4, num_classes=10).cuda()
opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
loader = DataLoader(ImageFolderDataset("train/"), batch_size=256, shuffle=True, num_workers=4)

for images, labels in loader:
    logits = model(images.cuda())
    loss = torch.nn.functional.cross_entropy(logits, labels.cuda())
    opt.zero_grad()
    loss.backward()
    opt.step()
