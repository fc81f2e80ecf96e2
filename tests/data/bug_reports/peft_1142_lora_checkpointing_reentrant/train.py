"""LoRA on Llama-2-7b with gradient checkpointing on one A100 (huggingface/peft#1142), the reporter's
reproduction reduced to its training loop: frozen embeddings, checkpointing switched on with the model's
default (reentrant) variant.  The reporter finds the reentrant route either loses the adapters'
gradients or, made to work, trains more than twice as slowly as a full fine-tune.
"""
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

model_id, vocab = "meta-llama/Llama-2-7b-hf", 32000
seq_len = 1024
bs = 8

model = AutoModelForCausalLM.from_pretrained(model_id, device_map=0, torch_dtype=torch.bfloat16, use_cache=False)
model.get_input_embeddings().requires_grad_(False)         # frozen embeddings
model.gradient_checkpointing_enable()
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                         task_type="CAUSAL_LM"))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

for step in range(50):
    ids = torch.randint(0, vocab, (bs, seq_len), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
