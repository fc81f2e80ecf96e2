#!/bin/bash
accelerate launch --config_file fsdp_config.yaml --num_processes 8 finetune.py \
    --lr 1e-4 \
    --per_device_batch_size 2 \
    --output_dir runs/mistral-fsdp
