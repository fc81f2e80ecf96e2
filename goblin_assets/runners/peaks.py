"""Peak throughput of devices: the MFU denominator and the roofline ridge.

GPU peaks are dense (no sparsity) datasheet/documentation figures; CPU peaks
are measured on the machine with a short GEMM probe and labelled measured.
Sources: ``docs/sources.md`` "Peak throughput".
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass



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


@functools.lru_cache(maxsize=8)
def measure_cpu_peak_tflops(n: int = 1024, seconds: float = 0.6, threads: int | None = None) -> float:
    """Measured fp32 GEMM throughput of this CPU (TFLOP/s), once per process and thread count.

    Times ``torch.mm`` of two ``n x n`` fp32 matrices (2·n³ FLOPs each) for about
    ``seconds`` and keeps the best repeat.  Not cached across processes: a peak
    measured while the machine was busy would make every later MFU too high.
    Source: measured (no table exists for arbitrary CPUs).
    """
    import torch

    nthreads = threads or torch.get_num_threads()
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
    return 2 * n**3 / best / 1e12


@functools.lru_cache(maxsize=8)
def measure_cpu_mem_bandwidth_tb_s(mib: int = 256, seconds: float = 0.5, threads: int | None = None) -> float:
    """Measured memory bandwidth of this CPU (TB/s), the memory roof of the CPU roofline.

    Times ``dst.copy_(src)`` of two ``mib`` MiB fp32 buffers (much larger than
    any cache) for about ``seconds`` and keeps the best repeat; bytes moved per
    copy are ``2 * mib`` MiB (one read, one write).  Measured once per process
    and thread count, like :func:`measure_cpu_peak_tflops`.

    Units
    -----
    TB/s (1e12 bytes per second), the unit of :attr:`DevicePeak.hbm_tb_s`.

    Source
    ------
    measured (a STREAM-copy-like probe; no table exists for arbitrary CPUs).
    """
    import torch

    nthreads = threads or torch.get_num_threads()
    old = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        n = mib * 2**20 // 4
        src, dst = torch.ones(n), torch.empty(n)
        dst.copy_(src)
        best, t_end = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return 2 * mib * 2**20 / best / 1e12


def cpu_peak(threads: int | None = None) -> DevicePeak:
    """This machine's CPU as a :class:`DevicePeak`: measured fp32 GEMM peak and memory bandwidth.

    The bf16 field repeats the fp32 figure (CPU GEMMs here run fp32); ``hbm_gb``
    is the host's physical memory.  Source: measured.
    """
    import psutil

    tflops = measure_cpu_peak_tflops(threads=threads)
    return DevicePeak("CPU", tflops, tflops, measure_cpu_mem_bandwidth_tb_s(threads=threads),
                      psutil.virtual_memory().total / 1e9, "measured on this machine (GEMM and copy probes)")
