"""The out-of-memory failure line: sizes parsed from allocator texts, what the harness saw, the limit last."""
from __future__ import annotations

import json

import pytest

from goblin_assets.runners import harness
from goblin_assets.runners.oom import OOM_NAME, oom_failure, parse_device_oom, requested_bytes

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


# Device out-of-memory messages as public reports quote them (numbers kept, wording is torch's own).
#: compressed-tensors#587 (torch >= 2.1 format): 1.96 GiB asked, 1.08 free + 1.83 reserved but unallocated.
FRAGMENTED = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
              "79.18 GiB of which 1.08 GiB is free. Including non-PyTorch memory, this process has 78.09 GiB memory "
              "in use. Of the allocated memory 75.31 GiB is allocated by PyTorch, and 1.83 GiB is reserved by PyTorch "
              "but unallocated. If reserved but unallocated memory is large try setting "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


@pytest.mark.parametrize("text, kind", [
    (FRAGMENTED, "fragmentation"),
    # vllm#7721: 16 GiB asked with 0.18 GiB free and 0.33 GiB cached
    ("CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 44.53 GiB of which 187.94 MiB "
     "is free. Process 3909982 has 44.34 GiB memory in use. Of the allocated memory 43.67 GiB is allocated by "
     "PyTorch, and 335.07 MiB is reserved by PyTorch but unallocated.", "shortage"),
    # kaito#976: a private pool (CUDA Graphs) between the two numbers
    ("CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of 15.77 GiB of which 514.19 MiB "
     "is free. Process 562167 has 15.25 GiB memory in use. Of the allocated memory 13.73 GiB is allocated by "
     "PyTorch, with 46.00 MiB allocated in private pools (e.g., CUDA Graphs), and 736.86 MiB is reserved by "
     "PyTorch but unallocated.", "fragmentation"),
    # SimpleTuner#786: two other processes hold 1.6 GiB, the request is 54 MiB
    ("CUDA out of memory. Tried to allocate 54.00 MiB. GPU 0 has a total capacity of 23.63 GiB of which 34.56 MiB "
     "is free. Process 1108671 has 558.00 MiB memory in use. Process 1114104 has 1.03 GiB memory in use. "
     "Including non-PyTorch memory, this process has 21.22 GiB memory in use. Of the allocated memory 20.73 GiB is "
     "allocated by PyTorch, and 35.86 MiB is reserved by PyTorch but unallocated.", "other_processes"),
    # a single request larger than the card, the message wrapped over lines as pasted into a guide
    ("Tried to allocate 15.00 GiB.\nGPU 0 has a total capacity of 14.56 GiB of which 6.91 GiB is free.\n"
     "Including non-PyTorch memory, this process has 7.65 GiB memory in use.\nOf the allocated memory 7.23 GiB is "
     "allocated by PyTorch,\nand 301.94 MiB is reserved by PyTorch but unallocated.", "exceeds_device"),
    # torch < 2.1 (LLaVA#1152): 284 MiB asked, 99.5 MiB free, 30.44 reserved of which 27.12 allocated
    ("CUDA out of memory. Tried to allocate 284.00 MiB (GPU 0; 31.75 GiB total capacity; 27.12 GiB already "
     "allocated; 99.50 MiB free; 30.44 GiB reserved in total by PyTorch)", "fragmentation"),
    # torch < 2.1 with a per-process memory fraction: the allowed share, not the device, was reached
    ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.70 GiB total capacity; 4.06 GiB already "
     "allocated; 29.75 MiB free; 4.08 GiB allowed; 4.08 GiB reserved in total by PyTorch)", "memory_fraction"),
])
def test_a_device_oom_is_read_into_the_allocators_numbers_and_named(text, kind):
    d = parse_device_oom(text)
    assert d is not None and d.kind == kind
    assert d.sentence().split("; ")[0].startswith(f"{d.request_bytes / 1024**3:.2f} GiB requested on GPU 0")


def test_the_numbers_are_the_messages_and_text_without_them_reads_as_none():
    d = parse_device_oom("first try\n" + FRAGMENTED.replace("1.96 GiB", "9.00 GiB") + "\nthen\n" + FRAGMENTED)
    gib = 1024**3
    assert (d.request_bytes, d.total_bytes, d.free_bytes) == (int(1.96 * gib), int(79.18 * gib), int(1.08 * gib))
    assert (d.allocated_bytes, d.reserved_unallocated_bytes, d.this_process_bytes) == (
        int(75.31 * gib), int(1.83 * gib), int(78.09 * gib))
    assert d.other_processes_bytes == int(79.18 * gib) - int(1.08 * gib) - int(78.09 * gib)
    assert "0.95 GiB to spare" in d.sentence() and "lower its peak as well" in d.sentence()
    for text in (HIP_OOM, "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes", ""):
        assert parse_device_oom(text) is None


def test_the_fragmentation_rule_reads_the_failure_and_respects_an_allocator_setting_already_made():
    from goblin_assets.contracts import ConfigDict, RunMetrics, RunProvenance
    from goblin_assets.host import HostFacts
    from goblin_assets.kb.rules import detect_context, load_kb, match_rules
    from goblin_assets.measure.signals import run_signals

    kb = load_kb()
    host = HostFacts(source="set", cores=8, online_cpus=8, affinity_cpus=8, numa_nodes=1, amx_bf16=False,
                     avx512_bf16=False)

    def fired(text: str, env: dict, cuda: str | None = "12.4") -> set[str]:
        prov = RunProvenance(kind="modelled", device="NVIDIA H100 80GB HBM3", torch_version="2.5.1", cuda_version=cuda)
        run = RunMetrics(ok=False, failure=f"train.py: exited with code 1: {text}", steps=0,
                         signals=run_signals(None, text), provenance=prov)
        ctx = detect_context(ConfigDict(), run, host, env=env, cores=8, packages={})
        return {m.rule_id for m in match_rules(kb, ctx) if m.fired}

    rule = "memory.oom_fragmentation_expandable_segments"
    assert rule in fired(FRAGMENTED, {})
    assert rule not in fired(FRAGMENTED, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert rule not in fired(FRAGMENTED, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert rule not in fired(FRAGMENTED.replace("1.83 GiB is reserved", "0.10 GiB is reserved"), {})  # a shortage
    assert rule not in fired(FRAGMENTED, {}, cuda=None)  # a CPU run: the rule is for CUDA's allocator


def test_a_live_device_oom_line_ends_with_the_allocators_numbers(tmp_path):
    line, state = oom_failure("train.py", FRAGMENTED, tmp_path, cap_gb=None)
    assert state is None
    assert line.startswith("train.py: ran out of memory (where and what held memory: not observable")
    assert "an allocation of 2.10 GB (2104533975 bytes) failed" in line
    assert line.endswith("the limit hit: the device's memory (79.18 GiB total); the allocator's numbers "
                         "(fragmentation): " + parse_device_oom(FRAGMENTED).sentence())
