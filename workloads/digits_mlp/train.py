"""Train a small MLP on scikit-learn's handwritten digits.

A plain PyTorch training loop: argparse, a Dataset with per-sample
augmentation, a DataLoader and an SGD loop.  The augmentation (random zoom,
rotation and elastic distortion with scipy.ndimage) runs on the CPU for every
sample, as it does in many image pipelines.
"""
import argparse
import importlib.util
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage
from torch import nn
from torch.utils.data import DataLoader, Dataset


def load_digits():
    """scikit-learn's bundled digits: 1797 images (8x8, values 0-16) and their labels (0-9).

    Read from the CSV that ships inside the scikit-learn package (what
    ``sklearn.datasets.load_digits`` reads) without importing scikit-learn,
    which would add about 1.5 s to every run's start-up.
    """
    sklearn = importlib.util.find_spec("sklearn")
    data = np.loadtxt(Path(sklearn.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz",
                      delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


class AugmentedDigits(Dataset):
    """8x8 digit images, augmented on the fly, returned as 64-d float vectors."""

    def __init__(self, images, labels, seed=0):
        self.images = images.astype(np.float32) / 16.0
        self.labels = labels.astype(np.int64)
        self.seed = seed

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        rng = np.random.default_rng(self.seed + idx)
        img = self.images[idx]
        big = ndimage.zoom(img, 4, order=3)  # 32x32 for a smoother warp
        big = ndimage.rotate(big, rng.uniform(-15, 15), reshape=False, order=3)
        dx = ndimage.gaussian_filter(rng.uniform(-1, 1, big.shape), 4) * 12
        dy = ndimage.gaussian_filter(rng.uniform(-1, 1, big.shape), 4) * 12
        yy, xx = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
        big = ndimage.map_coordinates(big, [yy + dy, xx + dx], order=3)
        small = ndimage.zoom(big, 0.25, order=1)
        small = np.clip(small, 0.0, 1.0)
        small[small < 0.05] = 0.0
        return torch.from_numpy(small.reshape(-1).astype(np.float32)), self.labels[idx]


def build_model(hidden):
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    images, labels = load_digits()
    dataset = AugmentedDigits(images, labels, seed=args.seed)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        drop_last=True,
    )

    model = build_model(args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        total, correct, running = 0, 0, 0.0
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            running += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            total += len(y)
        print(f"epoch {epoch}: loss {running / total:.4f} acc {correct / total:.3f}")


if __name__ == "__main__":
    main()
