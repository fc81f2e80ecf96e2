#!/bin/bash
# 8 GPUs, one node
torchrun --nproc_per_node=8 --master_port 29501 main.py \
    --model vit_small_patch16_224 \
    --batch-size 128 \
    --num_workers 32 \
    --lr 1e-3 \
    --epochs 300 \
    --data-path /datasets/imagenet \
    --output_dir ./ckpt/vit_s
