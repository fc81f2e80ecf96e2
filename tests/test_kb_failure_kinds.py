"""Eleven kinds of audit failure, each on an input of its kind, against the shipped KB.

1 hazards and known-bad releases; 2 a deliberate eager workaround is not undone; 3 SDPA without a fused
kernel is flagged and GEMM tuning on the math path is blocked; 4 rules know the device (V100, A10, a 64 GB
card); 5 workers and threads are sized per process of the node; 6 a lever something else pulls back is not
edited blindly; 7 the run's own warnings become a finding, counted once; 8 an unknown format gets no HF
defaults and no patch; 9 (search) is tested with retrieval; 10 ROCPROFSYS_* is a warning, never a fix;
11 replay reports show environment fixes with their values, dropped rules with reasons, and hazards.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from goblin_assets.cli import main as goblin
from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import ConfigDict, KernelShare, RunMetrics, RunProvenance, WasteBucket
from goblin_assets.host import HostFacts
from goblin_assets.kb.rules import detect_context, eval_fix_value, load_kb, match_rules
from goblin_assets.measure.signals import run_signals
from goblin_assets.patch.changeset import resolve_changes
from goblin_assets.patch.propose import propose_patch
from goblin_assets.report.compare import hazard_notes
from goblin_assets.report.markdown import signals_markdown
from goblin_assets.runners.result import HarnessResult
from tests.conftest import REPO, WORKLOADS

BUGS = REPO / "tests" / "data" / "bug_reports"
HOST = HostFacts(source="set", cores=16, online_cpus=16, affinity_cpus=16, numa_nodes=1, amx_bf16=False,
                 avx512_bf16=False)


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def _run(device: str, *, torch: str = "2.6.0", hip: str | None = None, cuda: str | None = None, shares=None,
         **fields) -> RunMetrics:
    shares = shares or {"useful": 0.8, "host_gap": 0.2}
    return RunMetrics(steps=10, step_time_s=1.0, waste_budget={b: WasteBucket(seconds=s, status="estimated")
                                                               for b, s in shares.items()},
                      provenance=RunProvenance(kind="modelled", device=device, torch_version=torch, hip_version=hip,
                                               cuda_version=cuda, arch=fields.pop("arch", None)), **fields)


def _fired(kb, cfg: ConfigDict, run: RunMetrics, *, env=None, packages=None, cores=16) -> dict:
    ctx = detect_context(cfg, run, HOST, env=env or {}, cores=cores, packages=packages or {})
    return {m.rule_id: m for m in match_rules(kb, ctx) if m.fired}


def _audit(folder: Path, home: Path) -> tuple[int, dict]:
    import os

    old = os.environ.get("GOBLIN_HOME")
    os.environ["GOBLIN_HOME"] = str(home)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            rc = goblin(["audit", str(folder), "--json"])
    finally:
        if old is None:
            os.environ.pop("GOBLIN_HOME", None)
        else:
            os.environ["GOBLIN_HOME"] = old
    return rc, (json.loads(buf.getvalue()) if buf.getvalue().strip() else {})


# ------------------------------------------------------------------ 1 hazards and known-bad versions

def test_1_hazards_fire_on_the_affected_release_only(kb):
    cfg = ConfigDict(attention_impl="sdpa", padding="dynamic", precision="bf16", grad_accum_steps=4)
    mi300 = dict(hip="6.2.41134", arch="gfx942")
    bad = _fired(kb, cfg, _run("AMD Instinct MI300X", torch="2.6.0+rocm6.2.4", **mi300))
    assert "correctness.rocm_sdpa_mask_aotriton_080" in bad
    assert bad["correctness.rocm_sdpa_mask_aotriton_080"].evidence["affected_versions"].startswith("the installed")
    assert "correctness.rocm_sdpa_mask_aotriton_080" not in _fired(kb, cfg, _run("AMD Instinct MI300X",
                                                                                 torch="2.7.1+rocm6.4", **mi300))
    # not on CUDA, where the AOTriton kernel is not used
    assert "correctness.rocm_sdpa_mask_aotriton_080" not in _fired(kb, cfg, _run("NVIDIA A100-SXM4-80GB",
                                                                                 cuda="12.4"))
    # a transformers release with the gradient-accumulation loss bug, and the first one without it
    run = _run("NVIDIA A100-SXM4-80GB", cuda="12.4")
    assert "correctness.transformers_grad_accum_loss" in _fired(kb, cfg, run, packages={"transformers": "4.45.2"})
    assert "correctness.transformers_grad_accum_loss" not in _fired(kb, cfg, run, packages={"transformers": "4.46.0"})
    assert "correctness.transformers_grad_accum_loss" not in _fired(kb, cfg, run, packages={"transformers": None})
    for rid in ("correctness.rocm_sdpa_mask_aotriton_080", "correctness.transformers_grad_accum_loss"):
        r = kb.by_id[rid]
        assert r.kind == "hazard" and r.affected_versions and r.citation.url.startswith("https://")


def test_1_correctness_hazards_cover_the_issue_kinds(kb):
    hazards = {r.id for r in kb.rules if r.kind in ("hazard", "warning")}
    assert {"correctness.checkpoint_inputs_without_grad", "correctness.trainable_params_without_grad",
            "correctness.use_cache_with_checkpointing", "correctness.fp16_nonfinite_loss",
            "correctness.fp16_nonfinite_loss_no_bf16", "correctness.loss_nonfinite", "compile.dynamo_recompile_limit",
            "compile.cudagraphs_dynamic_shapes", "precision.bnb_4bit_fp32_compute",
            "attention.sdpa_no_fused_kernel", "env_vars.unset_rocprofsys"} <= hazards
    for r in kb.rules:
        if r.kind != "tuning":
            assert r.recovery_fraction == 0, r.id
    # model.half() without autocast: fp16 and a loss that turned NaN -> the bf16 fix where the device has bf16
    cfg = ConfigDict(precision="fp16")
    nan = [{"id": "loss_nonfinite", "count": 7, "message": "loss nan", "where": "loss", "step": 3}]
    on_3090 = _fired(kb, cfg, _run("NVIDIA GeForce RTX 3090", cuda="12.1", signals=nan))
    assert "correctness.fp16_nonfinite_loss" in on_3090
    assert kb.by_id["correctness.fp16_nonfinite_loss"].fix.config == {"precision": "bf16"}
    on_v100 = _fired(kb, cfg, _run("Tesla V100-SXM2-16GB", cuda="11.8", signals=nan))
    assert "correctness.fp16_nonfinite_loss_no_bf16" in on_v100 and "correctness.fp16_nonfinite_loss" not in on_v100
    # a 4-bit layer computing in float32, recorded as a warning of the run
    bnb = [{"id": "bnb_4bit_fp32_compute", "count": 1, "message": "Input type into Linear4bit is torch.float16, "
            "but bnb_4bit_compute_dtype=torch.float32 (default)."}]
    assert "precision.bnb_4bit_fp32_compute" in _fired(kb, ConfigDict(), _run("NVIDIA A10G", cuda="12.1",
                                                                             signals=bnb))


# ------------------------------------------------------------------ 2 a deliberate eager workaround

def test_2_a_deliberate_eager_workaround_is_not_undone(tmp_path):
    folder = BUGS / "pytorch_147460_rocm_sdpa_mask_eager"
    assert 'attn_implementation="eager",  # workaround' in (folder / "train.py").read_text()
    rc, res = _audit(folder, tmp_path / "home")
    assert rc == 0
    assert "attention.eager_to_sdpa" in res["fired_rules"] and "attention.eager_to_sdpa" not in res["rules"]
    assert "sdpa" not in res["diff"]
    (blocked,) = [d for d in res["dropped_rules"] if d.startswith("attention.eager_to_sdpa:")]
    assert "blocked by hazard correctness.rocm_sdpa_mask_aotriton_080" in blocked
    assert "https://github.com/pytorch/pytorch/issues/147460" in blocked
    assert [h["rule_id"] for h in res["hazards"]] == ["correctness.rocm_sdpa_mask_aotriton_080"]


# ------------------------------------------------------------------ 3 SDPA without a fused kernel

def test_3_sdpa_without_a_fused_kernel_is_flagged_and_gemm_tuning_is_blocked(kb):
    cfg = ConfigDict(attention_impl="sdpa", seq_len=1024, precision="bf16", batch_size=8)
    # the math path: batched matmuls (GEMM kernels) and a softmax, no attn_fwd / CK / flash kernel
    run = _run("AMD Instinct MI300X", hip="6.4.43482", torch="2.7.1+rocm6.4", arch="gfx942",
               shares={"useful": 0.7, "kernel_shape": 0.3}, attention_kernel_loaded=False,
               top_kernels=[KernelShare(name="Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI16x16x16x1", pct_time=40.0),
                            KernelShare(name="Cijk_Ailk_Bljk_BBS_BH_bmm_MT128x128x32", pct_time=22.0),
                            KernelShare(name="cunn_SoftMaxForward", pct_time=9.0)])
    fired = _fired(kb, cfg, run)
    assert {"attention.sdpa_no_fused_kernel", "kernels.tunableop_gemm_bound"} <= set(fired)
    cs = resolve_changes(cfg, kb, list(fired.values()), run, cores=16)
    (blocked,) = [d for d in cs.decisions if d.rule_id == "kernels.tunableop_gemm_bound"]
    assert blocked.outcome == "blocked" and "attention.sdpa_no_fused_kernel" in blocked.reason
    assert "PYTORCH_TUNABLEOP_ENABLED" not in cs.env
    # a fused kernel in the profile (AOTriton's attn_fwd counts as attention): no hazard, tuning may go ahead
    fused = run.model_copy(update={"attention_kernel_loaded": True})
    assert "attention.sdpa_no_fused_kernel" not in _fired(kb, cfg, fused)


def test_3_a_fallback_warning_of_the_run_is_the_same_finding(kb):
    sdpa = [{"id": "sdpa_fallback", "count": 24, "message": "1Torch was not compiled with memory efficient "
             "attention."}]
    fired = _fired(kb, ConfigDict(), _run("AMD Radeon RX 7900 XTX", hip="6.0.32830", arch="gfx1100", signals=sdpa))
    assert "attention.sdpa_fallback_warning" in fired
    assert "kernels.tunableop_gemm_bound" in kb.by_id["attention.sdpa_fallback_warning"].blocks


# ------------------------------------------------------------------ 4 device-aware rules and text

def _texts(kb, ids) -> str:
    return " ".join(kb.by_id[r].symptom + " " + kb.by_id[r].expected_impact for r in ids)


def test_4_rules_know_the_device(kb):
    v100 = _run("Tesla V100-SXM2-32GB", cuda="11.8", shares={"useful": 0.6, "precision_path": 0.4})
    for precision in ("fp32", "fp16"):
        got = _fired(kb, ConfigDict(precision=precision, seq_len=512), v100)
        assert not [r for r in got if kb.by_id[r].fix.config.get("precision") == "bf16"], (precision, set(got))
    assert "precision.bf16_on_device_without_bf16" in _fired(kb, ConfigDict(precision="bf16"), v100)
    # an A10 never gets a rule that cites MI300X figures
    a10 = _run("NVIDIA A10", cuda="12.1", shares={"useful": 0.5, "precision_path": 0.3, "host_gap": 0.2},
               mem_peak_gb=10.0, memory_headroom_gb=14.0)
    got = _fired(kb, ConfigDict(precision="fp32", seq_len=512, gradient_checkpointing=True,
                                optimizer="adamw_torch"), a10)
    assert got and "MI300X" not in _texts(kb, got) and "192 GB" not in _texts(kb, got)
    # the MI300X rules stay for MI300X
    mi300 = _run("AMD Instinct MI300X", hip="6.4.43482", torch="2.7.1+rocm6.4",
                 shares={"useful": 0.6, "precision_path": 0.4})
    assert "precision.bf16_on_mi300x" in _fired(kb, ConfigDict(precision="fp32"), mi300)
    mi250 = _run("AMD Instinct MI250X", hip="6.2.41134", shares={"useful": 0.6, "precision_path": 0.4})
    assert "precision.bf16_on_mi300x" not in _fired(kb, ConfigDict(precision="fp32"), mi250)


def test_4_a_64_gb_card_gets_its_own_memory(kb):
    run = _run("AMD Instinct MI210", hip="6.2.41134", mem_peak_gb=20.0, memory_headroom_gb=44.0)
    ctx = detect_context(ConfigDict(gradient_checkpointing=True), run, HOST, env={}, cores=16, packages={})
    assert ctx["device"]["memory_gb"] == pytest.approx(64.0) and ctx["device"]["arch"] == "gfx90a"
    got = _fired(kb, ConfigDict(gradient_checkpointing=True), run)
    assert "memory.gradient_checkpointing_without_pressure" in got
    assert "192" not in _texts(kb, got) and "MI300X" not in _texts(kb, got)
    assert not [r for r in kb.rules if "192 GB" in r.symptom + r.expected_impact]


# ------------------------------------------------------------------ 5 per-node sizing

def test_5_workers_and_threads_are_sized_per_rank_of_the_node(kb):
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.runners.workload import load_workload

    host = HostFacts(source="set", cores=80, online_cpus=80, affinity_cpus=80, amx_bf16=False, avx512_bf16=False,
                     env={"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"})
    s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), host=host)
    cores = s.cores()
    assert cores == 10
    rule = kb.by_id["data.loader_workers_with_threads"]
    workers = eval_fix_value(rule.fix.config["dataloader_workers"], {"cores": cores})
    threads = eval_fix_value(rule.fix.config["intra_op_threads"], {"cores": cores, "dataloader_workers": workers})
    assert (workers, threads) == (8, 2)               # not 8 workers + 72 threads per rank
    # a recorded node: 8 ranks x 32 workers on 32 CPUs is oversubscribed per rank (4 cores each)
    s = AuditSession.open(load_workload(BUGS / "deit_81_workers_per_rank"), kb=kb)
    assert s.cores() == 4
    fired = {m.rule_id for m in s.rule_checks() if m.fired}
    assert "data.loader_workers_oversubscribed" in fired and "data.loader_workers_with_threads" not in fired


# ------------------------------------------------------------------ 6 levers pulled back elsewhere

QLORA = """from peft import {prep}
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("m", load_in_4bit=True)
model = {prep}(model{extra})
args = TrainingArguments(output_dir="o", gradient_checkpointing=True, bf16=True)
"""


@pytest.mark.parametrize("prep,extra,pulled_back", [
    ("prepare_model_for_kbit_training", "", True),
    ("prepare_model_for_kbit_training", ", use_gradient_checkpointing=False", False),
    ("prepare_model_for_int8_training", "", True),          # peft's older name for the same helper
])
def test_6_prepare_model_for_kbit_training_pulls_checkpointing_back(kb, tmp_path, prep, extra, pulled_back):
    script = tmp_path / "train.py"
    script.write_text(QLORA.format(prep=prep, extra=extra))
    cfg = parse_config(script)
    run = _run("NVIDIA A100-SXM4-80GB", cuda="12.4", mem_peak_gb=12.0, memory_headroom_gb=60.0)
    matches = match_rules(kb, detect_context(cfg, run, HOST, env={}, cores=16, packages={}))
    assert "memory.gradient_checkpointing_without_pressure" in {m.rule_id for m in matches if m.fired}
    p = propose_patch(cfg, kb, matches, run, cores=16, source=script)
    applied = [a.rule_id for a in p.applied]
    if pulled_back:
        assert "memory.gradient_checkpointing_without_pressure" not in applied
        (why,) = [d for d in p.dropped if d.startswith("memory.gradient_checkpointing_without_pressure:")]
        assert f"{prep}(...) at line 5 sets gradient_checkpointing back to True" in why
    else:
        assert "memory.gradient_checkpointing_without_pressure" in applied


def test_6_a_default_the_launch_line_overrides_is_not_edited(kb, tmp_path):
    """deit#81: main.py's argparse default is 10, the launch line passes --num_workers 32.  The patch may edit
    the launch line or drop the rule with its reason; it never edits the script's default (the launch wins)."""
    rc, res = _audit(BUGS / "deit_81_workers_per_rank", tmp_path / "home")
    assert rc == 0 and "data.loader_workers_oversubscribed" in res["fired_rules"]
    assert "main.py" not in res["diff"]
    if "data.loader_workers_oversubscribed" not in res["rules"]:
        (why,) = [d for d in res["dropped_rules"] if d.startswith("data.loader_workers_oversubscribed:")]
        assert "launch.sh" in why


