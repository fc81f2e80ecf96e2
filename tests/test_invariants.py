"""The run-time invariants of a training step (issue 28), measured in the user's process and judged here.

One tiny token-level workload (tests/data/invariant_workload) breaks every invariant on purpose; with
``--healthy`` it breaks none.  Each is profiled once (module fixtures) and every check is asserted on the
same two runs: it fires on the broken one with evidence naming the module, parameter or step, and stays
silent on the healthy one.  The numerics check runs on the CPU with a deliberately wrong module (it
flushes small outputs to zero in reduced precision, as a wrong-result kernel would); on a GPU the same
mechanism compares the device's kernels with the float64 CPU reference.  The checks a single CPU process
cannot break (token labels that are all ignored, ranks on one node) are driven through the recorder in
process with real batches.
"""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch

from goblin_assets.contracts import ConfigDict, RunMetrics, WasteBucket
from goblin_assets.host import current_host
from goblin_assets.kb.rules import detect_context, load_kb, match_rule, match_rules
from goblin_assets.measure.invariants import CHECKS, judge, numerics_tolerance, unit_roundoff, warning_remedies
from goblin_assets.measure.profile import profile_run
from goblin_assets.report.markdown import invariants_markdown
from goblin_assets.runners import invariants as recorder
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from tests.test_observed import observed_equals_truth

WORKLOAD = Path(__file__).parent / "data" / "invariant_workload"

#: check -> the words its evidence must name on the broken run (module, parameter, step, shapes ...)
BROKEN = {
    "numerics_vs_reference": "module mix (FlushLinear",
    "grad_below_normal": "param group",
    "grad_all_zero": "parameter gate",
    "update_too_small": "param group",
    "params_never_change": "parameter",
    "optimizer_state_low_precision": "optimizer SGD",
    "loss_not_decreasing": "loss",
    "eos_never_target": "labels of",
    "threads_oversubscribed": "loader workers",
    "worker_restarts": "started at steps 1,",
    "per_shape_cost": "(new shapes)",
    "warning_remedy": "dataloader.py",
}


#: What each run's loop wrote it used (tests/data/observe_truth.py), by the run's arguments.
TRUTH: dict[tuple[str, ...], dict] = {}


def _profile(tmp_path_factory, args: list[str]) -> RunMetrics:
    home = tmp_path_factory.mktemp("inv_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOBLIN_HOME", str(home))
        wl = load_workload(WORKLOAD).model_copy(update={"args": args})
        m = profile_run(wl, LocalRunner(device="cpu", timeout_s=300), steps=8, warmup=2,
                        env={"OBSERVE_TRUTH": str(home / "truth.json")})
    if (home / "truth.json").is_file():
        TRUTH[tuple(args)] = json.loads((home / "truth.json").read_text())
    return m


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> RunMetrics:
    m = _profile(tmp_path_factory, [])
    assert m.ok, m.failure
    return m


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> RunMetrics:
    m = _profile(tmp_path_factory, ["--healthy"])
    assert m.ok, m.failure
    return m


def test_every_field_observed_equals_what_the_loop_used(broken, healthy):
    """Issue 27, on the same two runs: every ConfigDict field observed, equal to what the loop wrote it used
    (fp16 autocast, 4 threads, workers past the cores and a learning rate scaled by 1e5 when broken)."""
    observed_equals_truth(broken, TRUTH[()])
    assert broken.observed["batches"] and TRUTH[()]["padding"] == "dynamic"
    # healthy: every row is 12 tokens, so the collator that pads each batch to its longest row pads nothing, and
    # no batch shows its strategy: the run observes no padding, which is what the batches carry
    truth = TRUTH[("--healthy",)]
    assert truth["padding"] == "dynamic" and truth["seq_len"] == 12
    observed_equals_truth(healthy, {**truth, "padding": None})


def _by_id(m: RunMetrics) -> dict:
    return {i.id: i for i in m.invariants or []}


