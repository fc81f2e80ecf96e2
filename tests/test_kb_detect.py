"""Detect conditions on hand-built configs and runs: the right rules fire, the rest stay quiet."""
from __future__ import annotations

import pytest

from goblin_assets.contracts import ConfigDict, KernelShare, RunMetrics, RunProvenance, WasteBucket
from goblin_assets.host import HostFacts
from goblin_assets.kb.rules import (
    check_condition,
    detect_context,
    eval_fix_value,
    load_kb,
    match_rules,
    version_at_least,
)
from goblin_assets.runners.categories import category_pct

NO_AMX = HostFacts(source="set", cores=2, online_cpus=2, affinity_cpus=2, numa_nodes=1, amx_bf16=False,
                   avx512_bf16=False)
AMX = NO_AMX.model_copy(update={"amx_bf16": True})


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def run(shares: dict[str, float], *, step_s: float = 0.1, hip: str | None = None, cuda: str | None = None,
        torch: str = "2.13.0+cpu", **fields) -> RunMetrics:
    """A RunMetrics whose waste budget has the given shares of a ``step_s`` step."""
    budget = {b: WasteBucket(seconds=s * step_s, status="measured") for b, s in shares.items()}
    # rules declare devices (issue 16): a ROCm run here is an MI300X, a CUDA run an A100
    device = fields.pop("device", "AMD Instinct MI300X" if hip else ("NVIDIA A100-SXM4-80GB" if cuda else "cpu"))
    prov = RunProvenance(kind="modelled", device=device, torch_version=torch, hip_version=hip, cuda_version=cuda,
                         cpu_count=fields.pop("cpu_count", 2))
    return RunMetrics(steps=10, step_time_s=step_s, waste_budget=budget, provenance=prov, **fields)


def fired(kb, config: ConfigDict, metrics: RunMetrics, env=None, cores=2, host=NO_AMX, packages=None) -> set[str]:
    ctx = detect_context(config, metrics, host, env=env or {}, cores=cores, packages=packages or {})
    return {m.rule_id for m in match_rules(kb, ctx) if m.fired}


DIGITS = ConfigDict(batch_size=64, lr=0.05, dataloader_workers=0, optimizer="SGD", precision="fp32")
DIGITS_RUN = {"useful": 0.35, "data_wait": 0.55, "host_gap": 0.10, "comm_excess": 0.0}


def test_digits_style_cpu_run_fires_only_the_loader_rule(kb):
    got = fired(kb, DIGITS, run(DIGITS_RUN))
    assert got == {"data.loader_workers_with_threads"}
    # even on an AMX CPU an input-bound run is left to the data rule, not to precision
    assert not {r for r in fired(kb, DIGITS, run(DIGITS_RUN), host=AMX) if r.startswith("precision.")}
    # the loader rule's transform sizes workers and threads together (2 cores: 2 workers, 1 thread)
    rule = kb.by_id["data.loader_workers_with_threads"]
    names = {"cores": 2, **DIGITS.values()}
    workers = eval_fix_value(rule.fix.config["dataloader_workers"], names)
    threads = eval_fix_value(rule.fix.config["intra_op_threads"], {**names, "dataloader_workers": workers})
    assert (workers, threads) == (2, 1)


def test_loader_rule_does_not_fire_without_data_wait(kb):
    compute_bound = {"useful": 0.9, "data_wait": 0.05, "host_gap": 0.05}
    assert "data.loader_workers_with_threads" not in fired(kb, DIGITS, run(compute_bound))


def test_compute_bound_fp32_cpu_on_amx_gets_bf16(kb):
    compute_bound = {"useful": 0.9, "data_wait": 0.05, "host_gap": 0.05}
    got = fired(kb, DIGITS, run(compute_bound), host=AMX)
    assert "precision.cpu_bf16_amx" in got
    assert "precision.bf16_on_mi300x" not in got  # a GPU rule


