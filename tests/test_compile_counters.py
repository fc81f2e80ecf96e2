"""torch.compile's record of a run: graph breaks with reason and line, recompiles with the failing guard.

One real run of tests/data/broken/compiled_branchy (backend="eager": no C++
build) in the harness, compared with ``torch._dynamo.explain`` on the same
model and first batch.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from goblin_assets.measure.compile_counters import compile_stats, guard_class
from goblin_assets.measure.signals import run_signals, signal_counts
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload

WORKLOAD = Path(__file__).resolve().parents[1] / "tests" / "data" / "broken" / "compiled_branchy"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("compiled") / "home"))
    try:
        raw = LocalRunner(device="cpu", timeout_s=180, mem_cap_gb=None).run(
            load_workload(WORKLOAD), "benchmark", steps=6, warmup=2)
    finally:
        mp.undo()
    assert raw.ok, raw.failure
    return raw


def test_breaks_and_graphs_equal_dynamo_explain_on_the_same_model(compiled):
    import torch

    stats = compile_stats(compiled.result.dynamo)
    spec = importlib.util.spec_from_file_location("compiled_branchy_train", WORKLOAD / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defines Branchy; the training loop is under __main__
    torch.manual_seed(0)
    model = mod.Branchy()
    ids = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(0))  # the run's first batch
    explained = torch._dynamo.explain(model)(ids)
    first = [b for b in stats.graph_breaks if b.first_step == stats.compile_steps[0]]
    assert stats.first_call_graphs == explained.graph_count == 2
    assert len(first) == explained.graph_break_count == 1
    lines = {r.user_stack[-1].lineno for r in explained.break_reasons}
    assert {b.line for b in first} == lines
    assert first[0].where == "train.py:25" and "Tensor.item()" in first[0].reason


def test_recompiles_name_the_failing_guard_and_the_line(compiled):
    stats = compile_stats(compiled.result.dynamo)
    sizes = [r for r in stats.recompiles if r.guard_class == "size"]
    # the sequence length goes 16 -> 24 after step 4 (--switch 4): forward recompiles for the new size
    assert sizes and sizes[0].function == "forward" and sizes[0].where == "train.py:22"
    assert "size mismatch" in sizes[0].guard and sizes[0].step == 5
    values = [r for r in stats.recompiles if r.guard_class == "value"]
    # the resumed frame after .item() guards on the value as a constant: it recompiles as the value changes
    assert values and values[0].function.startswith("torch_dynamo_resume_in_forward_at_25")
    assert stats.graphs >= stats.first_call_graphs + len(stats.recompiles) - 1
    assert 0 < stats.compile_s < stats.run_s and 0 < stats.compile_share < 1
    assert "compiling took" in stats.headline() and "train.py:25" in stats.headline()


def test_graphs_and_recompiles_equal_a_compile_counter_over_the_same_calls(compiled, monkeypatch):
    """``explain`` sees one call; recompiles happen across calls.  The reference across calls is dynamo's own
    ``CompileCounterWithBackend`` (its backend is called once per graph compiled) on the same program, run
    in this process for as many steps as the harness saw: every graph the harness counted is one it
    compiled, and the recompiles are the graphs past the first call's (``explain``'s graph count)."""
    import runpy
    import sys

    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    stats = compile_stats(compiled.result.dynamo)
    counter = CompileCounterWithBackend("eager")
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, backend=None, **kw: compile_(model, backend=counter, **kw))
    monkeypatch.setattr(sys, "argv", ["train.py", "--steps", str(compiled.result.steps_seen)])
    torch._dynamo.reset()
    try:
        runpy.run_path(str(WORKLOAD / "train.py"), run_name="__main__")
    finally:
        torch._dynamo.reset()
    assert stats.graphs == counter.frame_count == 5
    assert len(stats.recompiles) == counter.frame_count - stats.first_call_graphs == 3


def test_signals_and_rules_read_the_record(compiled):
    counts = signal_counts(run_signals(compiled.result))
    assert counts["dynamo_graph_breaks"] == 1 and counts["dynamo_graph_break_item"] == 1
    assert counts["dynamo_graph_break_print"] == 0
    assert counts["dynamo_recompile_shapes"] >= 1 and counts["dynamo_recompile_values"] >= 1
    # no DataLoader: no samples counted, so no throughput (never a number made up)
    assert sum(p.samples for p in compiled.result.per_step) == 0


def test_guard_classes():
    assert guard_class("0/0: tensor 'ids' size mismatch at index 1. expected 16, actual 24") == "size"
    assert guard_class("1/0: ___stack0 == 0.8195393681526184   # if h.abs().mean().item() > 10.0:") == "value"
    assert guard_class("0/1: ___check_obj_id(L['self'], 1407)") == "other"
    assert compile_stats(None) is None


def test_compile_events_rows_validate_against_the_warehouse_table(compiled):
    from goblin_assets.measure.compile_counters import compile_events_frame
    from goblin_assets.warehouse.tables import schema

    stats = compile_stats(compiled.result.dynamo)
    frame = schema("compile_events").validate(compile_events_frame(stats, "r1", "compiled_branchy"))
    assert (frame["event"] == "graph_break").sum() == len(stats.graph_breaks)
    assert (frame["event"] == "recompile").sum() == len(stats.recompiles)
    assert set(frame.loc[frame["event"] == "recompile", "guard_class"]) <= {"size", "value", "other"}
    assert compile_events_frame(None, "r1", "w").empty
