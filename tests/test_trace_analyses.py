"""Trace analyses (ops roofline, recompute, critical path, health) on real traces from real GPUs.

Fixtures: /work/shared/traces (see its README.md): Kineto traces from the test suites of
AMD-AGI/TraceLens@171dd747 and facebookresearch/HolisticTraceAnalysis@f4d0062c, MIT license,
copyright Meta Platforms, Inc. and affiliates; Advanced Micro Devices, Inc.  Every expected number
is computed here from the raw JSON events or by hand, never copied from the functions' output.
"""
from __future__ import annotations

import gzip
import json
import time
from functools import lru_cache
from pathlib import Path

import pytest

from goblin_assets.errors import GoblinError
from goblin_assets.trace.critical_path import critical_path, sync_root_causes
from goblin_assets.trace.events import TraceReadError, load_trace
from goblin_assets.trace.health import health_check
from goblin_assets.trace.ops import op_roofline
from goblin_assets.trace.recompute import activation_recompute

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="real traces not available")


@lru_cache(maxsize=None)
def ev(name: str):
    return load_trace(TRACES / name)


@lru_cache(maxsize=None)
def raw(name: str) -> list[dict]:
    with gzip.open(TRACES / name, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def test_recompute_mi300x_matches_direct_count():
    name = "mi300x_resnet_act_checkpoint_train.json.gz"
    events = raw(name)
    frames = [e for e in events if e.get("cat") == "python_function" and e["name"].endswith(": recompute_fn")]
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    dur = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            c = e["args"].get("correlation")
            dur[c] = dur.get(c, 0.0) + e["dur"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"}
    expected = {s: 0.0 for s in steps}
    for f in frames:
        s = next(s for s, (a, b) in steps.items() if a <= f["ts"] < b)
        corr = {r["args"]["correlation"] for r in launches
                if r["tid"] == f["tid"] and f["ts"] <= r["ts"] <= f["ts"] + f["dur"]}
        expected[s] += sum(dur.get(c, 0.0) for c in corr)
    got = activation_recompute(ev(name)).set_index("step")
    assert len(frames) == 12 and sorted(got.index) == sorted(steps)
    for s, us in expected.items():
        assert us > 0
        assert got.loc[s, "recompute_us"] == pytest.approx(us, rel=1e-9)
        assert got.loc[s, "recompute_pct"] == pytest.approx(100 * us / (steps[s][1] - steps[s][0]), rel=1e-6)
    assert set(got["method"]) == {"python_stack"}


def test_recompute_without_stack_finds_the_same_time():
    full = ev("mi300x_resnet_act_checkpoint_train.json.gz")
    no_stack = load_trace(full.path)
    no_stack.python = no_stack.python.iloc[:0]
    a, b = activation_recompute(full), activation_recompute(no_stack)
    assert set(b["method"]) == {"autograd_forward_ops"}
    assert b["recompute_us"].tolist() == pytest.approx(a["recompute_us"].tolist(), rel=1e-9)


def test_a100_critical_path_is_host_bound():
    """AlexNet on A100: the device idles while the host initialises CUDA (not while it waits in syncs)."""
    name = "a100_alexnet_benchmark.json.gz"
    events = raw(name)
    dev = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    host = [e for e in events if e.get("cat") == "cpu_op"]
    lo = min(dev[0][0], min(e["ts"] for e in host))
    gaps, end = [], lo
    for a, b in dev:
        if a > end:
            gaps.append((end, a))
        end = max(end, b)
    idle = sum(b - a for a, b in gaps)
    g0, g1 = max(gaps, key=lambda g: g[1] - g[0])
    init = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaDeviceGetStreamPriorityRange"
            and g0 <= e["ts"] and e["ts"] + e["dur"] <= g1]
    assert init and init[0]["dur"] > 29e6 and (g1 - g0) > idle / 2  # ~30 s of CUDA init before the first copy
    cp = critical_path(ev(name))
    assert len(cp) == 1 and cp.loc[0, "step"] == -1
    assert cp.loc[0, "verdict"] == "cpu_launch_bound"
    assert cp.loc[0, "device_idle_us"] == pytest.approx(idle)
    assert cp.loc[0, "idle_launch_us"] >= g1 - g0
    roots = sync_root_causes(ev(name))
    assert not roots.empty and set(roots["sync_call"]) <= {"cudaMemcpyAsync", "cudaStreamSynchronize",
                                                          "cudaDeviceSynchronize"}
    assert roots.loc[0, "cpu_op"] == "aten::copy_"  # no stack recorded: the enclosing op names it


def test_h100_sync_root_cause_has_python_frame():
    roots = sync_root_causes(ev("h100_qwen1.5-0.5b_infer.json.gz"))
    dev = roots[roots["sync_call"] == "cudaDeviceSynchronize"]
    assert len(dev) == 1 and dev.iloc[0]["sync_us"] > 14_000  # the 14 ms cudaDeviceSynchronize
    assert "synchronize" in dev.iloc[0]["python_frame"]


@pytest.mark.parametrize("name, peak", [("h100_qwen1.5-0.5b_infer.json.gz", 989.4),
                                        ("mi300x_qwen1.5-0.5b_infer.json.gz", 1307.4)])
def test_qwen_op_roofline(name, peak):
    table = op_roofline(ev(name))
    assert {"gemm", "attention"} <= set(table["kind"])
    assert ((table["pct_of_peak"] > 0) & (table["pct_of_peak"] <= 100)).all()
    mm = table[(table["op"] == "aten::mm") & (table["input_dims"] == "[[8944, 1024], [1024, 2816]]")].iloc[0]
    assert mm["count"] == 48 and mm["flops"] == 48 * 2 * 8944 * 1024 * 2816
    assert mm["bytes"] == 48 * 2 * (8944 * 1024 + 1024 * 2816 + 8944 * 2816)
    assert mm["peak_tflops"] == peak
    attn = table[table["kind"] == "attention"].iloc[0]
    # causal flash attention, Q/K/V [16, 16, 559, 64]: 4·B·H·S²·D / 2 per call, 24 layers
    assert attn["op"] == "aten::_scaled_dot_product_flash_attention"
    assert attn["flops"] == 24 * 4 * 16 * 16 * 559 * 559 * 64 / 2
    # GPU time of the attention rows: the kernels launched inside those ops, counted from the raw events
    events = raw(name)
    ops = [e for e in events if e["name"] == "aten::_scaled_dot_product_flash_attention"]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and any(
        o["tid"] == e["tid"] and o["ts"] <= e["ts"] <= o["ts"] + o["dur"] for o in ops)]
    corr = {e["args"]["correlation"] for e in launches}
    gpu = sum(e["dur"] for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in corr)
    assert attn["gpu_time_us"] == pytest.approx(gpu)


