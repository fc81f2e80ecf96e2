"""``goblin trace``, its diff, its asset and ``goblin audit --trace`` on real GPU traces recorded elsewhere.

The traces are the MIT-licensed test data of Holistic Trace Analysis and
TraceLens (copyright Meta Platforms, Inc. and affiliates; Advanced Micro
Devices, Inc.), kept unchanged beside the repository in ``../shared/traces``
(see its README for each file's source).  Expected numbers are computed in the
tests from the raw JSON, by a different selection than ours (kernel names),
never copied from our output.
"""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from goblin_assets.cli import main

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
ALL = sorted(TRACES.glob("*.json.gz")) if TRACES.is_dir() else []
pytestmark = pytest.mark.skipif(not ALL, reason="the recorded GPU traces (../shared/traces) are not here")
MI300X_TRAIN = TRACES / "mi300x_resnet_act_checkpoint_train.json.gz"
MI300X_QWEN = TRACES / "mi300x_qwen1.5-0.5b_infer.json.gz"
H100_QWEN = TRACES / "h100_qwen1.5-0.5b_infer.json.gz"


def _raw_step_kernels(path: Path) -> tuple[float, float]:
    """(all device time, GEMM time) in µs inside the host ProfilerStep windows, straight from the JSON.

    GEMM kernels picked by name: hipBLASLt/Tensile ``Cijk_*`` and any name containing ``gemm``.
    """
    events = json.load(gzip.open(path))["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation"
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    dev = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and any(a <= e["ts"] < b for a, b in steps)]
    gemm = [e for e in dev if e["name"].startswith("Cijk_") or "gemm" in e["name"].lower()]
    n = len(steps)
    return sum(e["dur"] for e in dev) / n, sum(e["dur"] for e in gemm) / n


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_goblin_trace_reads_every_shared_trace_in_under_10_s(goblin_home, path, capsys):
    t0 = time.perf_counter()
    assert main(["trace", str(path), "--json"]) == 0
    elapsed = time.perf_counter() - t0
    doc = json.loads(capsys.readouterr().out)
    assert elapsed < 10.0
    assert doc["tables"]["kernel_categories"], "every trace yields a kernel table"
    assert doc["metrics"]["provenance"]["kind"] == "replayed"
    assert {f["severity"] for f in doc["findings"]} <= {"ok", "moderate", "high"}
    assert all(f["threshold_source"] for f in doc["findings"] if f["threshold"])
    if path.name.startswith("rocprofv3"):
        assert doc["source_format"] == "rocprofv3_json" and doc["device"] == "AMD Instinct MI350X"
        assert set(doc["not_observable"]) >= {"critical_path", "recompute", "ops"}


def test_trace_rows_land_in_the_warehouse(goblin_home):
    from goblin_assets.warehouse.db import query

    assert main(["trace", str(TRACES / "mi250_minitoy_train_rocm6.2.json.gz")]) == 0
    runs = query("SELECT trace_id, source_format, steps FROM trace_runs")
    assert runs["source_format"].tolist() == ["kineto"] and runs["steps"].tolist() == [2]
    tid = runs["trace_id"].iloc[0]
    # the trace's RunMetrics goes where the audit's own runs go, labelled replayed
    assert query("SELECT provenance FROM runs WHERE run_id = ?", params=[tid])["provenance"].tolist() == ["replayed"]
    assert len(query("SELECT * FROM waste_budget WHERE run_id = ?", params=[tid])) == 6
    n_launch = query("SELECT count(*) AS n FROM trace_launch WHERE trace_id = ?", params=[tid])["n"].iloc[0]
    raw = json.load(gzip.open(TRACES / "mi250_minitoy_train_rocm6.2.json.gz"))["traceEvents"]
    launched = {e["args"]["correlation"] for e in raw if e.get("cat") == "cuda_runtime"
                and "LaunchKernel" in e["name"]}
    kernels = [e for e in raw if e.get("cat") == "kernel" and e["args"].get("correlation") in launched]
    assert n_launch == len(kernels)


