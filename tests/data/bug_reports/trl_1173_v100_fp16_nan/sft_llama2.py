"""SFT of Llama-2-7b with TRL's SFTTrainer on four 16 GB V100s (huggingface/trl#1173).

After about 23k of 400k steps the training loss logs 0.0 and the evaluation loss nan; the reporter cannot
switch to bf16 because the V100 has no bf16 support.
"""
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

MODEL = "meta-llama/Llama-2-7b-hf"

tokenizer = AutoTokenizer.from_pretrained(MODEL)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype="float16")

train = load_dataset("json", data_files="train.jsonl", split="train")

config = SFTConfig(
    output_dir="llama2-sft",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=4,
    learning_rate=2e-4,
    max_steps=400000,
    fp16=True,
    max_seq_length=1024,
    logging_steps=50,
    report_to="none",
)
trainer = SFTTrainer(model=model, args=config, train_dataset=train, tokenizer=tokenizer,
                     peft_config=LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM"))
trainer.train()
