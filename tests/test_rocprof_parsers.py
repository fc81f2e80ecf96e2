"""rocprofv3 / amd-smi parsers on fixture files, and the rocprof runner with stand-in tools.

The fixtures (tests/data/rocprof/README.md) follow the tools' documented
column sets and JSON shapes; the runner test puts a stand-in ``rocprofv3``
(which runs the harness child and then writes a kernel trace inside its
measured window) and ``amd-smi`` (which prints a fixture) in front of the real
child, so the whole path runs on a CPU machine.
"""
from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from goblin_assets.runners.base import ToolMissingError
from goblin_assets.runners.factory import make_runner
from goblin_assets.runners.rocprof import (
    RocprofParseError,
    RocprofRunner,
    kernel_breakdown,
    parse_amd_smi_json,
    parse_hip_api_csv,
    parse_kernel_trace_csv,
    summarize_rocprof,
    union_ns,
)
from goblin_assets.runners.workload import load_workload

DATA = Path(__file__).parent / "data" / "rocprof"
CORE = ["kernel_name", "agent_id", "start_ns", "end_ns", "dur_ns", "kernel_type", "category", "group",
        "correlation_id"]


@pytest.mark.parametrize("name, extra", [
    ("kernel_trace_current.csv", ["lds_block_size", "scratch_size", "vgpr_count", "accum_vgpr_count", "sgpr_count"]),
    ("kernel_trace_older.csv", ["private_segment_size", "group_segment_size"]),
    ("kernel_trace_rocpd.csv", ["guid", "lds_block_size", "vgpr_count"]),
])
def test_kernel_trace_column_sets_parse_by_header(name, extra):
    df = parse_kernel_trace_csv(DATA / name)
    assert set(CORE + extra) <= set(df.columns)
    assert len(df) >= 2
    assert (df["dur_ns"] == df["end_ns"] - df["start_ns"]).all()
    assert (df["dur_ns"] > 0).all()
    assert df["start_ns"].is_monotonic_increasing
    assert str(df["start_ns"].dtype) == "int64"
    assert df["grid_size_x"].notna().all()


def test_kernel_trace_agent_ids_and_kinds():
    cur = parse_kernel_trace_csv(DATA / "kernel_trace_current.csv")
    old = parse_kernel_trace_csv(DATA / "kernel_trace_older.csv")
    assert cur["agent_id"].iloc[0] == "Agent 4"
    assert old["agent_id"].iloc[0] == "2"
    kinds = dict(zip(cur["kernel_name"].str[:12], cur["kernel_type"]))
    assert kinds["ncclDevKerne"] == "COMMUNICATION"
    assert kinds["__amd_rocclr"] == "MEMORY"
    assert kinds["Cijk_Alik_Bl"] == "COMPUTATION"
    groups = dict(zip(cur["kernel_name"].str[:12], cur["group"]))
    assert groups == {"Cijk_Alik_Bl": "gemm", "void at::nat": "elementwise", "attn_fwd": "attention",
                      "bwd_kernel_d": "attention", "__amd_rocclr": "memory", "ncclDevKerne": "collective"}


def test_kernel_breakdown_and_union():
    k = parse_kernel_trace_csv(DATA / "kernel_trace_current.csv")
    top = kernel_breakdown(k, top=5)
    assert list(top.columns) == ["kernel_name", "kernel_type", "calls", "total_ns", "mean_ns", "pct_time"]
    assert top["kernel_name"].iloc[0].startswith("Cijk_Alik_Bljk_SB_MT64x16x32")
    assert top["calls"].iloc[0] == 2 and top["total_ns"].iloc[0] == 80_000
    assert kernel_breakdown(k, top=None)["pct_time"].sum() == pytest.approx(100.0)
    # the 2nd GEMM overlaps attn_fwd by 5 us: union < sum
    assert union_ns(k) == k["dur_ns"].sum() - 5_000
    assert union_ns(k, 1_000_000_000_000, 1_000_000_020_000) == 20_000


