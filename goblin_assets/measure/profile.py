"""profile_run: a few steps of the workload under torch.profiler, as RunMetrics."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from goblin_assets.contracts import KernelShare, RunMetrics, RunProvenance
from goblin_assets.host import HostFacts, current_host
from goblin_assets.measure.invariants import judge
from goblin_assets.measure.signals import run_signals
from goblin_assets.measure.waste import waste_budget
from goblin_assets.runners.base import Runner
from goblin_assets.runners.categories import is_fused_attention
from goblin_assets.runners.peaks import lookup_gpu_peak, measure_cpu_peak_tflops
from goblin_assets.runners.result import HarnessResult, RawRun
from goblin_assets.measure.step_outliers import outlier_steps, step_events
from goblin_assets.runners.trace import TraceSummary, read_trace
from goblin_assets.runners.workload import Workload


def run_provenance(raw: RawRun, host: HostFacts | None = None) -> RunProvenance:
    """The provenance of a measured run: device, profiler and versions from the harness, host from ``host``.

    ``host`` defaults to :func:`goblin_assets.host.current_host` (the machine
    the child ran on); ``cpu_count`` is its online CPU count.
    """
    r = raw.result
    host = host or current_host()
    return RunProvenance(
        kind="measured", device=r.device_name or r.device, arch=r.device_arch,
        profiler="torch.profiler" if raw.mode == "profile" else None,
        source=str(raw.run_dir), torch_version=r.torch_version,
        hip_version=r.hip_version, cuda_version=r.cuda_version,
        host=host.hostname, cpu_count=host.online_cpus,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def failed_metrics(raw: RawRun, workload: Workload) -> RunMetrics:
    """A failed RunMetrics: the reason, the tail of stderr, and the settings the harness observed before the
    failure (``RUN_DIR/observed.json``, written after each warm-up step: None when the run failed before
    one ended, or the file does not validate)."""
    return RunMetrics(ok=False, failure=raw.failure, stderr_tail=raw.stderr_tail, workload=workload.name,
                      unit=workload.unit, run_dir=str(raw.run_dir), observed=_observed_before(raw),
                      provenance=RunProvenance(kind="measured", source=str(raw.run_dir)))


def _observed_before(raw: RawRun) -> dict | None:
    from goblin_assets.runners.result import OBSERVED_NAME, ObservedRecord

    p = Path(raw.run_dir) / OBSERVED_NAME if raw.run_dir else None
    if p is None or not p.is_file():
        return None
    try:
        return ObservedRecord.model_validate_json(p.read_text(encoding="utf-8")).model_dump()
    except (OSError, ValueError):
        return None


def timed_metrics(raw: RawRun, workload: Workload, host: HostFacts | None = None) -> RunMetrics:
    """The RunMetrics of a measured run without the profiler (a benchmark repeat, a sketch recording).

    Step time and throughput come from the harness's clock (:func:`throughput_fields`); the waste
    budget is empty and ``not_observable`` says why (no trace was recorded).
    """
    m = RunMetrics(workload=workload.name, unit=workload.unit, run_dir=str(raw.run_dir),
                   provenance=run_provenance(raw, host), warnings=list(raw.result.warnings),
                   **throughput_fields(raw, workload))
    m.signals = run_signals(raw.result, raw.stderr_tail)
    m.not_observable["waste_budget"] = f"a {raw.mode} run times its steps without the profiler: no trace"
    return m


def throughput_fields(raw: RawRun, workload: Workload) -> dict:
    """Step time, samples/s and tokens/s of a run's measured steps (from the harness's clock), and what the
    harness saw besides: the prefetch steps added to the warm-up and the parameters' NaN/Inf check.

    Units: ``step_time_s`` median seconds per step; throughput = total counted
    over total time of the measured steps.
    """
    per = raw.result.per_step
    times = [p.step_time_s for p in per]
    total_t = sum(times)
    samples = sum(p.samples for p in per)
    tokens = sum(p.tokens for p in per)
    nonpad = sum(p.nonpad_tokens for p in per)
    out = {
        "steps": len(per),
        "step_time_s": statistics.median(times),
        "step_times_s": times,
        "all_step_times_s": list(raw.result.all_step_times_s),
        "step_outliers": outlier_steps(raw.result.all_step_times_s,
                                       max(len(raw.result.all_step_times_s) - len(per), 0),
                                       events=step_events(raw.result)),
        "samples_per_step": samples / len(per),
        "samples_per_sec": samples / total_t if total_t > 0 and samples else None,
        "tokens_per_sec": tokens / total_t if total_t > 0 and tokens else None,
        "padding_share": 1.0 - nonpad / tokens if tokens else None,
        "prefetch_warmup_steps": raw.result.prefetch_warmup_steps,
        "dataset_in_memory": raw.result.dataset_in_memory,
        "nonfinite_step": raw.result.first_nonfinite_step,
        "nonfinite_params": list(raw.result.nonfinite_params),
        "observed": raw.result.observed.model_dump() if raw.result.observed is not None else None,
        "dynamo": raw.result.dynamo,
    }
    return out


def profile_run(workload: Workload, runner: Runner, steps: int = 10, warmup: int = 2,
                script: Path | None = None, env: dict[str, str] | None = None, unset_env: list[str] | None = None,
                label: str = "", host: HostFacts | None = None) -> RunMetrics:
    """Run ``workload`` for ``warmup`` + ``steps`` optimizer steps, profiling the last ``steps``.

    Parameters
    ----------
    workload, runner:
        What to run and how (a replay runner returns its recording as is).
    steps, warmup:
        Profiled optimizer steps, and unprofiled ones before them.
    script, env, unset_env, label:
        A patched entry script, environment changes and a run-folder label
        (see ``Runner.run``).
    host:
        The machine's facts (default :func:`goblin_assets.host.current_host`):
        the CPU ``precision_path`` estimate reads ``host.cpu_bf16_matmul``,
        the provenance its hostname and CPU count.

    Returns
    -------
    RunMetrics
        A replay runner's RunMetrics (``RawRun.metrics``) exactly as it
        returned it.  Otherwise measured on this machine (provenance says which
        device and profiler); ``ok=False`` with the reason when the child
        failed.  Step time and throughput come from the harness's clock around
        the profiled steps; the waste budget and op shares from the Chrome
        trace written to ``trace_path``; MFU = counted FLOPs (torch.profiler
        ``with_flops``: mm/addmm/bmm/baddbmm/conv) per second over the
        device's peak for the run's precision (CPU: a measured fp32 GEMM
        probe).  The runner then folds in its own findings
        (``Runner.fold_metrics``: rocprofv3 kernels and amd-smi memory for the
        rocprof runner).
    """
    raw = runner.run(workload, "profile", steps=steps, warmup=warmup, script=script, env=env, unset_env=unset_env,
                     label=label)
    if raw.metrics is not None:  # the replay runner: a recording, never re-labelled as measured
        return raw.metrics
    if not raw.ok:
        return failed_metrics(raw, workload)
    host = host or current_host()
    r = raw.result
    m = RunMetrics(workload=workload.name, unit=workload.unit, run_dir=str(raw.run_dir),
                   provenance=run_provenance(raw, host), warnings=list(r.warnings),
                   trace_path=str(raw.trace_path), **throughput_fields(raw, workload))
    m.signals = run_signals(r, raw.stderr_tail)
    if r.invariants:
        m.invariants = judge(r, raw.stderr_tail, cores=host.cores, online_cpus=host.online_cpus)
        busy = next((i for i in m.invariants if i.id == "cores_busy" and i.status != "not_observable"), None)
        m.cores_busy = None if busy is None else busy.status == "fired"
    summary = read_trace(raw.trace_path)
    warm = len(r.all_step_times_s) - len(r.per_step)
    if r.all_step_times_s and warm >= 0:  # the profiled steps are the measured ones, in order
        m.step_outliers = outlier_steps(r.all_step_times_s, warm, summary, first_profiled=warm + 1,
                                        events=step_events(r))
    m.waste_budget = waste_budget(summary, m.step_time_s, bf16_matmul=host.cpu_bf16_matmul)
    total_us = sum(s.dur_us for s in summary.steps)
    m.top_kernels = [KernelShare(name=o.name, pct_time=100.0 * o.self_us / total_us)
                     for o in r.ops[:5]] if total_us > 0 else []
    m.attention_kernel_loaded = any(is_fused_attention(o.name) for o in r.ops)
    # utilisation
    busy = sum((s.device_busy_us if summary.has_device else s.op_us) for s in summary.steps)
    m.util_pct = 100.0 * busy / total_us if total_us > 0 else None
    # memory
    if r.device == "cuda":
        m.mem_peak_gb = r.mem_peak_gb
        if r.mem_total_gb and m.mem_peak_gb is not None:
            m.memory_headroom_gb = r.mem_total_gb - m.mem_peak_gb
        m.not_observable["mem_avg_gb"] = "device memory is sampled at its peak only (torch.cuda.max_memory_allocated)"
    else:
        m.mem_peak_gb = r.max_rss_gb
        samples = r.rss_gb_samples
        m.mem_avg_gb = sum(samples) / len(samples) if samples else None
        try:
            import psutil

            m.memory_headroom_gb = psutil.virtual_memory().total / 1e9 - (m.mem_peak_gb or 0.0)
        except ImportError:  # pragma: no cover - psutil is a dependency
            pass
        m.warnings.append("cpu run: memory figures are the process's host RSS (GB), not device memory")
    # MFU
    flops = r.flops_total
    if flops and m.step_time_s:
        flops_per_s = flops / sum(m.step_times_s)
        if r.device == "cuda":
            peak = lookup_gpu_peak(r.device_name)
            if peak is None:
                m.not_observable["mfu_pct"] = f"no peak-FLOP entry for device {r.device_name!r}"
            else:
                prec = gemm_precision(summary)
                tflops = peak.bf16_tflops if prec == "bf16" else peak.fp32_tflops
                m.mfu_pct = 100.0 * flops_per_s / (tflops * 1e12)
                m.warnings.append(f"MFU against {peak.name} dense {prec} peak {tflops} TFLOP/s ({peak.source}); "
                                  f"precision from the GEMM kernels' input types")
        else:
            peak_tf = measure_cpu_peak_tflops(threads=r.num_threads)
            m.mfu_pct = 100.0 * flops_per_s / (peak_tf * 1e12)
            m.warnings.append(
                f"MFU against this CPU's measured fp32 GEMM peak ({peak_tf:.3f} TFLOP/s at "
                f"{r.num_threads} threads; measured, not a datasheet figure)")
    else:
        m.not_observable["mfu_pct"] = "no FLOP-counted ops (mm/addmm/bmm/conv) in the profiled steps"
    if m.samples_per_sec is None and m.tokens_per_sec is None:
        m.not_observable["throughput"] = f"no batches counted from field {workload.batch_field!r}"
    if workload.unit == "samples":
        m.not_observable["tokens_per_sec"] = "workload counts samples, not tokens"
        m.not_observable["padding_share"] = "workload counts samples, not tokens"
        m.not_observable["real_tokens_per_sec"] = "workload counts samples, not tokens"
    if m.dynamo is None:
        m.not_observable["dynamo"] = "the script compiled nothing with torch.compile (no dynamo frame was traced)"
    if m.nonfinite_step is None:
        m.not_observable["nonfinite_step"] = (
            "parameters were checked for NaN/Inf after every warm-up step and at the end of the run, not inside "
            "timed steps: " + ("none was non-finite" if not m.nonfinite_params else
                               "they were non-finite only at the end, after a timed step"))
    runner.fold_metrics(raw, m)
    _headroom_batch(m, r, summary)  # after the fold: amd-smi may replace memory_headroom_gb
    return m


def gemm_precision(summary: TraceSummary) -> str:
    """The run's matmul precision for the MFU peak: ``bf16`` when half-precision
    (bf16/fp16) GEMMs take most of the GEMM time in the trace, else ``fp32``."""
    half = sum(g.time_us for g in summary.gemms if g.dtype in ("c10::BFloat16", "c10::Half"))
    total = sum(g.time_us for g in summary.gemms)
    return "bf16" if total > 0 and half / total > 0.5 else "fp32"


def micro_batch(r: HarnessResult) -> float | None:
    """Samples per data-loader batch over the measured steps (the per-device micro-batch); None if uncounted."""
    samples = sum(p.samples for p in r.per_step)
    batches = sum(p.batches for p in r.per_step)
    return samples / batches if samples and batches else None


def activation_gb_per_sample(r: HarnessResult, summary: TraceSummary) -> tuple[float | None, str]:
    """Memory one more sample of a micro-batch costs (GB), and how it was measured.

    Activation memory of a step = peak allocated - allocated at the step's
    start (weights, grads, optimizer state stay): on CUDA/ROCm from
    ``torch.cuda.max_memory_allocated`` and ``memory_allocated`` after the
    optimizer step, on CPU from the profiler's ``[memory]`` events (median over
    steps).  Divided by the samples of one micro-batch (samples per step over
    loader batches per step).  Returns ``(None, reason)`` when not measurable.
    """
    micro = micro_batch(r)
    if micro is None:
        return None, "no batches counted from the data loader"
    if r.device == "cuda":
        if r.mem_peak_gb is None or r.mem_static_gb is None:
            return None, "device memory counters were not read"
        act = r.mem_peak_gb - r.mem_static_gb
        how = "torch.cuda max_memory_allocated - memory_allocated after the optimizer step"
    else:
        if not summary.alloc_step_bytes:
            return None, "the trace has no allocator [memory] events (profile_memory off)"
        # The profiler's CPU byte count starts at 0 when profiling starts: the first
        # step's start misses what was allocated before it, so it is left out.
        per_step = [v for _, v in sorted(summary.alloc_step_bytes.items())]
        per_step = per_step[1:] if len(per_step) > 1 else per_step
        act = statistics.median(pk - st for st, pk in per_step) / 1e9
        how = "torch.profiler [memory] events: peak - start of step allocated bytes (median over steps after the first)"
    if act <= 0:
        return None, f"no activation memory measured ({how})"
    return act / micro, f"{how}, over {micro:g} samples per micro-batch"


#: The most a headroom batch may extrapolate the measured micro-batch (times) when the dataset size is
#: unknown.  The estimate is a straight line through one measured batch; three orders of magnitude past it,
#: allocator fragmentation, workspace sizes and kernel choices that change with the batch make it no
#: measurement (the digits MLP's 64-sample batch once extrapolated to 12 million samples of host RAM).
MAX_BATCH_EXTRAPOLATION = 1024


def _headroom_batch(m: RunMetrics, r: HarnessResult, summary: TraceSummary) -> None:
    """Fill ``m.headroom_batch`` (estimated, bounded) or give the reason in ``not_observable``.

    Estimate: measured micro-batch + ``memory_headroom_gb`` / activation GB
    per sample (:func:`activation_gb_per_sample`; linear in the batch).
    Bounds: the dataset's size when the harness reports it
    (``dataset_samples``: a batch cannot hold more samples than the data);
    and a value beyond :data:`MAX_BATCH_EXTRAPOLATION` times the measured
    micro-batch is left out: ``not_observable`` then says "memory is not the
    limit" with the numbers.  A warning states how the number was obtained
    and which bound applied.
    """
    per_sample, how = activation_gb_per_sample(r, summary)
    if per_sample is None or m.memory_headroom_gb is None:
        m.not_observable["headroom_batch"] = how if per_sample is None else "memory headroom unknown"
        return
    micro = micro_batch(r)
    free = max(m.memory_headroom_gb, 0.0)
    est = micro + free / per_sample
    basis = (f"{free:.2f} GB headroom / {per_sample * 1e3:.3f} MB activation memory per sample ({how}); assumes "
             "activations grow linearly with the batch")
    dataset = getattr(r, "dataset_samples", None)
    if min(est, dataset or est) > MAX_BATCH_EXTRAPOLATION * micro:
        m.not_observable["headroom_batch"] = (
            f"memory is not the limit: the free memory would hold about {est:,.0f} samples' activations ({basis}), "
            f"more than {MAX_BATCH_EXTRAPOLATION}x the measured micro-batch of {micro:g}, too far for a straight "
            "line through one batch; " + (f"the dataset has {dataset} samples" if dataset else
                                           "the harness did not report the dataset's size to bound it"))
        return
    if dataset and est >= dataset:
        m.headroom_batch = int(dataset)
        m.warnings.append(
            f"headroom_batch {m.headroom_batch} is the dataset's size: memory is not the limit, the free memory "
            f"would hold about {est:,.0f} samples' activations ({basis}), more than the {dataset} samples the data "
            "loader's dataset has")
        return
    m.headroom_batch = int(est)
    m.warnings.append(f"headroom_batch {m.headroom_batch} is estimated: {basis}")