# ------------------------------------------------------------------ 7 the run's own signals

def test_7_a_warning_is_captured_once_with_its_count_and_becomes_a_finding(kb):
    msg = "None of the inputs have requires_grad=True. Gradients will be None"
    result = HarnessResult(reached_budget=True, steps_seen=12, device="cpu", torch_version="2.13.0", num_threads=2,
                           max_rss_gb=1.0, losses=[2.0] * 12, grads_missing=[0] * 12, params_trainable=8,
                           python_warnings=[{"category": "UserWarning", "where": "torch/utils/checkpoint.py:86",
                                             "count": 12, "step": 1, "message": msg}])
    sigs = run_signals(result, stderr_tail="")
    assert [(s.id, s.count) for s in sigs] == [("inputs_no_requires_grad", 12)]
    run = _run("cpu", torch="2.13.0", signals=[s.model_dump() for s in sigs])
    matches = match_rules(kb, detect_context(ConfigDict(lora_rank=8, gradient_checkpointing=True), run, HOST,
                                             env={}, cores=2, packages={}))
    notes = hazard_notes(kb, matches)
    assert [n.rule_id for n in notes] == ["correctness.checkpoint_inputs_without_grad"]
    assert "use_reentrant" in notes[0].action
    table = [ln for ln in signals_markdown(run.signals) if ln.startswith("| inputs_no_requires_grad")]
    assert len(table) == 1 and "| 12 |" in table[0]
    # an old recording without signals: "not available", never a guess
    old = _run("cpu", torch="2.13.0")
    assert not [m for m in match_rules(kb, detect_context(ConfigDict(), old, HOST, env={}, cores=2, packages={}))
                if m.fired and m.rule_id.startswith("correctness.")]


