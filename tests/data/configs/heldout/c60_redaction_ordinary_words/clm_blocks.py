"""Continued pre-training: split documents into token sequences of BLOCK tokens.

A basic training loop on top of the Trainer; the auth mode is read from the
environment, the Hub token is pasted below (do not commit this file).
"""
import os

from datasets import load_dataset
from huggingface_hub import login
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, default_data_collator

HF_TOKEN = "hf_Zq8Lm2Nb7Vc4Xs1Dk9Fj3Gh6Pw5Ty0Ru"
os.environ["WANDB_API_KEY"] = "a3f9c2e71b8d4056af12c9e8b7d63f0e4a5b6c7d"
login(token=HF_TOKEN)

BLOCK = 1024
auth_mode = os.environ.get("AUTH_MODE", "token")
tok = AutoTokenizer.from_pretrained("openai-community/gpt2-medium")
tok.pad_token = tok.eos_token
model = AutoModelForCausalLM.from_pretrained("openai-community/gpt2-medium")

raw = load_dataset("wikitext", "wikitext-103-raw-v1", split="train")


def group_texts(examples):
    # concatenate, then cut into token sequences; drop the remainder
    ids = sum(examples["input_ids"], [])
    total = (len(ids) // BLOCK) * BLOCK
    return {"input_ids": [ids[i:i + BLOCK] for i in range(0, total, BLOCK)],
            "labels": [ids[i:i + BLOCK] for i in range(0, total, BLOCK)]}


lm = raw.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"]).map(group_texts, batched=True)
args = TrainingArguments(output_dir="gpt2m-wiki", per_device_train_batch_size=8, gradient_accumulation_steps=4,
                         learning_rate=5e-4, warmup_steps=1000, bf16=True, dataloader_num_workers=4)
Trainer(model=model, args=args, train_dataset=lm, data_collator=default_data_collator).train()
