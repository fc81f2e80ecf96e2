"""Conformer transducer training on LibriSpeech with PyTorch 2.0 (k2-fsa/icefall#978).

The reporter turned on PyTorch 2.0's fused attention for the self-attention blocks, expecting flash
attention; the blocks pass a key-padding mask, so scaled_dot_product_attention cannot use the flash or
memory-efficient kernels and runs its math path (found only after "digging deeper").
"""
import argparse

import torch
from torch.utils.data import DataLoader

from asr_datamodule import LibriSpeechAsrDataModule
from conformer import Conformer            # self-attention calls F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def get_parser():
    p = argparse.ArgumentParser()
    p.add_argument("--max-duration", type=int, default=500)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--base-lr", type=float, default=0.05)
    p.add_argument("--use-fp16", type=bool, default=True)
    return p


def main():
    args = get_parser().parse_args()
    torch.backends.cuda.enable_flash_sdp(True)
    model = Conformer(num_features=80, d_model=512, nhead=8).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=args.base_lr)
    scaler = torch.cuda.amp.GradScaler(enabled=args.use_fp16)
    train_dl = LibriSpeechAsrDataModule(args).train_dataloaders(num_workers=args.num_workers)
    for batch in train_dl:
        with torch.autocast("cuda", dtype=torch.float16, enabled=args.use_fp16):
            loss = model(batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


if __name__ == "__main__":
    main()
