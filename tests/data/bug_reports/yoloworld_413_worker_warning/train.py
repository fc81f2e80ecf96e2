"""YOLO-World fine-tune on a 4-core desktop (AILab-CVC/YOLO-World#413): the config's 8 workers per GPU
exceed the 4 CPUs; torch's DataLoader warns and suggests at most 4.
"""
import torch
from torch.utils.data import DataLoader

from yolo_world import YOLOWorldDetector, CocoDetection, collate

dataset = CocoDetection("data/coco/train2017", "data/coco/annotations/instances_train2017.json")
loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=8, persistent_workers=True,
                    collate_fn=collate)
model = YOLOWorldDetector("yolo_world_v2_l").cuda()
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.05)
for epoch in range(80):
    for images, targets in loader:
        opt.zero_grad()
        loss = model(images.cuda(), targets)
        loss.backward()
        opt.step()