def test_every_check_runs_in_a_profiled_run(broken, healthy):
    for m in (broken, healthy):
        assert set(_by_id(m)) == set(CHECKS)
        assert all(i.status in ("fired", "silent", "not_observable") for i in m.invariants)


def test_each_check_fires_on_the_broken_workload_with_its_evidence(broken):
    got = _by_id(broken)
    for cid, words in BROKEN.items():
        inv = got[cid]
        assert inv.status == "fired", (cid, inv)
        assert words in inv.where and inv.message and inv.evidence and inv.threshold, (cid, inv)
    num = got["numerics_vs_reference"].evidence["modules"][0]
    assert num["module"] == "mix" and num["dtype"] == "torch.float16" and num["flushed_share"] > 0.01
    assert num["rel_err"] > num["tolerance"] == pytest.approx(numerics_tolerance("torch.float16", 16))
    # a backward kernel that flushes small input gradients: its forward is right, its replayed backward is not
    bwd = [r for r in got["numerics_vs_reference"].evidence["modules"] if r.get("pass") == "backward"]
    assert [(r["module"], r["class"], r["dtype"]) for r in bwd] == [("back", "GradFlushLinear", "torch.float16")]
    assert bwd[0]["rel_err"] > bwd[0]["tolerance"] and bwd[0]["flushed_share"] > 0.05
    assert not any(r["module"] == "back" and r.get("pass") != "backward"
                   for r in got["numerics_vs_reference"].evidence["modules"])
    assert got["params_never_change"].evidence["params"][:3] == ["gate", "unused.weight", "unused.bias"]
    assert got["per_shape_cost"].step == 2 and got["worker_restarts"].evidence["restart_cost_s"] > 0
    assert got["warning_remedy"].evidence["remedies"][0]["field"] == "dataloader_workers"
    assert got["cores_busy"].status in ("fired", "silent")  # measured; its size is the machine's


def test_every_check_stays_silent_on_the_healthy_workload(healthy):
    fired = {i.id: i.message for i in healthy.invariants if i.status == "fired"}
    assert not fired, fired
    num = _by_id(healthy)["numerics_vs_reference"].evidence
    assert num["backward_compared"] >= 3 and num["modules_compared"] > num["backward_compared"]
    seen = {i.id for i in healthy.invariants if i.status == "silent"}
    assert set(BROKEN) - {"cores_busy"} <= seen | {"ranks_share_cores"}, seen


def test_the_rules_fed_by_the_checks_fire_on_the_broken_run_only(broken, healthy):
    kb = load_kb()
    fed = {r for cid in BROKEN for r in CHECKS[cid][1] if r in kb.by_id}
    assert len(fed) >= 11

    def fired(m):
        ctx = detect_context(ConfigDict(), m, current_host())
        return {x.rule_id for x in match_rules(kb, ctx) if x.fired}

    assert fed <= fired(broken), fed - fired(broken)
    assert not fed & fired(healthy)
    text = "\n".join(invariants_markdown(broken.invariants))
    assert "module mix (FlushLinear" in text and "correctness.numerics_vs_reference" in text


def _batch(labels: torch.Tensor) -> dict:
    return {"input_ids": torch.ones_like(labels), "attention_mask": torch.ones_like(labels), "labels": labels}


