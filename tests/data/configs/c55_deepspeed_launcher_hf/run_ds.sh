#!/usr/bin/env bash
deepspeed --num_gpus 4 sft_train.py \
  --deepspeed ds_zero3.json \
  --model_name_or_path meta-llama/Llama-2-7b-hf \
  --data_path data/sharegpt.json \
  --per_device_train_batch_size 4 \
  --learning_rate 2e-5 \
  --num_train_epochs 3 \
  --bf16 True \
  --output_dir checkpoints/llama2-sft
