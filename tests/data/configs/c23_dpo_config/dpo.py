from trl import DPOConfig, DPOTrainer

training_args = DPOConfig(
    output_dir="Qwen2-0.5B-DPO",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=4,
    max_length=1536,
    gradient_checkpointing=True,
)
trainer = DPOTrainer(model="Qwen/Qwen2-0.5B-Instruct", args=training_args)
trainer.train()
