"""DeiT-tiny on ImageNet with eight GPUs on one node (facebookresearch/deit#81).

Launched as: python -m torch.distributed.launch --nproc_per_node=8 --use_env main.py --num_workers 32 ...
on a machine with 32 CPUs: every one of the 8 ranks starts its own loader workers, so 8 x 32 workers share
32 cores and the GPUs stall; the maintainer's answer is that num_workers counts CPUs per GPU.
"""
import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from datasets import build_dataset
from models import deit_tiny_patch16_224


def get_args_parser():
    p = argparse.ArgumentParser("DeiT training", add_help=False)
    p.add_argument("--batch-size", default=128, type=int)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--num_workers", default=10, type=int)
    p.add_argument("--pin-mem", action="store_true", default=True)
    p.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/", type=str)
    return p


def main(args):
    dist.init_process_group("nccl")
    dataset_train = build_dataset(is_train=True, args=args)
    loader = DataLoader(dataset_train, sampler=DistributedSampler(dataset_train), batch_size=args.batch_size,
                        num_workers=args.num_workers, pin_memory=args.pin_mem, drop_last=True)
    model = torch.nn.parallel.DistributedDataParallel(deit_tiny_patch16_224().cuda())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    for samples, targets in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(samples.cuda()), targets.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main(argparse.ArgumentParser("DeiT", parents=[get_args_parser()]).parse_args())