def test_mi300x_vs_h100_diff_lists_the_categories_that_moved_most(capsys):
    assert main(["trace", str(MI300X_QWEN), str(H100_QWEN), "--json", "--no-warehouse"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cats = doc["diff"]["categories"]
    total_a, gemm_a = _raw_step_kernels(MI300X_QWEN)
    total_b, gemm_b = _raw_step_kernels(H100_QWEN)
    assert sum(c["a_time_per_step_us"] for c in cats) == pytest.approx(total_a)
    assert sum(c["b_time_per_step_us"] for c in cats) == pytest.approx(total_b)
    top = cats[0]
    assert top["category"] == "gemm"            # the largest share change: 39% of kernel time on MI300X, 28% on H100
    assert top["a_time_per_step_us"] == pytest.approx(gemm_a) and top["b_time_per_step_us"] == pytest.approx(gemm_b)
    assert abs(top["share_change_pp"]) == max(abs(c["share_change_pp"]) for c in cats)
    ops = doc["diff"]["ops"]
    mm = [o for o in ops if o["op"] == "aten::mm" and o["matched"]]
    assert mm and mm[0]["a_top_kernel"].startswith("Cijk_") and "gemm" in mm[0]["b_top_kernel"]


def test_trace_html_is_self_contained(tmp_path):
    out = tmp_path / "t.html"
    assert main(["trace", str(MI300X_TRAIN), "--html", str(out), "--no-warehouse"]) == 0
    page = out.read_text()
    assert "data:image/png;base64," in page and "recompute" in page and "http" not in page.split("<body>")[0]


def test_audit_from_a_trace_runs_nothing_and_fires_rules(goblin_home, monkeypatch, capsys):
    def no_child(*a, **k):
        raise AssertionError(f"goblin audit --trace started a process: {a[0] if a else k}")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    assert main(["audit", "--trace", str(MI300X_TRAIN), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "nothing was run" in doc["trace"]
    assert {"collectives.exposed_allreduce", "memory.activation_recompute_cost"} <= set(doc["fired_rules"])
    assert doc["benchmark"] in ({}, None, []) and doc["measured_speedup"] is None
    report = Path(doc["report_path"]).read_text()
    assert "collectives.exposed_allreduce" in report and "nothing measured by this run" in report


def test_audit_from_a_trace_reads_the_config_beside_it(goblin_home, tmp_path, capsys):
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(TRACES / "mi250_minitoy_train_rocm6.2.json.gz", folder / "rank0.json.gz")
    (folder / "train.yaml").write_text("learning_rate: 1.0e-4\nper_device_train_batch_size: 4\nbf16: true\n")
    assert main(["audit", "--trace", str(folder / "rank0.json.gz"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["batch_size"] == 4


def test_bad_trace_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    assert main(["trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "neither a Kineto trace" in err
    assert main(["trace", str(tmp_path / "missing.json.gz")]) == 2
    assert main(["audit", "--trace", str(bad)]) == 2


def test_recorded_trace_asset_materializes_a_partition(goblin_home, tmp_path, monkeypatch):
    import dagster as dg

    from goblin_assets.defs.resources import warehouse_resource
    from goblin_assets.defs.trace import recorded_trace, trace_names, traces_partitions

    monkeypatch.setenv("GOBLIN_TRACES", str(tmp_path))
    shutil.copy(TRACES / "mi250_minitoy_train_rocm6.2.json.gz", tmp_path / "mi250.json.gz")
    assert trace_names() == ["mi250.json.gz"]
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(traces_partitions.name, ["mi250.json.gz"])
    res = dg.materialize([recorded_trace], partition_key="mi250.json.gz", instance=instance,
                         resources={"warehouse": warehouse_resource()})
    assert res.success
    meta = res.asset_materializations_for_node("recorded_trace")[0].metadata
    assert meta["source_format"].value == "kineto" and meta["trace_id"].value.startswith("trace-mi250-")


def test_the_audits_own_gpu_runs_go_through_the_same_analyses(tmp_path):
    """A measured GPU run's trace (the Kineto-schema trace of tests/data/gpu_trace.py) gets the trace tables, and
    two such runs get the report's category diff; CPU runs and replays get neither."""
    from goblin_assets.contracts import RunMetrics, RunProvenance
    from goblin_assets.trace.analysis import device_trace_report, diff_markdown, trace_frames
    from tests.data.gpu_trace import STEPS, write_gpu_trace

    path = write_gpu_trace(tmp_path / "rank0.json")
    gpu = RunMetrics(trace_path=str(path), provenance=RunProvenance(kind="measured", device="NVIDIA H100 80GB HBM3"))
    rep = device_trace_report(gpu, "a-profile")
    frames = trace_frames(rep, audit_id="a", with_run=False)
    assert "runs" not in frames and frames["trace_runs"]["audit_id"].tolist() == ["a"]
    cats = frames["trace_kernel_categories"].set_index("category")["total_us"]
    assert cats["gemm"] == pytest.approx(60.0 * len(STEPS))      # 40 µs addmm + 20 µs mm kernels per step
    assert device_trace_report(gpu.model_copy(update={"provenance": RunProvenance(kind="measured")}), "x") is None
    assert device_trace_report(gpu.model_copy(update={"provenance": RunProvenance(kind="replayed",
                                                                                   device="MI300X")}), "x") is None
    md = "\n".join(diff_markdown(rep, rep))
    assert "| gemm | 60.0 | 60.0 |" in md and "+0.0 pp" in md


def test_h100_says_why_hta_cannot_compare(goblin_home, capsys):
    """HTA fails its own assertion on the H100 trace: goblin trace says why, and its recorded row adds up."""
    assert main(["trace", str(H100_QWEN), "--json", "--no-warehouse"]) == 0
    doc = json.loads(capsys.readouterr().out)
    why = [f for f in doc["findings"] if f["kind"] == "hta_cannot_compare"]
    assert len(why) == 1 and why[0]["value"] < 0 and "assertion" in why[0]["message"]
    rec = next(r for r in doc["tables"]["temporal"] if r["timing"] == "recorded")
    assert rec["non_compute_time_us"] >= 0
    assert rec["idle_time_pct"] + rec["compute_time_pct"] + rec["non_compute_time_pct"] == pytest.approx(100)
