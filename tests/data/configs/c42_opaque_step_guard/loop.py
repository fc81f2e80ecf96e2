import torch
from torch.utils.data import DataLoader

from project.model import build_model
from project.data import build_dataset
from project.schedule import step_due

model = build_model().cuda()
opt = torch.optim.Adam(model.parameters(), lr=2e-4)
loader = DataLoader(build_dataset(), batch_size=64, num_workers=2)

for i, batch in enumerate(loader):
    loss = model(batch.cuda()).mean()
    loss.backward()
    if step_due(i):
        opt.step()
        opt.zero_grad()
