"""A raw PyTorch loop whose settings come from config.yaml, each overridable by a flag.

Used by tests/test_observed.py: the audit parses config.yaml, the workload runs with
``--batch-size 8 --grad-accum 2 --precision fp32``.  When ``OBSERVE_TRUTH`` names a file,
the script writes there, after every optimizer step, the settings it really used, read from
its own objects (the test compares them with what the harness observed).
"""
import argparse
import json
import os
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(Path(__file__).with_name("config.yaml")))
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--grad-accum", type=int)
    parser.add_argument("--precision", choices=["fp32", "bf16"])
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    batch_size = args.batch_size or cfg["batch_size"]
    accum = args.grad_accum or cfg["grad_accum"]
    precision = args.precision or cfg["precision"]

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 2, (512,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=cfg["num_workers"], drop_last=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    loss_fn = nn.CrossEntropyLoss()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    truth = os.environ.get("OBSERVE_TRUTH")
    for epoch in range(50):
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = loss_fn(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                if truth:  # what this program uses, from its own objects (before the step the harness may end)
                    Path(truth).write_text(json.dumps({
                        "batch_size": loader.batch_size, "grad_accum_steps": accum,
                        "precision": {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype],
                        "optimizer": type(optimizer).__name__, "lr": optimizer.param_groups[0]["lr"],
                        "dataloader_workers": loader.num_workers, "intra_op_threads": torch.get_num_threads(),
                        "seq_len": None, "attention_impl": None, "gradient_checkpointing": False,
                        "lora_rank": None, "warmup_steps": 0, "model_name": None, "padding": None,
                        "group_by_length": False}))
                optimizer.step()
                optimizer.zero_grad()


if __name__ == "__main__":
    main()
