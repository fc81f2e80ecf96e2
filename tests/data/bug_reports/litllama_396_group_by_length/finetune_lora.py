"""LoRA fine-tune of LLaMA-7B on Alpaca with lit-llama's finetune/lora.py on one V100 (Lightning-AI/lit-llama#396).

Every micro-batch is padded to its own longest sample, but samples are drawn at random, so most batches
are padded close to the longest instruction: grouping samples of similar length cut the epoch from
8 h 37 min to 6 h 15 min in the reporter's measurement.
"""
import lightning as L
import torch

from lit_llama.lora import lora, mark_only_lora_as_trainable
from lit_llama.model import LLaMA, LLaMAConfig

learning_rate = 3e-4
batch_size = 128
micro_batch_size = 4
gradient_accumulation_iters = batch_size // micro_batch_size
max_iters = 50000 * 3 // micro_batch_size
max_seq_length = 256
lora_r = 8
lora_alpha = 16


def get_batch(fabric, data):
    ix = torch.randint(len(data), (micro_batch_size,))
    input_ids = [data[i]["input_ids"].type(torch.int64) for i in ix]
    labels = [data[i]["labels"].type(torch.int64) for i in ix]
    max_len = max(len(s) for s in input_ids)

    def pad_right(x, pad_id):
        return torch.cat((x, torch.full((max_len - len(x),), pad_id, dtype=x.dtype)))

    x = torch.stack([pad_right(x, pad_id=0) for x in input_ids])
    y = torch.stack([pad_right(x, pad_id=-1) for x in labels])
    return fabric.to_device((x, y))


def main():
    fabric = L.Fabric(accelerator="cuda", devices=1, precision="bf16-true")
    with fabric.init_module(), lora(r=lora_r, alpha=lora_alpha, dropout=0.05, enabled=True):
        model = LLaMA(LLaMAConfig.from_name("7B"))
    mark_only_lora_as_trainable(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model, optimizer = fabric.setup(model, optimizer)
    train_data = torch.load("data/alpaca/train.pt")
    for iter_num in range(max_iters):
        input_ids, targets = get_batch(fabric, train_data)
        logits = model(input_ids)
        loss = torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.size(-1)),
                                                 targets[..., 1:].reshape(-1), ignore_index=-1)
        fabric.backward(loss / gradient_accumulation_iters)
        if (iter_num + 1) % gradient_accumulation_iters == 0:
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