def test_minilm_style_cpu_run_fires_attention_and_padding(kb):
    cfg = ConfigDict(batch_size=8, seq_len=64, precision="fp32", attention_impl="eager", dataloader_workers=0,
                     optimizer="adamw_torch", lora_rank=8)
    m = run({"useful": 0.85, "data_wait": 0.02, "host_gap": 0.13}, padding_share=0.6,
            attention_kernel_loaded=False, unit="tokens")
    got = fired(kb, cfg, m)
    assert {"attention.eager_to_sdpa", "data.dynamic_padding"} <= got
    assert "optimizer.fused_adamw" not in got  # GPU-only rule
    assert not {r for r in got if r.startswith("precision.")}


def test_fp32_on_mi300x_fires_rocm_precision_rules_only(kb):
    cfg = ConfigDict(precision="fp32", seq_len=512, batch_size=8)
    m = run({"useful": 0.7, "precision_path": 0.3}, hip="6.2.41133-dd7f95766", torch="2.5.1+rocm6.2")
    got = fired(kb, cfg, m)
    assert {"precision.bf16_on_mi300x", "precision.tf32_on_mi300x"} <= got
    assert "precision.tf32_for_fp32_matmuls" not in got  # CUDA rule
    cuda = run({"useful": 0.7, "precision_path": 0.3}, cuda="12.4", torch="2.5.1+cu124")
    assert "precision.tf32_for_fp32_matmuls" in fired(kb, cfg, cuda)


def test_unknown_values_never_fire(kb):
    cfg = ConfigDict()  # nothing parsed
    assert fired(kb, cfg, run({"useful": 1.0})) == set()


# ------------------------------------------------------------------ versions

@pytest.mark.parametrize("cond,version,expect", [
    ("torch_version >= 2.3", "2.13.0+cpu", True),
    ("torch_version >= 2.10", "2.9.1", False),       # a float compare would say 2.9 >= 2.1
    ("torch_version < 2.10", "2.9.1", True),
    ("torch_version == 2.5", "2.5.0+rocm6.2", True),
    ("torch_version >= 2.6", None, False),           # unknown never holds
])
def test_torch_version_compares_as_release_tuples(cond, version, expect):
    ok, why = check_condition(cond, {"torch_version": version})
    assert ok is expect, why


def test_rocm_and_package_versions():
    ctx = {"rocm_version": "6.2.41133-dd7f95766", "packages": {"bitsandbytes": "0.49.2", "flash_attn": None}}
    assert check_condition("rocm_version >= 6.0", ctx)[0]
    assert check_condition("rocm_version < 7.13", ctx)[0]
    assert check_condition("packages.bitsandbytes < 0.50", ctx)[0]
    assert check_condition("packages.flash_attn == null", ctx)[0]
    assert version_at_least("7.14.0", "7.13") and version_at_least("6.2", "6.10") is False
    assert version_at_least(None, "2.0") is None


def test_version_minimum_gates_firing(kb):
    cfg = ConfigDict(seq_len=512, precision="bf16", batch_size=8)
    gemm = [KernelShare(name="Cijk_Alik_Bljk_BBS_BH_MT128x128x64", pct_time=70.0)]
    old = run({"useful": 0.8, "kernel_shape": 0.2}, hip="6.1.40091", torch="2.2.0", top_kernels=gemm)
    new = run({"useful": 0.8, "kernel_shape": 0.2}, hip="6.2.41133", torch="2.4.1", top_kernels=gemm)
    assert "kernels.tunableop_gemm_bound" in fired(kb, cfg, new)
    assert "kernels.tunableop_gemm_bound" not in fired(kb, cfg, old)
    ctx = detect_context(cfg, old, NO_AMX, env={}, cores=8, packages={})
    m = next(m for m in match_rules(kb, ctx) if m.rule_id == "kernels.tunableop_gemm_bound")
    assert "torch_version_min 2.3" in m.reason and m.detect_score == 1.0


# ------------------------------------------------------------------ env, packages, kernels, host

