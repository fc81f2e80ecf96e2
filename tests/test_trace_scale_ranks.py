"""Issue 29: real traces as they come from jobs: the CUPTI-profiler trace, the compact reader, many ranks,
per-step outliers, graph-launched device time.

Test data (tests/data/traces/README.md): HTA's MIT-licensed test traces (a CUPTI range-profiler trace;
two ranks of one NCCL job), copyright Meta Platforms, Inc. and affiliates, unchanged; and traces
recorded here with ``benchmarks/record_gloo_ranks.py`` (torchrun, gloo, 2 ranks, rank 1 slowed).
Expected numbers are counted from the raw JSON in the tests, never copied from our output.
"""
from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from goblin_assets.cli import main

DATA = Path(__file__).parent / "data" / "traces"
CUPTI = DATA / "hta_cupti_profiler_a100.json.gz"


def test_cupti_profiler_trace_ends_critical_path_not_observable_without_a_traceback(goblin_home, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no library warning either (pandas FutureWarning, numpy RuntimeWarning)
        assert main(["trace", str(CUPTI), "--json", "--no-warehouse"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == "NVIDIA A100-PG509-200"
    assert "critical_path" in doc["not_observable"]
    assert "device events" in doc["not_observable"]["critical_path"]
    assert "argmax" not in json.dumps(doc["not_observable"])


GLOO = DATA / "gloo_2ranks_slow1"
HTA_RANKS = DATA / "hta_sampled_ranks"
SLOW_STEPS = DATA / "slow_steps_cpu.json.gz"


def _raw(path: Path) -> list[dict]:
    return json.load(gzip.open(path))["traceEvents"]


def _hand_collectives(files: list[Path], pick) -> list[tuple[str, int, float, float]]:
    """(kind, occurrence, latency = min duration across ranks, skew = max start - min start) counted by hand.

    ``pick(events)`` returns one rank's collectives as ``[(kind, ts, dur)]`` in issue order.
    """
    per_rank = [pick(_raw(f)) for f in files]
    out = []
    for kind in sorted({k for r in per_rank for k, _, _ in r}):
        seqs = [[(ts, dur) for k, ts, dur in r if k == kind] for r in per_rank]
        for i in range(min(map(len, seqs))):
            starts, durs = [s[i][0] for s in seqs], [s[i][1] for s in seqs]
            out.append((kind, i, min(durs), max(starts) - min(starts)))
    return out


def _gloo_pick(events):
    """gloo's own ranges, by name (``gloo:all_reduce`` -> all_reduce), in start order."""
    ev = sorted((e for e in events if str(e.get("name", "")).startswith("gloo:")), key=lambda e: e["ts"])
    return [(e["name"].split(":", 1)[1], e["ts"], e["dur"]) for e in ev]


def _nccl_pick(events):
    """The i-th NCCL kernel (by start) is the i-th ``nccl:<op>`` range (by start): the kind from the range."""
    ranges = sorted((e for e in events if str(e.get("name", "")).startswith("nccl:")), key=lambda e: e["ts"])
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
                     key=lambda e: e["ts"])
    assert len(ranges) == len(kernels)
    kind = {"all_reduce": "all_reduce", "all_to_all": "all_to_all", "_all_gather_base": "all_gather"}
    return [(kind[r["name"].split(":", 1)[1]], k["ts"], k["dur"]) for r, k in zip(ranges, kernels)]


@pytest.fixture(scope="module")
def gloo_job():
    from goblin_assets.trace.ranks import analyze_ranks

    return analyze_ranks([GLOO])


def test_slowed_rank_is_named_the_straggler_with_compute_as_its_cause(gloo_job):
    t = gloo_job["ranks"]
    assert list(t["rank"]) == [0, 1]
    slow = t[t["straggler"]]
    assert list(slow["rank"]) == [1] and slow["cause"].iloc[0] == "compute"
    fast = t[t["rank"] == 0].iloc[0]
    assert fast["collective_wait_us"] > 0.5 * fast["collective_us"]  # the fast rank waits inside its all-reduces
    f = [f for f in gloo_job["findings"] if f.kind == "straggler"][0]
    assert f.severity in ("moderate", "high") and "rank 1" in f.message and "compute" in f.message


@pytest.mark.parametrize("job, pick", [(GLOO, _gloo_pick), (HTA_RANKS, _nccl_pick)], ids=["gloo", "hta_nccl"])
def test_collective_latency_and_skew_match_a_count_by_hand(job, pick, gloo_job):
    from goblin_assets.trace.ranks import analyze_ranks

    coll = (gloo_job if job == GLOO else analyze_ranks([job]))["collectives"]
    files = sorted(job.glob("*.json.gz"))
    hand = _hand_collectives(files, pick)
    ours = {(r.collective, r.seq): (r.latency_us, r.skew_us) for r in coll.itertuples()}
    assert len(hand) == len(ours) >= 6
    for kind, i, lat, skew in hand:
        assert ours[(kind, i)] == pytest.approx((lat, skew), abs=1e-3), (kind, i)


def test_collective_bandwidth_follows_nccl_tests_formulas(gloo_job):
    from goblin_assets.trace.ranks import analyze_ranks

    r = gloo_job["collectives"].iloc[0]
    # gloo:all_reduce Input Dims [[262912]] float: 262912 x 4 bytes; busbw = algbw x 2(n-1)/n, n = 2
    assert r.size_bytes == 262912 * 4 and r.group_size == 2
    assert r.algbw_GBps == pytest.approx(r.size_bytes / (r.latency_us * 1e-6) / 1e9)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 2 * (2 - 1) / 2)
    assert pd_isna(r.link_peak_GBps) and "undetermined" in r.bandwidth_status  # gloo on a CPU: no link peak stated
    hta = analyze_ranks([HTA_RANKS])["collectives"]
    ag = hta[hta["collective"] == "all_gather"].iloc[0]
    # _all_gather_base of 16777216 int8 per rank in a group of 128: S = 128 x 16 MiB, busbw = algbw x 127/128
    assert ag.group_size == 128 and ag.size_bytes == 16777216 * 128
    assert ag.busbw_GBps == pytest.approx(ag.algbw_GBps * 127 / 128)


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def test_goblin_trace_dir_writes_a_warehouse_table_per_analysis(goblin_home, capsys):
    assert main(["trace", str(GLOO)]) == 0
    text = capsys.readouterr().out
    assert "rank 1 is the straggler" in text
    from goblin_assets.warehouse.db import query as read_sql

    ranks = read_sql("SELECT * FROM trace_ranks")
    coll = read_sql("SELECT * FROM trace_collectives")
    assert len(ranks) == 2 and len(coll) == 6 and ranks["trace_id"].nunique() == 1
    assert read_sql("SELECT count(*) AS n FROM trace_findings WHERE kind = 'straggler'")["n"].iloc[0] == 1


def test_injected_slow_steps_are_listed_with_their_cause(goblin_home):
    from goblin_assets.trace.analysis import analyze_trace

    rep = analyze_trace(SLOW_STEPS)
    steps = rep.tables["steps"]
    raw = {int(e["name"].split("#")[1]): e["dur"] for e in _raw(SLOW_STEPS)
           if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert dict(zip(steps["step"], steps["step_us"])) == pytest.approx(raw)
    out = steps[steps["outlier"]]
    assert dict(zip(out["step"], out["cause"])) == {3: "host", 5: "loader", 7: "host"}
    f = [f for f in rep.findings if f.kind == "outlier_steps"][0]
    assert f.severity != "ok" and [d["step"] for d in f.evidence["outliers"]] == [3, 5, 7]


SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.mark.parametrize("path", [DATA / "hta_trace_diff_control_train.json.gz",
                                  HTA_RANKS / "sampled_rank-0.json.gz",
                                  SHARED / "mi250_minitoy_train_rocm6.2.json.gz"], ids=lambda p: p.name)
def test_no_recompute_on_training_traces_without_checkpointing(path):
    from goblin_assets.trace.events import load_trace
    from goblin_assets.trace.recompute import activation_recompute, recompute_findings

    if not path.exists():
        pytest.skip(f"{path} is not here")
    ev = load_trace(path)
    raw = _raw(path)
    assert not any("checkpoint" in str(e.get("name", "")) for e in raw)  # no activation checkpointing recorded
    table = activation_recompute(ev)
    assert len(table) and float(table["recompute_us"].sum()) == 0.0
    assert recompute_findings(ev, table) == []


def test_mi300x_checkpointing_trace_keeps_its_recompute_by_both_detectors():
    from goblin_assets.trace.events import load_trace
    from goblin_assets.trace.ops import launched_gpu_us, outermost
    from goblin_assets.trace.recompute import activation_recompute, forward_ops_in_backward

    path = SHARED / "mi300x_resnet_act_checkpoint_train.json.gz"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    ev = load_trace(path)
    t = activation_recompute(ev)
    assert t["method"].iloc[0] == "python_stack"
    assert float(t["recompute_us"].median()) == pytest.approx(1406.7, abs=1.0)  # 1.4 ms per step
    r = outermost(forward_ops_in_backward(ev.cpu_ops))  # the no-stack detector finds the same time
    assert launched_gpu_us(ev, r["tid"], r["ts_us"], r["end_us"]).sum() == pytest.approx(t["recompute_us"].sum(), rel=0.01)


GRAPH_DECODE = DATA / "tracelens_sglang_qwen3-8b_decode_mi300x.json.gz"


def test_graph_launched_share_is_reported_and_marks_per_op_findings(goblin_home):
    from goblin_assets.trace.analysis import analyze_trace

    raw = _raw(GRAPH_DECODE)
    corr = {e["args"]["correlation"] for e in raw if e.get("name") in ("hipGraphLaunch", "cudaGraphLaunch")}
    dev = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    share = 100.0 * sum(e["dur"] for e in dev if e["args"].get("correlation") in corr) / sum(e["dur"] for e in dev)
    rep = analyze_trace(GRAPH_DECODE)
    g = [f for f in rep.findings if f.kind == "graph_launched"][0]
    assert g.value == pytest.approx(share, abs=0.01) and g.severity == "high"
    per_op = [f for f in rep.findings if f.analysis in ("ops", "launch", "recompute", "critical_path")]
    assert per_op and all("unreliable" in f.evidence for f in per_op)


def test_no_graph_finding_on_a_trace_without_graph_launches():
    from goblin_assets.trace.analysis import analyze_trace

    rep = analyze_trace(SLOW_STEPS)
    assert not [f for f in rep.findings if f.kind == "graph_launched" or "unreliable" in f.evidence]


@pytest.mark.slow
def test_live_audit_names_the_steps_that_sleep(goblin_home, tmp_path):
    """A real profiled run (harness, torch.profiler): every 4th optimizer step sleeps 400 ms.  The same run
    shows every ConfigDict field observed, equal to what the loop wrote it used (issue 27)."""
    import json

    from goblin_assets.measure.profile import profile_run
    from goblin_assets.runners.local import LocalRunner
    from goblin_assets.runners.workload import load_workload
    from tests.test_observed import observed_equals_truth

    truth = tmp_path / "truth.json"
    m = profile_run(load_workload(Path(__file__).parent / "data" / "sleepy_workload"), LocalRunner(timeout_s=300),
                    steps=8, warmup=2, env={"OBSERVE_TRUTH": str(truth)})
    assert m.ok, m.failure
    observed_equals_truth(m, json.loads(truth.read_text()))
    assert len(m.all_step_times_s) == 10 and len(m.step_times_s) == 8  # every step, warm-up included
    measured = {o["step"]: o for o in m.step_outliers if o["phase"] == "measured"}
    assert {4, 8} <= set(measured), (m.all_step_times_s, m.step_outliers)  # a loaded machine may add others
    assert all(measured[n]["cause"] == "host" for n in (4, 8)), m.step_outliers  # a sleep: no op, loader, sync
    # the audit report lists them (the warm-up's slow first steps are expected and left out)
    from goblin_assets.report.markdown import outliers_markdown

    table = outliers_markdown(m.step_outliers)
    rows = {int(ln.split("|")[1]): ln for ln in table if ln.startswith("| ") and ln.split("|")[1].strip().isdigit()}
    assert set(rows) == set(measured) and all(rows[n].rstrip().endswith("| host |") for n in (4, 8)), table


@pytest.mark.slow
def test_live_audit_names_a_checkpoint_save_as_the_cause_of_its_steps(goblin_home):
    """The same loop whose every 4th step stalls in ``torch.save`` (``--stall save``: a 400 ms write): the harness
    times every save with its step and caller, and the outlier steps name the save, not a bucket."""
    from goblin_assets.measure.profile import profile_run
    from goblin_assets.report.markdown import outliers_markdown
    from goblin_assets.runners.local import LocalRunner
    from goblin_assets.runners.workload import load_workload

    wl = load_workload(Path(__file__).parent / "data" / "sleepy_workload")
    m = profile_run(wl.model_copy(update={"args": ["--stall", "save"]}), LocalRunner(timeout_s=300), steps=8,
                    warmup=2)
    assert m.ok, m.failure
    measured = {o["step"]: o for o in m.step_outliers if o["phase"] == "measured"}
    assert {4, 8} <= set(measured), (m.all_step_times_s, m.step_outliers)
    for n in (4, 8):
        o = measured[n]
        assert o["cause"] == "checkpoint_save", o
        assert o["cause_detail"].startswith("1 torch.save call took 0.4") and "(train.py:" in o["cause_detail"], o
    table = "\n".join(outliers_markdown(m.step_outliers))
    assert "| checkpoint_save: 1 torch.save call took" in table


def test_an_outlier_is_blamed_on_timed_events_only_when_they_explain_most_of_its_excess():
    from goblin_assets.measure.step_outliers import outlier_steps

    times = [0.1] * 6 + [0.5, 0.1, 0.5, 0.1]        # steps 7 and 9: 0.4 s over the 0.1 s median
    events = [{"step": 7, "seconds": 0.35, "kind": "checkpoint_save", "where": "train.py:40 in save"},
              {"step": 9, "seconds": 0.1, "kind": "checkpoint_save", "where": "train.py:40 in save"},
              {"step": 9, "seconds": 0.05, "kind": "compile", "where": None},
              {"step": 2, "seconds": 0.05, "kind": "compile", "where": None}]
    out = {o["step"]: o for o in outlier_steps(times, warmup=2, events=events)}
    assert set(out) == {7, 9}
    assert out[7]["cause"] == "checkpoint_save" and out[7]["cause_detail"] == (
        "1 torch.save call took 0.350 s of the 0.400 s over the median (train.py:40 in save)")
    assert out[9]["cause"] == "not_observable" and "cause_detail" not in out[9]  # 0.15 s of 0.4: not the save


@pytest.mark.slow
def test_recorded_job_asset_materializes_a_folder_of_ranks(goblin_home, tmp_path, monkeypatch):
    import shutil

    import dagster as dg

    from goblin_assets.defs.resources import warehouse_resource
    from goblin_assets.defs.trace import job_names, jobs_partitions, recorded_job

    monkeypatch.setenv("GOBLIN_TRACES", str(tmp_path))
    shutil.copytree(GLOO, tmp_path / "job1")
    assert job_names() == ["job1"]
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(jobs_partitions.name, ["job1"])
    res = dg.materialize([recorded_job], partition_key="job1", instance=instance,
                         resources={"warehouse": warehouse_resource()})
    assert res.success
    from goblin_assets.warehouse.db import query

    assert list(query("SELECT rank FROM trace_ranks WHERE straggler")["rank"]) == [1]


def test_scale_benchmark_trace_repeats_the_steps_and_the_reader_reads_each_copy_alike(tmp_path):
    """benchmarks/trace_scale.py's builder on a small shared trace: N copies read as N times the events and
    steps, each copy's steps with the same durations and buckets (the reader is the same on every copy)."""
    import importlib.util

    from goblin_assets.trace.events import load_trace

    base = SHARED / "mi250_minitoy_train_rocm6.2.json.gz"
    if not base.exists():
        pytest.skip(f"{base} is not here")
    spec = importlib.util.spec_from_file_location("trace_scale", Path(__file__).parents[1] / "benchmarks" / "trace_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    one, big = load_trace(base), tmp_path / "rank-0.json.gz"
    n, _ = mod.build(base, 3 * 220, big)
    ev = load_trace(big)
    assert n == 3 * 220 and len(ev.kernels) == 3 * len(one.kernels) and len(ev.steps) == 3 * len(one.steps)
    per = [round(s.dur_us, 3) for s in ev.summary.steps]
    assert per == [round(s.dur_us, 3) for s in one.summary.steps] * 3
    assert [round(s.device_busy_us, 3) for s in ev.summary.steps] == \
        [round(s.device_busy_us, 3) for s in one.summary.steps] * 3
