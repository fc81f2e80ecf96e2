"""char-rnn name classification (spro/practical-pytorch#9): the optimizer is built from one RNN instance
and the loop trains another, created again further down the script.
"""
import torch
from torch import nn

from data import all_categories, n_letters, random_training_pair
from model import RNN

rnn = RNN(n_letters, 128, len(all_categories))
optimizer = torch.optim.SGD(rnn.parameters(), lr=0.005)
criterion = nn.NLLLoss()

rnn = RNN(n_letters, 128, len(all_categories))   # the model is built a second time
for it in range(100000):
    category, line, category_tensor, line_tensor = random_training_pair()
    hidden = rnn.init_hidden()
    optimizer.zero_grad()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    loss = criterion(output, category_tensor)
    loss.backward()
    optimizer.step()
