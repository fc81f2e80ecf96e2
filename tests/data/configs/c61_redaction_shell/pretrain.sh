#!/usr/bin/env bash
# Packs token sequences to 2048 and pushes the result to the Hub.
export HF_TOKEN=hf_Pk3Rt8Wq1Zx6Cv9Bn2Ml5Jh4Gf7Ds0Ae
export WANDB_API_KEY=7c1e9a4b2d8f6e3a5c0b9d7e1f2a4c6e8b0d2f4a
export TOKENIZERS_PARALLELISM=false

python run_clm.py \
  --model_name_or_path EleutherAI/pythia-160m \
  --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 \
  --per_device_train_batch_size 32 \
  --block_size 2048 \
  --learning_rate 6e-4 \
  --bf16 \
  --push_to_hub \
  --hub_token $HF_TOKEN \
  --output_dir out/pythia160m
