"""A 300-300-2 MLP trained in mini-batches (pytorch/pytorch#3358): after the switch to a DataLoader the loss no
longer decreases and changing the learning rate, loss or optimizer does not help.
"""
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class DataSet(Dataset):
    def __init__(self, file_name):
        xy = np.loadtxt(file_name, dtype=np.float32, skiprows=1, delimiter=",")
        self.x, self.y = torch.from_numpy(xy[:, 3:303]), torch.from_numpy(xy[:, 1:3])

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.Sigmoid(), torch.nn.Linear(300, 300),
                            torch.nn.Sigmoid(), torch.nn.Linear(300, 2), torch.nn.Sigmoid())
loader = DataLoader(DataSet("train.csv"), batch_size=32, shuffle=True, num_workers=2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(500):
    for x, y in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
