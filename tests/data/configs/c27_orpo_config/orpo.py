import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.experimental.orpo import ORPOConfig, ORPOTrainer

MODEL = "mistralai/Mistral-7B-v0.3"

tokenizer = AutoTokenizer.from_pretrained(MODEL)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16, attn_implementation="flash_attention_2")

prefs = load_dataset("trl-lib/ultrafeedback_binarized", split="train")

peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])

args = ORPOConfig(
    output_dir="mistral-orpo",
    beta=0.1,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=8,
    optim="paged_adamw_8bit",
    num_train_epochs=1,
    warmup_steps=10,
)

trainer = ORPOTrainer(model=model, args=args, train_dataset=prefs, processing_class=tokenizer,
                      peft_config=peft_config)
trainer.train()
