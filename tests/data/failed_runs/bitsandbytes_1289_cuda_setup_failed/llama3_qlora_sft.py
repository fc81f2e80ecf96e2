"""QLoRA SFT of Llama-3-8B-Instruct with TRL's SFTTrainer on an AWS g5 (A10G) instance
(bitsandbytes-foundation/bitsandbytes#1289).

Loading the 4-bit model imports bitsandbytes, which cannot find a CUDA library matching its binary:
"CUDA Setup failed despite GPU being available" before a single step.  The fix is an install whose
bitsandbytes build matches torch's CUDA (python -m bitsandbytes says what it found).
"""
import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainingArguments
from trl import SFTTrainer

name = "meta-llama/Meta-Llama-3-8B-Instruct"
bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb, device_map="auto")
tokenizer = AutoTokenizer.from_pretrained(name)
dataset = load_dataset("json", data_files="train.jsonl", split="train")
peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM")
training_arguments = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=4,
    optim="paged_adamw_32bit",
    learning_rate=2e-4,
    bf16=True,
    max_steps=500,
)
trainer = SFTTrainer(model=model, train_dataset=dataset, peft_config=peft_config, dataset_text_field="text",
                     max_seq_length=None, tokenizer=tokenizer, args=training_arguments, packing=False)
trainer.train()
