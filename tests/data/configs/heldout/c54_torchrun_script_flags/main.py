import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

import timm
from imagenet import build_dataset


def get_args_parser():
    parser = argparse.ArgumentParser("ViT training", add_help=False)
    parser.add_argument("--batch-size", default=64, type=int, help="per-GPU batch size")
    parser.add_argument("--epochs", default=100, type=int)
    parser.add_argument("--model", default="vit_base_patch16_224", type=str)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--data-path", default="/data/imagenet", type=str)
    parser.add_argument("--output_dir", default="")
    parser.add_argument("--num_workers", default=10, type=int)
    return parser


def main(args):
    torch.distributed.init_process_group("nccl")
    dataset = build_dataset(args.data_path)
    loader = DataLoader(dataset, sampler=DistributedSampler(dataset), batch_size=args.batch_size,
                        num_workers=args.num_workers, pin_memory=True, drop_last=True)
    model = timm.create_model(args.model).cuda()
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    for epoch in range(args.epochs):
        for images, target in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images.cuda()), target.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser("ViT training", parents=[get_args_parser()])
    main(parser.parse_args())
