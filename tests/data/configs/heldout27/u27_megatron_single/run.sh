#!/bin/bash
# One-GPU Megatron-LM GPT run, flags on the command line (written here)
torchrun --nproc_per_node 1 pretrain_gpt.py \
    --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
    --seq-length 1024 --max-position-embeddings 1024 \
    --micro-batch-size 4 --global-batch-size 32 \
    --lr 6.0e-4 --lr-warmup-iters 500 --lr-decay-style cosine \
    --train-iters 50000 --fp16 --num-workers 4