def test_op_roofline_empty_without_shapes():
    table = op_roofline(ev("a100_alexnet_benchmark.json.gz"))
    assert table.empty and "pct_of_peak" in table.columns


def test_health_flags():
    mi250 = {(f.kind, f.evidence.get("flag")) for f in health_check(ev("mi250_minitoy_train_rocm6.2.json.gz"))}
    assert ("flag_off", "with_stack") in mi250
    assert ("unknown_device", None) in mi250
    assert ("step_without_device_events", None) in mi250  # ProfilerStep#2 lasts 49 µs and launches nothing
    a100 = {f.kind for f in health_check(ev("a100_alexnet_benchmark.json.gz"))}
    assert "no_steps" in a100
    rocprof = {f.kind for f in health_check(ev("rocprofv3_908_results.json.gz"))}
    assert "no_host_side" in rocprof


def test_bad_input_errors():
    with pytest.raises(TraceReadError, match="expected TraceEvents"):
        op_roofline("trace.json")
    with pytest.raises(GoblinError, match="expected TraceEvents"):
        health_check(None)
    with pytest.raises(TraceReadError, match="host side"):
        critical_path(ev("rocprofv3_908_results.json.gz"))


def test_analyses_are_fast():
    e = ev("mi300x_resnet_act_checkpoint_train.json.gz")
    for fn in (op_roofline, activation_recompute, critical_path, sync_root_causes, health_check):
        t = time.perf_counter()
        fn(e)
        assert time.perf_counter() - t < 2.0, fn.__name__
