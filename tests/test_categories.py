"""The kernel and op category table, checked against the names real ROCm and CUDA runs record.

``tests/data/kernel_names.yaml`` lists real kernel and op names taken from
GPU traces recorded on MI300X, MI350X, MI250, H100 and A100 (the test traces
of Holistic Trace Analysis and TraceLens), each under the category a
performance engineer gives it.  When those traces are present beside the
repository (``../shared/traces``; see docs/sources.md), every kernel in them
is classified too and the time left in ``other`` must be small.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from goblin_assets.contracts import KernelShare, RunMetrics
from goblin_assets.runners.categories import (
    CategoryTableError,
    category_pct,
    classify,
    default_table,
    gemm_operands,
    groups,
    is_fused_attention,
    load_table,
)

NAMES = yaml.safe_load((Path(__file__).parent / "data" / "kernel_names.yaml").read_text())
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"

#: Names the libraries' sources give their kernels, for the kinds the recorded traces lack
#: (attention backward, CK / memory-efficient / cuDNN attention, NCCL's older kernel names).
DOCUMENTED = {
    "attention_backward": [
        "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_preprocess",  # AOTriton (ROCm/aotriton tritonsrc)
        "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>",
        "fmha_cutlassB_bf16_aligned_128x64_k128_sm80",  # PyTorch mem_eff_attention kernel names
        "_ZN7ck_tile6kentryILi2ENS_17FmhaBwdDQDKDVKernelINS_27BlockFmhaBwdDQDKDVPipeline",  # CK tile FMHA
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
    ],
    "attention_forward": [
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80",
        "_ZN7ck_tile6kentryILi2ENS_13FmhaFwdKernelINS_23BlockFmhaPipelineQRKSVS",
        "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>>",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
        "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    ],
    "collective": ["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                   "ncclKernel_ReduceScatter_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)",
                   "c10d::broadcast_", "_c10d_functional::all_gather_into_tensor"],
    "optimizer": ["aten::_fused_adamw_", "aten::_foreach_mul_",
                  "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>"],
    "gemm": ["triton_tem_fused_addmm_0", "void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4>"],
    "reduce": ["triton_red_fused__softmax_0", "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>"],
    "elementwise": ["triton_poi_fused_add_mul_0"],
}


def _expected() -> list[tuple[str, str]]:
    return [(cat, entry["name"]) for cat, entries in NAMES.items() for entry in entries] + \
        [(cat, name) for cat, names in DOCUMENTED.items() for name in names]


@pytest.mark.parametrize("category, name", _expected(), ids=lambda x: x[:60])
def test_real_names_get_their_category(category, name):
    m = classify(name)
    assert m.category == category, f"{name!r}: {m.category} ({m.source[:80]})"
    assert m.group == default_table().categories[category]
    assert category == "other" or m.source


def test_the_kb_kinds_are_groups_and_attention_spans_forward_and_backward():
    assert {"gemm", "attention", "conv", "collective", "optimizer", "elementwise"} <= set(groups())
    t = default_table()
    assert t.categories["attention_forward"] == t.categories["attention_backward"] == "attention"
    assert t.categories["memory"] == t.categories["layout"] == "memory"


def test_first_match_wins_in_table_order():
    """FlashAttention kernels carry cutlass::, convolutions carry gemm, NCCL's ReduceScatter carries Reduce."""
    assert classify("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<cutlass::bfloat16_t>>").group \
        == "attention"
    assert classify("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32").group == "conv"
    ck_conv = "_ZN2ck16tensor_operation6device12kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28GridwiseGemm"
    assert classify(ck_conv).group == "conv"
    assert classify("ncclKernel_ReduceScatter_RING_LL_Sum_float").group == "collective"
    assert classify("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>").category == "layout"
    assert classify("flash_bwd_convert_dq_kernel").category == "attention_backward"  # not a 'conv'
    assert classify("CompletelyUnknownKernel_v3").category == "other"


