import torch
from torch.utils.data import DataLoader
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup
from peft import LoraConfig, get_peft_model

torch.set_num_threads(4)
model = AutoModelForCausalLM.from_pretrained("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16))
model.gradient_checkpointing_enable()

train_loader = DataLoader(dataset, batch_size=32, shuffle=True)  # noqa: F821
opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
sched = get_linear_schedule_with_warmup(opt, 250, 10_000)
scaler = torch.cuda.amp.GradScaler()

for step, batch in enumerate(train_loader):
    with torch.autocast("cuda"):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    sched.step()
