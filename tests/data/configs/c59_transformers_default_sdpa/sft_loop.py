import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorWithPadding, get_cosine_schedule_with_warmup

from chats import load_chat_pairs

model_id = "meta-llama/Llama-3.2-3B-Instruct"
tokenizer = AutoTokenizer.from_pretrained(model_id)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(model_id, torch_dtype=torch.bfloat16).cuda()
model.gradient_checkpointing_enable()

pairs = load_chat_pairs("chats.jsonl", tokenizer, max_length=1536)
loader = DataLoader(pairs, batch_size=4, shuffle=True, collate_fn=DataCollatorWithPadding(tokenizer))
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=30, num_training_steps=3000)

model.train()
for batch in loader:
    batch = {k: v.cuda() for k, v in batch.items()}
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