def test_labels_all_ignored_and_ranks_without_binding_through_the_recorder(monkeypatch):
    """A completion-only collator that never finds its template masks every label; two ranks on one node,
    each allowed on every CPU, share the cores without binding."""
    rec = recorder.InvariantRecorder(window=1)
    rec.on_batch(None, _batch(torch.full((4, 8), -100)), 0.0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rec.begin_measured()
    raw = rec.report()

    class Result:
        invariants, losses, python_warnings = raw, [], []

    host = current_host()
    got = {i.id: i for i in judge(Result(), cores=host.cores, online_cpus=len(__import__("os").sched_getaffinity(0)))}
    assert got["labels_all_ignored"].status == "fired" and got["labels_all_ignored"].value == 1.0
    assert got["eos_never_target"].status == "silent"  # nothing is a target at all: the other check's finding
    assert got["ranks_share_cores"].status == "fired" and got["ranks_share_cores"].value == 2
    ok = recorder.InvariantRecorder(window=1)
    ok.on_batch(None, _batch(torch.arange(32).reshape(4, 8)), 0.0)
    Result.invariants = ok.report()
    assert {i.id: i.status for i in judge(Result())}["labels_all_ignored"] == "silent"


def test_tolerances_and_remedies_are_the_documented_ones():
    assert unit_roundoff("torch.float16") == 2.0 ** -11 and unit_roundoff("torch.bfloat16") == 2.0 ** -8
    assert numerics_tolerance("torch.float32", 1) == 4 * 2.0 ** -24
    assert numerics_tolerance("torch.bfloat16", 400) == pytest.approx(2 * 2.0 ** -8 * 20)
    found = warning_remedies([("w.py:1", "`use_cache=True` is incompatible; setting `use_cache=False`"),
                              ("w.py:2", "You should pass attn_implementation=\"sdpa\"")])
    assert [(r["lever"], r["value"], r["field"], r["patchable"]) for r in found] == [
        ("use_cache", "False", None, False), ("attn_implementation", "sdpa", "attention_impl", True)]


def test_the_recorder_imports_only_the_standard_library_and_torch():
    tree = ast.parse(Path(recorder.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"__future__", "torch"} <= set(sys.stdlib_module_names), names


def test_more_loader_workers_do_not_fire_on_cores_the_run_keeps_busy():
    """Issue 25's premise: a rule that adds workers does not fire when the run already keeps the cores busy."""
    rule = load_kb().by_id["data.async_loading_on_gpu"]

    def ctx(busy):
        m = RunMetrics(step_time_s=0.01, samples_per_sec=100.0, cores_busy=busy, waste_budget={
            "useful": WasteBucket(seconds=0.008, status="measured"),
            "data_wait": WasteBucket(seconds=0.002, status="measured")})
        m.provenance.cuda_version, m.provenance.device = "12.4", "NVIDIA A100"
        return detect_context(ConfigDict(batch_size=32, dataloader_workers=0), m, current_host(), cores=8)

    assert match_rule(rule, ctx(False)).fired and match_rule(rule, ctx(None)).fired
    assert not match_rule(rule, ctx(True)).fired


def test_a_failing_hook_never_breaks_the_users_script():
    rec = recorder.InvariantRecorder(window=1)
    assert rec.before_step(object()) is None and rec.after_step(None) is None  # not optimizers: no raise
    assert len(rec.report()["errors"]) == 2 and "before_step: AttributeError" in rec.errors[0]


def _ranks(tmp_path, bind: bool) -> list[dict]:
    """Two real ranks on this node (torchrun, gloo; tests/data/ranks_workload), each recording its threads."""
    import subprocess
    import sys

    out = tmp_path / ("bound" if bind else "free")
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).parent / "data" / "ranks_workload" / "train.py"), "--out", str(out)]
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd + (["--bind"] if bind else []), env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="binding two ranks needs two CPUs")
def test_two_real_ranks_share_the_cores_unless_each_is_bound(tmp_path):
    """torchrun sets LOCAL_WORLD_SIZE=2 in each rank; unbound, each may run on every CPU of the node (the check
    fires in every rank); bound to a CPU each (as --numa-binding or taskset would), it stays silent."""
    import os

    online = len(os.sched_getaffinity(0))

    class Result:
        losses, python_warnings = [], []

    for bind, status in ((False, "fired"), (True, "silent")):
        for raw in _ranks(tmp_path, bind):
            Result.invariants = raw
            assert raw["threads"]["local_world_size"] == "2" and raw["threads"]["world_size"] == "2"
            assert raw["threads"]["affinity_cpus"] == (1 if bind else online)
            got = {i.id: i for i in judge(Result(), cores=online, online_cpus=online)}
            assert got["ranks_share_cores"].status == status, got["ranks_share_cores"]
            assert got["ranks_share_cores"].value == (2 if status == "fired" else 0)
