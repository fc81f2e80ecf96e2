"""Encoding images for a retrieval benchmark (embeddings-benchmark/mteb#1331): the DataLoader takes half of
os.cpu_count() as its worker count, 104 on this machine, though the process may use only 23 CPUs."""
import math
import os

import torch
from torch.utils.data import DataLoader

from images import ImageCorpus, load_encoder

encoder = load_encoder().cuda().eval()
num_workers = 104  # math.floor(os.cpu_count() / 2) on the reporter's 208-CPU machine
loader = DataLoader(ImageCorpus("sts17_ko"), batch_size=32, num_workers=num_workers)
with torch.no_grad():
    for images in loader:
        encoder(images.cuda())
