"""DPO training with TRL on an NVIDIA GB10, model compiled with mode="reduce-overhead" (pytorch/pytorch#188150).

Each batch is padded to its own longest sequence, so CUDAGraphs records a new graph for every new size:
the 1.5x seen in a fixed-shape test became no speedup at all (22 s -> 25 s per step).
"""
import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

MODEL = "Qwen/Qwen2.5-1.5B-Instruct"

tokenizer = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
model = torch.compile(model, mode="reduce-overhead")

prefs = load_dataset("trl-lib/ultrafeedback_binarized", split="train")

config = DPOConfig(
    output_dir="qwen-dpo",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=4,
    learning_rate=5e-7,
    bf16=True,
    max_length=1024,
    report_to="none",
)
DPOTrainer(model=model, args=config, train_dataset=prefs, processing_class=tokenizer).train()
