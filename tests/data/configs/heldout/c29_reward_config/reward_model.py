from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer

name = "Qwen/Qwen2.5-1.5B"
tokenizer = AutoTokenizer.from_pretrained(name)
model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1)
model.config.pad_token_id = tokenizer.pad_token_id

pairs = load_dataset("trl-lib/ultrafeedback_binarized", split="train")

training_args = RewardConfig(
    output_dir="qwen-rm",
    per_device_train_batch_size=8,
    max_length=512,
    eval_strategy="no",
)
trainer = RewardTrainer(model=model, processing_class=tokenizer, args=training_args, train_dataset=pairs)
trainer.train()