def test_hip_api_trace():
    h = parse_hip_api_csv(DATA / "hip_api_trace.csv")
    assert list(h.columns[:7]) == ["domain", "function", "process_id", "thread_id", "correlation_id",
                                   "start_ns", "end_ns"]
    assert h["function"].iloc[0] == "__hipRegisterFatBinary"
    assert h["correlation_id"].iloc[-1] == 24


def test_summary_over_window():
    k = parse_kernel_trace_csv(DATA / "kernel_trace_current.csv")
    h = parse_hip_api_csv(DATA / "hip_api_trace.csv")
    lo, hi = 1_000_000_000_000, 1_000_000_300_000
    samples = [{"t_s": 999.0, "util_pct": 5.0, "vram_used_gb": 1.0, "vram_total_gb": 206.1},
               {"t_s": 1000.0001, "util_pct": 90.0, "vram_used_gb": 50.0, "vram_total_gb": 206.1},
               {"t_s": 1000.0002, "util_pct": 70.0, "vram_used_gb": 52.0, "vram_total_gb": 206.1}]
    s = summarize_rocprof(k, h, samples, (lo, hi))
    assert s["window"] == "measured steps"
    assert s["kernels"] == 7
    assert s["device_busy_s"] == pytest.approx(220e-6)
    assert s["util_pct"] == pytest.approx(100 * 220 / 300)
    assert s["attention_kernel_loaded"] is True
    assert len(s["top_kernels"]) == 5
    assert s["kernel_time_by_type_s"]["COMMUNICATION"] == pytest.approx(50e-6)
    assert s["kernel_time_by_group_s"]["attention"] == pytest.approx(80e-6)  # attn_fwd 30 us + bwd_kernel_dk_dv 50 us
    assert s["kernel_time_by_group_s"]["gemm"] == pytest.approx(80e-6)
    # hipExtModuleLaunchKernel before the window is left out; 4 launches inside it
    assert s["hip_launch_calls"] == 4
    assert s["hip_sync_s"] == pytest.approx(56e-6)
    assert s["amd_smi"] == {"samples": 2, "util_pct_avg": 80.0, "vram_used_gb_peak": 52.0,
                            "vram_used_gb_avg": 51.0, "vram_total_gb": 206.1}


def test_summary_falls_back_to_whole_run_when_clocks_differ():
    k = parse_kernel_trace_csv(DATA / "kernel_trace_older.csv")
    s = summarize_rocprof(k, None, [], (1, 2))
    assert s["window"] == "whole run"
    assert s["kernels"] == 4
    assert s["attention_kernel_loaded"] is False
    assert any("clock" in w for w in s["warnings"])
    assert s["amd_smi"]["samples"] == 0 and s["amd_smi"]["util_pct_avg"] is None


def test_amd_smi_metric_list():
    s = parse_amd_smi_json((DATA / "amd_smi_metric.json").read_text())
    assert s["gpu"] == 0 and s["util_pct"] == 87.0
    assert s["vram_used_gb"] == pytest.approx(48231 * 1024**2 / 1e9)
    assert s["vram_total_gb"] == pytest.approx(196592 * 1024**2 / 1e9)


def test_amd_smi_gpu_data_envelope_and_na():
    text = (DATA / "amd_smi_metric_gpu_data.json").read_text()
    assert parse_amd_smi_json(text)["util_pct"] == 0.0
    s1 = parse_amd_smi_json(text, gpu=1)
    assert s1 == {"gpu": 1, "util_pct": None, "vram_used_gb": None,
                  "vram_total_gb": pytest.approx(196592 * 1024**2 / 1e9)}
    with pytest.raises(RocprofParseError, match="no GPU 7"):
        parse_amd_smi_json(text, gpu=7)


def test_amd_smi_monitor_in_gb():
    s = parse_amd_smi_json((DATA / "amd_smi_monitor.json").read_text())
    assert s["util_pct"] == 99.0
    assert s["vram_used_gb"] == pytest.approx(151.25 * 1024**3 / 1e9)


def test_amd_smi_bare_numbers_and_leading_noise():
    text = 'WARNING: something\n[{"gpu": 0, "usage": {"gfx_activity": "45 %"}, "mem_usage": {"used_vram": 1024}}]'
    s = parse_amd_smi_json(text)
    assert s["util_pct"] == 45.0 and s["vram_used_gb"] == pytest.approx(1024 * 1024**2 / 1e9)
    assert s["vram_total_gb"] is None


