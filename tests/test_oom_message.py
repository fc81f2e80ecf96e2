"""The out-of-memory failure line: sizes parsed from allocator texts, what the harness saw, the limit last."""
from __future__ import annotations

import json

import pytest

from goblin_assets.runners import harness
from goblin_assets.runners.oom import OOM_NAME, oom_failure, requested_bytes

HIP_OOM = ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "191.98 GiB of which 1.02 GiB is free. Of the allocated memory 187.40 GiB is allocated by PyTorch")


@pytest.mark.parametrize("text, n", [
    ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes. Error code 12", 1073741824),
    (HIP_OOM, 2 * 1024**3),
    ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity)", 20 * 1024**2),
    ("MemoryError", None),
])
def test_allocation_size_is_parsed_when_the_error_names_one(text, n):
    assert requested_bytes(text) == n


def test_device_oom_names_device_memory_as_the_limit_not_the_cap(tmp_path):
    assert harness.OOM_NAME == OOM_NAME  # the child and the parent agree on the file
    (tmp_path / OOM_NAME).write_text(json.dumps({
        "steps_done": 1, "warmup": 2, "phase": "backward", "where": "train.py:41 in train_step", "error": HIP_OOM,
        "peak_rss_bytes": 3_000_000_000, "address_space_bytes": None, "batch_bytes": 4_194_304, "optimizers": 1,
        "params_bytes": 14_000_000_000, "grads_bytes": 14_000_000_000, "optimizer_state_bytes": 28_000_000_000,
        "device_allocated_bytes": 187_000_000_000, "device_reserved_bytes": 190_000_000_000}))
    line, state = oom_failure("train.py", "", tmp_path, cap_gb=16.0)
    assert line == (
        "train.py: ran out of memory in step 2 (warm-up), during backward, at train.py:41 in train_step: an "
        "allocation of 2.15 GB (2147483648 bytes) failed; held at the time: peak resident memory 3.00 GB, "
        "parameters 14.00 GB + gradients 14.00 GB + optimizer state 28.00 GB (1 optimizer), last DataLoader batch "
        "4.2 MB, device memory allocated 187.00 GB (reserved 190.00 GB); the limit hit: the device's memory "
        "(191.98 GiB total)")
    assert state["phase"] == "backward" and "cap" not in line


def test_without_the_harness_state_the_rest_is_not_observable(tmp_path):
    line, state = oom_failure("train.py", "MemoryError\n", tmp_path, cap_gb=None)
    assert state is None
    assert line == ("train.py: ran out of memory (where and what held memory: not observable, the harness recorded "
                    "no state): an allocation failed (its size: not observable, the error text names none); the limit "
                    "hit: the machine's memory")
