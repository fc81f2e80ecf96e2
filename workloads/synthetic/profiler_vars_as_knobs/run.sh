#!/usr/bin/env bash
# launch script copied from a profiling session: the rocprof-sys variables stayed in
set -euo pipefail
export HIP_VISIBLE_DEVICES=0
export ROCPROFSYS_USE_SAMPLING=1
export ROCPROFSYS_SAMPLING_FREQ=1000
export ROCPROFSYS_PROFILE=true
torchrun --nproc_per_node 1 run_clm.py \
  --model_name_or_path EleutherAI/pythia-410m \
  --dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 \
  --per_device_train_batch_size 16 \
  --gradient_accumulation_steps 1 \
  --block_size 1024 \
  --learning_rate 3e-4 \
  --warmup_steps 200 \
  --bf16 \
  --optim adamw_torch_fused \
  --dataloader_num_workers 4 \
  --do_train \
  --output_dir /tmp/pythia-410m-clm