def test_parse_errors_name_file_and_column(tmp_path):
    bad = tmp_path / "kernel_trace.csv"
    bad.write_text('"Kind","Kernel_Name","Start_Timestamp"\n"KERNEL_DISPATCH","k",1\n')
    with pytest.raises(RocprofParseError, match=r"kernel_trace\.csv: missing column\(s\) end_timestamp"):
        parse_kernel_trace_csv(bad)
    bad.write_text('"Kernel_Name","Start_Timestamp","End_Timestamp"\n"k",1,x\n')
    with pytest.raises(RocprofParseError, match="line 2: column end_timestamp"):
        parse_kernel_trace_csv(bad)
    with pytest.raises(RocprofParseError, match="no such file"):
        parse_hip_api_csv(tmp_path / "absent.csv")
    with pytest.raises(RocprofParseError, match="amd-smi output: not JSON"):
        parse_amd_smi_json("amd-smi: command not supported")


@pytest.mark.skipif(shutil.which("rocprofv3") is not None, reason="rocprofv3 is installed here")
def test_missing_rocprofv3_is_named():
    with pytest.raises(ToolMissingError, match="rocprofv3: not found on PATH"):
        make_runner("rocprof", device="cpu")


FAKE_ROCPROFV3 = """\
#!{python}
import json, pathlib, subprocess, sys
args = sys.argv[1:]
cut = args.index("--")
opts, cmd = args[:cut], args[cut + 1:]
assert "--kernel-trace" in opts and "--hip-trace" in opts, opts
assert opts[opts.index("--output-format") + 1] == "csv", opts
out = pathlib.Path(opts[opts.index("-d") + 1]) / "host"
rc = subprocess.call(cmd)
spec = json.loads(pathlib.Path(cmd[-1]).read_text())
per = json.loads((pathlib.Path(spec["out_dir"]) / "result.json").read_text())["per_step"]
lo, hi = int(per[0]["t_start_s"] * 1e9), int(per[-1]["t_end_s"] * 1e9)
mid = (lo + hi) // 2
out.mkdir(parents=True)
head = '"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",' \\
       '"Correlation_Id","Start_Timestamp","End_Timestamp","LDS_Block_Size","Scratch_Size","VGPR_Count",' \\
       '"Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",' \\
       '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"'
rows = [("warmup_kernel", lo - 10**6, lo - 10**5), ("Cijk_Alik_Bljk_SB_MT64x64x16", lo + 1000, mid),
        ("elementwise_kernel", mid, mid + 1000)]
(out / "42_kernel_trace.csv").write_text(head + "\\n" + "".join(
    f'"KERNEL_DISPATCH","Agent 4",1,0,42,{{i}},{{i}},"{{n}}",{{i}},{{a}},{{b}},0,0,8,0,8,64,1,1,64,1,1\\n'
    for i, (n, a, b) in enumerate(rows)))
(out / "42_hip_api_trace.csv").write_text(
    '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\\n'
    f'"HIP_RUNTIME_API","hipLaunchKernel",42,42,1,{{lo + 500}},{{lo + 900}}\\n')
sys.exit(rc)
"""

