"""Peak throughput of devices: the MFU denominator and the roofline ridge.

GPU peaks are dense (no sparsity) datasheet/documentation figures; CPU peaks
are measured on the machine with a short GEMM probe and labelled measured.
Sources: ``shared/profiling_facts.md`` section 6.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass

from goblin_assets import goblin_home


@dataclass(frozen=True)
class DevicePeak:
    """Dense peak matrix throughput (TFLOP/s) per precision and HBM bandwidth (TB/s)."""

    name: str
    bf16_tflops: float
    fp32_tflops: float
    hbm_tb_s: float
    hbm_gb: float
    source: str


#: Dense peaks.  MI300X/MI325X: ROCm docs "MI300X peak-performance capabilities"
#: (2048 FLOPS/clock/CU BF16); NVIDIA: datasheets halved for "with sparsity".
PEAKS: dict[str, DevicePeak] = {
    "MI300X": DevicePeak("MI300X", 1307.4, 163.4, 5.3, 192,
                         "ROCm docs, conceptual/gpu-arch/mi300.md, 'Peak-performance capabilities of the MI300X'"),
    "MI325X": DevicePeak("MI325X", 1307.4, 163.4, 6.0, 256, "AMD MI325X product page (via secondary sources)"),
    "H100": DevicePeak("H100", 989.4, 66.9, 3.35, 80, "NVIDIA H100 SXM datasheet (dense = half of 'with sparsity')"),
    "H200": DevicePeak("H200", 989.4, 67.0, 4.8, 141, "NVIDIA H200 SXM datasheet (same GH100 compute as H100)"),
    "A100": DevicePeak("A100", 312.0, 19.5, 2.039, 80, "NVIDIA A100 datasheet nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
}


def lookup_gpu_peak(device_name: str | None) -> DevicePeak | None:
    """Match a device name (``torch.cuda.get_device_name``) to :data:`PEAKS`; None if unknown."""
    if not device_name:
        return None
    up = device_name.upper().replace(" ", "")
    for key, peak in PEAKS.items():
        if key in up:
            return peak
    return None


def measure_cpu_peak_tflops(n: int = 1024, seconds: float = 0.6, threads: int | None = None) -> float:
    """Measured fp32 GEMM throughput of this CPU (TFLOP/s), cached per host and thread count.

    Times ``torch.mm`` of two ``n x n`` fp32 matrices (2·n³ FLOPs each) for about
    ``seconds`` and keeps the best repeat.  Source: measured (no table exists
    for arbitrary CPUs).
    """
    import torch

    nthreads = threads or torch.get_num_threads()
    key = f"{platform.node()}|{platform.processor()}|{torch.__version__}|{nthreads}|{n}"
    cache = goblin_home() / "cpu_peak.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return float(known[key])
    old = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best, t_end = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    tflops = 2 * n**3 / best / 1e12
    known[key] = tflops
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(known))
    tmp.replace(cache)
    return tflops