# ------------------------------------------------------------------ 8 unknown formats

FRAMEWORK_YAML = """# a detectron2-style framework config, not HF TrainingArguments
MODEL:
  META_ARCHITECTURE: GeneralizedRCNN
SOLVER:
  IMS_PER_BATCH: 16
  BASE_LR: 0.02
DATALOADER:
  num_workers: 6
"""


def test_8_an_unknown_format_gets_no_hf_defaults_and_no_patch(tmp_path):
    folder = tmp_path / "det"
    folder.mkdir()
    (folder / "config.yaml").write_text(FRAMEWORK_YAML)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert goblin(["parse", str(folder / "config.yaml"), "--json"]) == 0
    parsed = json.loads(buf.getvalue())
    assert parsed["source_format"].endswith("unknown")
    assert parsed["dataloader_workers"] != 0                       # never "0 (default)"
    assert not [f for f, p in parsed["provenance"].items() if p["kind"] == "default"]
    # audited as a replay: data wait dominates, so the loader rule may fire; nothing is written into the file
    rec = json.loads((BUGS / "barc_9_loader_workers_zero" / "cached_metrics.json").read_text())
    rec["workload"] = "det"
    (folder / "cached_metrics.json").write_text(json.dumps(rec))
    (folder / "environment.yaml").write_text(yaml.safe_dump({"cores": 16, "env": {}, "host": {}, "packages": {}}))
    (folder / "expected_findings.yaml").write_text(yaml.safe_dump({"config": "config.yaml",
                                                                   "must_fire": ["data.loader_workers_with_threads"]}))
    rc, res = _audit(folder, tmp_path / "home")
    assert rc == 0 and Path(res["report_path"]).is_file()
    assert res["diff"] == "" and res["rules"] == []                # no HF keys appended to a file that lacks them
    assert "data.loader_workers_with_threads" in res["fired_rules"]
    (why,) = [d for d in res["dropped_rules"] if d.startswith("data.loader_workers_with_threads:")]
    assert "format" in why


