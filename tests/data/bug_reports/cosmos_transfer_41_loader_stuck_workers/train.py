"""Post-training a multiview video model (nvidia-cosmos/cosmos-transfer2.5#41) in a container that allows one CPU:
the loader's eight workers are more than the container runs, and the loop waits for its next batch for ever."""
import torch
from torch.utils.data import DataLoader

from multiview import MultiviewClips, build_model

model = build_model().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
loader = DataLoader(MultiviewClips("data/auto_multiview"), batch_size=1, num_workers=8, pin_memory=True)
for clips, captions in loader:
    loss = model.training_step(clips.cuda(), captions)
    loss.backward()
    opt.step()
    opt.zero_grad()