def test_env_numbers_and_prefixes(kb):
    cfg = ConfigDict(seq_len=512, precision="bf16")
    m = run({"useful": 0.8, "comm_excess": 0.2}, hip="6.2.41133")
    single = {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}
    assert "collectives.rccl_min_channels_8gpu" in fired(kb, cfg, m, env=single)
    multi = {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16", "NCCL_MIN_NCHANNELS": "112"}
    got = fired(kb, cfg, m, env=multi)
    assert "collectives.rccl_channel_cap_multinode" in got and "collectives.rccl_min_channels_8gpu" not in got
    assert "topology.partial_node_on_mi300x" in fired(kb, cfg, m, env={"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"})
    assert "env_vars.unset_rocprofsys" in fired(kb, DIGITS, run({"useful": 1.0}), env={"ROCPROFSYS_TRACE": "1"})


def test_package_versions_drive_the_bitsandbytes_rule(kb):
    cfg = ConfigDict(optimizer="paged_adamw_8bit")
    m = run({"useful": 1.0}, hip="6.2.41133", torch="2.5.1")
    assert "optimizer.bnb_before_official_rocm_support" in fired(kb, cfg, m, packages={"bitsandbytes": "0.49.2"})
    assert "optimizer.bnb_before_official_rocm_support" not in fired(kb, cfg, m, packages={"bitsandbytes": "0.50.1"})


def test_kernel_kinds_from_top_kernels():
    m = RunMetrics(top_kernels=[
        KernelShare(name="Cijk_Ailk_Bljk_HHS_BH_MT64x64x32", pct_time=40.0),
        KernelShare(name="aten::addmm", pct_time=10.0),
        KernelShare(name="miopenSp3AsmConv_v21_1_2_gfx9_fp32_stride1", pct_time=20.0),
        KernelShare(name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", pct_time=15.0),
        KernelShare(name="attn_fwd", pct_time=5.0),
    ])
    pct = {k: v["pct"] for k, v in category_pct(m).items()}
    assert pct["gemm"] == 50.0 and pct["conv"] == 20.0 and pct["collective"] == 15.0 and pct["attention"] == 5.0
    assert category_pct(RunMetrics()) == {}  # no kernels: kernels.* is "not available", not 0 %


def test_threads_beyond_pinned_cpus(kb):
    cfg = ConfigDict(intra_op_threads=16, dataloader_workers=0)
    got = fired(kb, cfg, run({"useful": 1.0}), cores=4)
    assert "topology.threads_exceed_pinned_cpus" in got
    assert eval_fix_value(kb.by_id["topology.threads_exceed_pinned_cpus"].fix.config["intra_op_threads"],
                          {"cores": 4}) == 4


def test_mined_patterns_are_evidence_rules_can_read():
    """``patterns.<site>.<finding>``: the highest score of a finding at a site (dotted module paths), or anywhere."""
    import pandas as pd

    from goblin_assets.kb.rules import _check_condition_paths

    pats = pd.DataFrame({"site": ["encoder.layer.0.query", "encoder.layer.0.query", "linear_1"],
                         "role": ["lhs", "rhs", "lhs"], "finding": ["sparse_gemm", "stationary", "sparse_gemm"],
                         "score": [0.62, 1.0, 0.48]})
    ctx = detect_context(DIGITS, run(DIGITS_RUN), NO_AMX, patterns=pats)
    assert check_condition("patterns.encoder.layer.0.query.sparse_gemm > 0.6", ctx)[0]
    assert check_condition("patterns.any.sparse_gemm == 0.62", ctx)[0]
    assert check_condition("patterns.linear_1.int_quant == 0", ctx)[0]   # mined, but not that finding
    held, why = check_condition("patterns.any.sparse_gemm > 0.1", detect_context(DIGITS, run(DIGITS_RUN), NO_AMX))
    assert not held and "not available" in why                        # nothing mined (a replay): never a guess
    assert "finding of" in _check_condition_paths("patterns.linear_1.sparsity > 0.5")
