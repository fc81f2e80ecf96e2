"""fp32 training loop on an A100 (pytorch/pytorch#153195): TF32 stays disabled for matmuls by default,
silently, so the float32 GEMMs run on the slow non-tensor-core path; only torch.compile prints a hint.
"""
import torch
from torch.utils.data import DataLoader

from data import FeatureDataset
from model import MLPMixer

model = MLPMixer(dim=4096, depth=12).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
loader = DataLoader(FeatureDataset("train.npy"), batch_size=256, shuffle=True, num_workers=8, pin_memory=True)

for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
