"""LoRA fine-tune with the HF Trainer; gradient checkpointing is switched on in TrainingArguments.

Rebuilt from the reporter's notebook (huggingface/transformers#26221): with checkpointing on, the LoRA run
stops learning; with it off, the loss falls as expected.  The script enables non-reentrant checkpointing on
the model itself, but the Trainer enables checkpointing again from its own arguments, without the kwargs.
"""
from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

MODEL = "EleutherAI/pythia-410m"

tokenizer = AutoTokenizer.from_pretrained(MODEL)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype="bfloat16")
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["query_key_value"],
                                         task_type="CAUSAL_LM"))

data = load_dataset("Abirate/english_quotes", split="train")
data = data.map(lambda b: tokenizer(b["quote"], truncation=True, max_length=256), batched=True)

args = TrainingArguments(
    output_dir="lora-cp",
    per_device_train_batch_size=8,
    learning_rate=2e-4,
    max_steps=200,
    bf16=True,
    gradient_checkpointing=True,
    logging_steps=10,
    report_to="none",
)
Trainer(model=model, args=args, train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()