# ------------------------------------------------------------------ 10 profiler variables are a warning

def test_10_rocprofsys_is_a_warning_never_a_fix(tmp_path):
    rc, res = _audit(WORKLOADS / "synthetic" / "profiler_vars_as_knobs", tmp_path / "home")
    assert rc == 0
    (note,) = [h for h in res["hazards"] if h["rule_id"] == "env_vars.unset_rocprofsys"]
    assert note["kind"] == "warning"
    assert "env_vars.unset_rocprofsys" not in res["rules"]
    assert "ROCPROFSYS" not in res["diff"]


# ------------------------------------------------------------------ 11 replay reports say everything

def test_11_replay_reports_show_env_values_dropped_rules_and_hazards(tmp_path):
    reports = {}
    for name in ("pytorch_153195_tf32_disabled", "wavtokenizer_17_cuda_launch_blocking",
                 "pytorch_147460_rocm_sdpa_mask_eager", "tinyllama_32_model_half_nan"):
        rc, res = _audit(BUGS / name, tmp_path / name)
        assert rc == 0
        reports[name] = Path(res["report_path"]).read_text()
    assert "export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in reports["pytorch_153195_tf32_disabled"]
    assert "`env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`" in reports["pytorch_153195_tf32_disabled"]
    assert "unset CUDA_LAUNCH_BLOCKING" in reports["wavtokenizer_17_cuda_launch_blocking"]
    eager = reports["pytorch_147460_rocm_sdpa_mask_eager"]
    assert "## Hazards and warnings" in eager and "correctness.rocm_sdpa_mask_aotriton_080" in eager
    assert "Not applied:" in eager and "attention.eager_to_sdpa: blocked by hazard" in eager
    assert "No tuning rule fired" not in eager
    half = reports["tinyllama_32_model_half_nan"]
    assert "hazard: correctness.fp16_nonfinite_loss" in half and "Not applied:" in half
