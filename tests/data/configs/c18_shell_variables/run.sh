#!/bin/bash
# Launch with accelerate; secrets come from the environment.
export HF_TOKEN=hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210
export ROCPROFSYS_OUTPUT_PATH=/home/bob/traces
LR=2e-5
BS=4
accelerate launch --mixed_precision fp16 --num_processes 4 train.py \
  --model_name_or_path "microsoft/phi-2" \
  --per_device_train_batch_size $BS \
  --gradient_accumulation_steps=16 \
  --learning_rate ${LR} \
  --max_seq_length 1024 \
  --gradient_checkpointing \
  --dataloader_num_workers 2 \
  --output_dir /home/bob/out
