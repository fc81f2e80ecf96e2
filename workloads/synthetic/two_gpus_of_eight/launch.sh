#!/usr/bin/env bash
# data-parallel fine-tune on two of the eight MI300X GPUs of one node
set -euo pipefail
export HIP_VISIBLE_DEVICES=0,1
torchrun --nproc_per_node 2 run_clm.py \
  --model_name_or_path EleutherAI/pythia-1.4b \
  --dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 \
  --per_device_train_batch_size 16 \
  --gradient_accumulation_steps 1 \
  --block_size 1024 \
  --learning_rate 3e-4 \
  --warmup_steps 500 \
  --bf16 \
  --optim adamw_torch_fused \
  --dataloader_num_workers 8 \
  --do_train \
  --output_dir /tmp/pythia-1.4b-clm
