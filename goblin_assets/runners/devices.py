"""Device facts rules and reports read: architecture, bf16 / fp8 matrix support, memory.

Rules declare the devices they apply to (``devices: [gfx942, sm_80]``) and
read ``device.*`` in their conditions; the report's device text comes from
here and from the run's measurements, never from a constant for another part.
A measured value wins: the harness reports the architecture the runtime
gives (``gcnArchName`` on ROCm, the compute capability on CUDA) and the total
device memory; the table fills what a recording does not say.

Sources: AMD ROCm documentation, "GPU hardware specifications"
(rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html: LLVM target,
memory, supported data types); NVIDIA "CUDA GPUs - compute capability"
(developer.nvidia.com/cuda-gpus) and the product datasheets (memory, bf16 on
compute capability 8.0 and later, fp8 on 8.9 and 9.0).  docs/sources.md,
"Device table".
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Device:
    """One accelerator part: ``arch`` (LLVM target or ``sm_XY``), matrix-unit dtypes, memory (GB, 1e9 bytes)."""

    name: str
    arch: str
    bf16: bool
    fp8: bool
    memory_gb: float


#: Known parts, most specific name first (a device name is matched by the first key it contains).
DEVICES: tuple[Device, ...] = (
    Device("MI325X", "gfx942", True, True, 256), Device("MI300X", "gfx942", True, True, 192),
    Device("MI300A", "gfx942", True, True, 128), Device("MI355X", "gfx950", True, True, 288),
    Device("MI350X", "gfx950", True, True, 288), Device("MI250X", "gfx90a", True, False, 128),
    Device("MI250", "gfx90a", True, False, 128), Device("MI210", "gfx90a", True, False, 64),
    Device("MI100", "gfx908", True, False, 32), Device("Radeon RX 9070", "gfx1201", True, True, 16),
    Device("H200", "sm_90", True, True, 141), Device("H100", "sm_90", True, True, 80),
    Device("GH200", "sm_90", True, True, 96), Device("B200", "sm_100", True, True, 192),
    Device("L40S", "sm_89", True, True, 48), Device("L4", "sm_89", True, True, 24),
    Device("RTX 4090", "sm_89", True, True, 24), Device("A100", "sm_80", True, False, 80),
    Device("A10G", "sm_86", True, False, 24), Device("A10", "sm_86", True, False, 24),
    Device("RTX 3090", "sm_86", True, False, 24), Device("V100", "sm_70", False, False, 32),
    Device("T4", "sm_75", False, False, 16),
)

#: Keys of the ``device.*`` root of detect conditions.
DEVICE_KEYS: tuple[str, ...] = ("name", "arch", "bf16", "fp8", "memory_gb", "known")

#: bf16 matrix support by architecture family where the part is not in :data:`DEVICES`.
_BF16_ARCH = re.compile(r"^(gfx9(0a|4\d|5\d)|gfx1[12]\d\d|sm_(8\d|9\d|1\d\d))")
_FP8_ARCH = re.compile(r"^(gfx9(4\d|5\d)|gfx12\d\d|sm_(89|9\d|1\d\d))")


def lookup(name: str | None) -> Device | None:
    """The table entry whose name the device name contains (``AMD Instinct MI300X`` -> MI300X), or None."""
    if not name:
        return None
    up = name.upper().replace("-", " ")
    return next((d for d in DEVICES if d.name.upper() in up), None)


def device_facts(name: str | None, arch: str | None = None, memory_gb: float | None = None,
                 cpu_bf16: bool | None = None) -> dict[str, Any]:
    """The ``device.*`` values of a run: measured ``arch``/``memory_gb`` first, then the table by ``name``.

    A CPU run (``name`` ``cpu`` or None) has ``arch`` ``cpu`` and ``bf16``
    from the host facts' CPU bf16 matrix instructions (``cpu_bf16``).  A part
    neither measured nor in the table has None where a fact is unknown
    (conditions on it then say "unknown" instead of guessing).
    """
    if not name or name.lower() == "cpu":
        return {"name": "cpu", "arch": "cpu", "bf16": cpu_bf16, "fp8": False, "memory_gb": memory_gb, "known": True}
    row = lookup(name)
    arch = (arch or "").split(":")[0] or (row.arch if row else None)
    bf16 = row.bf16 if row else (bool(_BF16_ARCH.match(arch)) if arch else None)
    fp8 = row.fp8 if row else (bool(_FP8_ARCH.match(arch)) if arch else None)
    return {"name": name, "arch": arch, "bf16": bf16, "fp8": fp8,
            "memory_gb": memory_gb if memory_gb is not None else (row.memory_gb if row else None),
            "known": row is not None}


def matches(patterns: list[str], facts: dict[str, Any]) -> bool:
    """Whether a rule's ``devices`` list names this device: by architecture (``gfx942``, ``sm_8*``
    prefix patterns with ``*``), by part (``MI300X``) or ``cpu``.  An empty list matches every device."""
    if not patterns:
        return True
    arch, name = str(facts.get("arch") or ""), str(facts.get("name") or "").upper()
    for pat in patterns:
        if pat.endswith("*") and arch.startswith(pat[:-1]):
            return True
        if pat == arch or (pat.upper() in name and pat != "cpu") or (pat == "cpu" and arch == "cpu"):
            return True
    return False