TINY_TRAIN = """\
import torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
for epoch in range(100):
    for x, y in torch.utils.data.DataLoader(data, batch_size=8):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""


def _stand_in_rocprof(tmp_path):
    """A rocprof runner whose rocprofv3/amd-smi are the stand-ins above, and the tiny training script."""
    rocprofv3 = tmp_path / "rocprofv3"
    rocprofv3.write_text(FAKE_ROCPROFV3.format(python=sys.executable))
    amd_smi = tmp_path / "amd-smi"
    amd_smi.write_text(f"#!/bin/sh\ncat '{DATA / 'amd_smi_metric.json'}'\n")
    for tool in (rocprofv3, amd_smi):
        tool.chmod(0o755)
    script = tmp_path / "tiny_train.py"
    script.write_text(TINY_TRAIN)
    runner = make_runner("rocprof", device="cpu", timeout_s=60, rocprofv3=str(rocprofv3), amd_smi=str(amd_smi),
                         smi_interval_s=0.2)
    return runner, script


def test_rocprof_runner_with_stand_in_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    runner, script = _stand_in_rocprof(tmp_path)
    assert isinstance(runner, RocprofRunner)
    raw = runner.run(load_workload(script), "benchmark", steps=3, warmup=1)
    assert raw.ok, (raw.failure, raw.stderr_tail)
    s = raw.extra["rocprof"]
    assert s["window"] == "measured steps"
    assert s["kernels"] == 2  # the warm-up kernel is outside the measured window
    assert s["top_kernels"][0]["name"] == "Cijk_Alik_Bljk_SB_MT64x64x16"
    assert 0 < s["util_pct"] <= 100
    assert s["hip_launch_calls"] == 1
    assert s["amd_smi"]["vram_total_gb"] == pytest.approx(196592 * 1024**2 / 1e9)
    assert (raw.run_dir / "amd_smi.json").is_file()
    assert len(s["files"]) == 2


def test_rocprof_runner_without_kernel_trace_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    passthrough = tmp_path / "rocprofv3"
    passthrough.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import subprocess, sys
        args = sys.argv[1:]
        sys.exit(subprocess.call(args[args.index("--") + 1:]))
        """))
    passthrough.chmod(0o755)
    script = tmp_path / "tiny_train.py"
    script.write_text(TINY_TRAIN)
    runner = RocprofRunner(device="cpu", timeout_s=60, rocprofv3=str(passthrough), amd_smi=str(tmp_path / "none"))
    raw = runner.run(load_workload(script), "benchmark", steps=2, warmup=1)
    assert raw.ok, raw.failure
    assert "wrote no *kernel_trace.csv" in raw.extra["rocprof"]["error"]


def test_profile_run_merges_rocprof_and_amd_smi(tmp_path, monkeypatch):
    """profile_run through the rocprof runner: kernel-level figures replace the torch.profiler ones."""
    from goblin_assets.measure.profile import profile_run

    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    runner, script = _stand_in_rocprof(tmp_path)
    m = profile_run(load_workload(script), runner, steps=3, warmup=1)
    assert m.ok, (m.failure, m.stderr_tail)
    assert m.provenance.profiler == "torch.profiler + rocprofv3"
    assert [k.name for k in m.top_kernels] == ["Cijk_Alik_Bljk_SB_MT64x64x16", "elementwise_kernel"]
    assert 0 < m.util_pct <= 100
    assert m.mem_avg_gb is not None and "mem_avg_gb" not in m.not_observable
    assert m.memory_headroom_gb is not None and m.memory_headroom_gb > 0
    assert sum(b.seconds for b in m.waste_budget.values()) == pytest.approx(m.step_time_s, rel=0.05)


@pytest.mark.slow
def test_a_hung_run_under_rocprofv3_is_stopped_by_the_stall_watch(tmp_path, monkeypatch):
    """The dead-producer loop under a pass-through rocprofv3 (the tool's process stays between the runner and
    Python): the stall watch stops it well inside the timeout, with the main thread's waiting line."""
    from goblin_assets.measure.hang import read_hang_state

    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    passthrough = tmp_path / "rocprofv3"
    passthrough.write_text(f"#!{sys.executable}\nimport subprocess, sys\nargs = sys.argv[1:]\n"
                           "sys.exit(subprocess.call(args[args.index('--') + 1:]))\n")
    passthrough.chmod(0o755)
    runner = RocprofRunner(device="cpu", timeout_s=60, rocprofv3=str(passthrough), amd_smi=str(tmp_path / "none"),
                           stall_min_s=3.0)
    wl = Path(__file__).resolve().parent / "data" / "broken" / "dead_producer"
    raw = runner.run(load_workload(wl), "profile", steps=10, warmup=2)
    assert not raw.ok and raw.failure.startswith("train.py: hung: no optimizer step finished in "), raw.failure
    assert "the main thread waits on a queue at train.py:32" in raw.failure, raw.failure
    assert raw.wall_s < 60 and read_hang_state(raw.run_dir).stopped_by == "stall"
