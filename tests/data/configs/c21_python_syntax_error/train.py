from transformers import TrainingArguments

args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=6,
    gradient_accumulation_steps=3,
    learning_rate=4e-5,
    bf16=True
    optim="adamw_torch",
)
