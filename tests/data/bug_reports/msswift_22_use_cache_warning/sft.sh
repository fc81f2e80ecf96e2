# LoRA SFT with ms-swift's command line (modelscope/ms-swift#22): the reporter read the use_cache message as
# an error and stopped the run.
CUDA_VISIBLE_DEVICES=0 \
swift sft \
    --model_type qwen-7b-chat \
    --sft_type lora \
    --dataset ./my_sft_data.jsonl \
    --gradient_checkpointing true \
    --batch_size 1 \
    --gradient_accumulation_steps 16 \
    --max_length 2048 \
    --learning_rate 1e-4 \
    --output_dir output
