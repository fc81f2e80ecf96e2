"""What a test workload really used, written from its own objects (issue 27).

A workload under ``tests/data`` calls :func:`write` before an optimizer step when ``OBSERVE_TRUTH``
names a file (only the tests set it); ``tests/test_observed.py`` compares that file, field by field,
with what the harness observed in the same run, never with the parser.  Standard library and torch only.
"""
import json
import os
from pathlib import Path

import torch

_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def write(model, loader, optimizer, inputs, *, accum, autocast=None, padding=None, warmup_steps=0, seq_len=None):
    """Write every ConfigDict field as this program uses it to ``$OBSERVE_TRUTH`` (nothing when unset).

    ``inputs``: the batch's input tensor; ``accum``: the backward passes the loop takes per optimizer
    step; ``autocast``: the dtype of the autocast region the loop trains in (None: none); ``padding``:
    how the program pads its token batches (None: it does not); ``warmup_steps``: its LR scheduler's
    warm-up (0: it has no scheduler); ``seq_len``: the widest token batch the program has fed (default: the
    width of ``inputs`` when it holds token ids, else None).
    """
    path = os.environ.get("OBSERVE_TRUTH")
    if not path:
        return
    config = getattr(model, "config", None)
    dtype = autocast or next(p.dtype for p in model.parameters() if p.requires_grad)
    tokens = inputs.dim() >= 2 and not inputs.dtype.is_floating_point
    Path(path).write_text(json.dumps({
        "model_name": getattr(config, "_name_or_path", None) or None,
        "batch_size": loader.batch_size, "grad_accum_steps": accum, "seq_len": seq_len or (inputs.shape[1] if tokens else None),
        "precision": _PRECISION[dtype], "optimizer": type(optimizer).__name__,
        "attention_impl": getattr(config, "_attn_implementation", None),
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
        "lora_rank": None if not hasattr(model, "peft_config") else model.peft_config["default"].r,
        "dataloader_workers": loader.num_workers, "intra_op_threads": torch.get_num_threads(),
        "lr": max(g.get("initial_lr", g["lr"]) for g in optimizer.param_groups),
        "warmup_steps": warmup_steps,
        "padding": padding, "group_by_length": "LengthGrouped" in type(loader.sampler).__name__}))
