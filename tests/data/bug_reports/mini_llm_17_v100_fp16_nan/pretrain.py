"""Small Qwen-architecture LLM pretraining with the HF Trainer on V100s (jiahe7ay/MINI_LLM#17).

On V100 the reporters switched the project's bf16 setting to fp16: the loss logs 0 and grad_norm nan.
One of them traced it to the fp16 GradScaler path not matching the model's dtype; fp32 works but runs out
of memory even at batch size 1 for another.
"""
from transformers import (AutoTokenizer, DataCollatorForLanguageModeling, Qwen2Config, Qwen2ForCausalLM, Trainer,
                          TrainingArguments)

from dataset import load_pretrain_dataset

tokenizer = AutoTokenizer.from_pretrained("./model_save/tokenizer")
config = Qwen2Config.from_pretrained("./model/config.json")
model = Qwen2ForCausalLM(config)

train = load_pretrain_dataset("./datasets/pretrain_data.parquet", tokenizer, max_len=512)

args = TrainingArguments(
    output_dir="./model_save/pretrain",
    per_device_train_batch_size=24,
    gradient_accumulation_steps=10,
    num_train_epochs=1,
    learning_rate=1e-4,
    warmup_steps=1000,
    weight_decay=0.1,
    fp16=True,
    logging_steps=20,
    save_steps=2000,
    report_to="tensorboard",
)
trainer = Trainer(model=model, args=args, train_dataset=train,
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
trainer.train()
