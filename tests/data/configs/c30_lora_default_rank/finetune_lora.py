import torch
from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

checkpoint = "microsoft/phi-2"
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.bfloat16, attn_implementation="sdpa")

# rank left to peft
lora = LoraConfig(lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
model = get_peft_model(model, lora)

data = load_dataset("Abirate/english_quotes", split="train")
data = data.map(lambda rows: tokenizer(rows["quote"], truncation=True, max_length=128), batched=True)

args = TrainingArguments(
    output_dir="phi2-quotes",
    per_device_train_batch_size=16,
    gradient_accumulation_steps=1,
    learning_rate=2e-4,
    bf16=True,
    logging_steps=20,
)
Trainer(model=model, args=args, train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()
