import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

from corpus import PackedCorpus

accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-1.7B")
tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-1.7B")
loader = DataLoader(PackedCorpus("corpus/", tokenizer, seq_len=2048), batch_size=8, num_workers=4)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
