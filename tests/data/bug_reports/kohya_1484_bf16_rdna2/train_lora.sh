# SD-XL LoRA training with kohya sd-scripts on a Radeon RX 6800 (ROCm), 8-bit AdamW from a ROCm
# bitsandbytes build (bmaltais/kohya_ss#1484): with bf16 mixed precision each step takes about four
# times as long as with fp16.
accelerate launch --num_cpu_threads_per_process 1 --mixed_precision bf16 sdxl_train_network.py \
    --pretrained_model_name_or_path=./models/sd_xl_base_1.0.safetensors \
    --train_data_dir=./train/img --output_dir=./out \
    --network_module=networks.lora --network_dim 32 \
    --optimizer_type AdamW8bit --learning_rate 1e-4 \
    --train_batch_size 1 --max_train_epochs 10 --resolution 1024,1024 \
    --cache_latents --gradient_checkpointing
