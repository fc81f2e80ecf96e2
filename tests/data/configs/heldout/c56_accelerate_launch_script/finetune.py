import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorWithPadding

from instructions import load_instructions

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mistralai/Mistral-7B-v0.1")
parser.add_argument("--per_device_batch_size", type=int, default=8)
parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=5e-5)
parser.add_argument("--max_length", type=int, default=2048)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
tokenizer = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model)
data = load_instructions(tokenizer, max_length=args.max_length)
loader = DataLoader(data, batch_size=args.per_device_batch_size, shuffle=True,
                    collate_fn=DataCollatorWithPadding(tokenizer))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