def test_fused_attention_is_the_fused_kernels_and_the_ops_that_launch_them():
    for name in ("attn_fwd", "bwd_kernel_fuse", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_flash_attention_for_cpu", "fmha_cutlassF_f16_aligned_64x64_rf_sm80"):
        assert is_fused_attention(name), name
    for name in ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math", "aten::bmm"):
        assert not is_fused_attention(name), name


def test_leaf_gemm_operands_come_from_the_table():
    assert gemm_operands("aten::addmm").model_dump() == {"lhs": 1, "rhs": 2, "bias": 0, "batched": False}
    assert gemm_operands("aten::bmm").batched and gemm_operands("aten::bmm").bias is None
    assert gemm_operands("aten::linear") is None  # dispatches to addmm: counted once, there
    assert all(classify(op).group == "gemm" for op in default_table().gemm_operands)


def test_category_pct_sums_top_kernels_per_group():
    m = RunMetrics(top_kernels=[KernelShare(name="attn_fwd", pct_time=20.0),
                                KernelShare(name="bwd_kernel_dk_dv", pct_time=15.0),
                                KernelShare(name="Cijk_Alik_Bljk_BBS_BH_MT128x128x32", pct_time=40.0),
                                KernelShare(name="ncclDevKernel_Generic", pct_time=5.0)])
    pct = category_pct(m)
    assert set(pct) == set(groups())
    assert pct["attention"] == {"pct": 35.0} and pct["gemm"] == {"pct": 40.0}
    assert pct["collective"] == {"pct": 5.0} and pct["conv"] == {"pct": 0.0}
    assert category_pct(RunMetrics()) == {}


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["rules"][0]["patterns"].append("(unclosed"), r"rules\[0\]\.patterns\[\d+\]: invalid regular"),
    (lambda d: d["rules"][1].update(category="kernels"), r"rules\[1\]\.category: unknown category 'kernels'"),
    (lambda d: d["categories"]["gemm"].update(group="matmul"), r"categories\.gemm\.group: unknown group 'matmul'"),
    (lambda d: d["gemm_operands"].update({"aten::relu": {"lhs": 0, "rhs": 1}}),
     r"gemm_operands\.aten::relu: the rules classify it as 'elementwise'"),
    (lambda d: d["rules"][0].pop("source"), r"rules\.0\.source: Field required"),
    (lambda d: d["rules"][0].pop("patterns"), r"rules\.0: Value error, a rule needs patterns or names"),
])
def test_a_broken_table_names_the_file_and_the_entry(tmp_path, edit, message):
    from goblin_assets.runners.categories import TABLE_FILE

    doc = yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))
    edit(doc)
    bad = tmp_path / "categories.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(CategoryTableError, match=message) as err:
        load_table(bad)
    assert str(bad) in str(err.value)


# --------------------------------------------------------------------------- the recorded traces

def _kineto_kernels(path: Path) -> dict[str, float]:
    doc = json.load(gzip.open(path))
    out: dict[str, float] = defaultdict(float)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            out[e["name"]] += float(e.get("dur", 0))
    return out


def _rocprof_kernels(path: Path) -> dict[str, float]:
    tool = json.load(gzip.open(path))["rocprofiler-sdk-tool"][0]
    symbols = {s["kernel_id"]: s.get("formatted_kernel_name") or s["kernel_name"] for s in tool["kernel_symbols"]}
    out: dict[str, float] = defaultdict(float)
    for r in tool["buffer_records"]["kernel_dispatch"]:
        out[symbols[r["dispatch_info"]["kernel_id"]]] += (r["end_timestamp"] - r["start_timestamp"]) / 1e3
    return out


#: trace file -> (category that must be present, least share of kernel time it must have, percent).
#: Shares were read off the traces by hand (kernel names and durations), not from our classifier.
KNOWN = {
    "mi300x_qwen1.5-0.5b_infer.json.gz": [("attention_forward", 13.0), ("gemm", 39.0)],  # attn_fwd, Cijk_*
    "h100_qwen1.5-0.5b_infer.json.gz": [("attention_forward", 8.0), ("gemm", 27.0)],  # flash_fwd_kernel, sm90 gemm
    "mi300x_resnet_act_checkpoint_train.json.gz": [("collective", 70.0), ("norm", 8.0), ("conv", 4.0)],
    "mi250_minitoy_train_rocm6.2.json.gz": [("gemm", 20.0), ("optimizer", 5.0)],
    "a100_alexnet_benchmark.json.gz": [("memory", 80.0), ("conv", 6.0)],
    "rocprofv3_908_results.json.gz": [("collective", 90.0), ("gemm", 1.0), ("attention_backward", 0.1)],
}


@pytest.mark.skipif(not TRACES.is_dir(), reason="the recorded GPU traces (../shared/traces) are not here")
@pytest.mark.parametrize("trace", sorted(KNOWN))
def test_every_kernel_of_the_recorded_traces_is_classified(trace):
    path = TRACES / trace
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    kernels = _rocprof_kernels(path) if trace.startswith("rocprofv3") else _kineto_kernels(path)
    total = sum(kernels.values())
    share: dict[str, float] = defaultdict(float)
    for name, us in kernels.items():
        share[classify(name).category] += 100.0 * us / total
    assert share["other"] < 1.0, {n: us for n, us in kernels.items() if classify(n).category == "other"}
    for category, least in KNOWN[trace]:
        assert share[category] >= least, (category, dict(share))


@pytest.mark.skipif(not TRACES.is_dir(), reason="the recorded GPU traces (../shared/traces) are not here")
def test_exposed_collective_time_agrees_with_hta_on_the_mi300x_training_trace():
    """HTA 0.5.0's get_comm_comp_overlap on this trace says 22.45 % of NCCL time overlaps compute kernels
    (run once by hand); the same overlap from our table and interval union is within half a point."""
    from goblin_assets.runners.trace import union_length

    path = TRACES / "mi300x_resnet_act_checkpoint_train.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    doc = json.load(gzip.open(path))
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), classify(e["name"]).category)
               for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    comm = [(a, b) for a, b, c in kernels if c == "collective"]
    compute = [(a, b) for a, b, c in kernels if c not in ("collective", "memory")]  # HTA's COMPUTATION kernels
    comm_us = union_length(comm)
    overlap_pct = 100.0 * (comm_us - (union_length(comm + compute) - union_length(compute))) / comm_us
    assert overlap_pct == pytest.approx(22.45, abs=0.5)
