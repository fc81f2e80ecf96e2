from argparse import ArgumentParser

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

from vae import VAE, loss_fn
from celeba import CelebA


def run(hparams):
    fabric = Fabric(accelerator=hparams.accelerator, devices=hparams.devices, precision=hparams.precision)
    model = VAE(latent_dim=hparams.latent)
    optimizer = torch.optim.Adam(model.parameters(), lr=hparams.lr)
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(
        DataLoader(CelebA("data/"), batch_size=hparams.batch_size, num_workers=hparams.num_workers))
    for _ in range(hparams.epochs):
        for x in train_loader:
            optimizer.zero_grad()
            recon, mu, logvar = model(x)
            fabric.backward(loss_fn(recon, x, mu, logvar))
            optimizer.step()


if __name__ == "__main__":
    parser = ArgumentParser(description="VAE on faces with Fabric")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--precision", default="16-mixed", help="16-mixed, bf16-mixed or 32-true")
    parser.add_argument("--batch_size", type=int, default=144)
    parser.add_argument("--num_workers", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--latent", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=20)
    run(parser.parse_args())
