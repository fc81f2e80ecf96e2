import torch

init_from = "scratch"
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 40
learning_rate = 6e-4
decay_lr = False
warmup_iters = 2000
dtype = "float16"
compile = True

ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = torch.amp.autocast(device_type="cuda", dtype=ptdtype)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))  # noqa: F821
