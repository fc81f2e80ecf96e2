"""Device check: profile a workload on the GPU and load its trace with Holistic Trace Analysis.

    .venv/bin/python benchmarks/gpu_trace_check.py [WORKLOAD] [--steps 6] [--json]

For a session lent a GPU (CUDA or ROCm).  Profiles the workload (default
``workloads/minilm_lora_cls``, whose HF Trainer puts the model on the GPU)
with the local runner on ``cuda``, then:

* reads the Chrome trace with our reader and with HTA (``TraceAnalysis``),
  and prints both device-busy times (they should agree: the harness writes
  the profiler's own schema, untouched);
* prints the waste budget, including the GPU-only estimates
  ``precision_path`` and ``kernel_shape``, and ``headroom_batch``;
* runs ``goblin trace``'s analyses on the same file and prints our temporal
  breakdown beside HTA's default one, the graded findings and the
  critical-path verdicts.

Exit status 0 when HTA loads the trace, the busy times agree within 1% and
the temporal breakdowns (HTA's rounding) within 2 points,
1 otherwise, 2 when no GPU is visible.  Source of every number: measured on
the device in this run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from goblin_assets import REPO_ROOT


def check(workload: str, steps: int) -> dict:
    """Profile ``workload`` on cuda and compare our trace reading with HTA's (µs)."""
    from hta.trace_analysis import TraceAnalysis

    from goblin_assets.measure.profile import profile_run
    from goblin_assets.runners.local import LocalRunner
    from goblin_assets.runners.trace import read_trace
    from goblin_assets.runners.workload import load_workload
    from goblin_assets.trace.analysis import analyze_trace

    m = profile_run(load_workload(workload), LocalRunner(device="cuda", timeout_s=540, mem_cap_gb=None), steps=steps)
    if not m.ok:
        return {"ok": False, "failure": m.failure, "stderr_tail": m.stderr_tail}
    ours = read_trace(m.trace_path)
    hta = TraceAnalysis(trace_dir=str(Path(m.trace_path).parent), include_last_profiler_step=True)
    tb = hta.get_temporal_breakdown(visualize=False)
    hta_busy = float(tb["compute_time(us)"].iloc[0] + tb["non_compute_time(us)"].iloc[0])
    our_busy = sum(s.device_busy_us for s in ours.steps)
    # goblin trace's analyses of the same file, beside HTA's default breakdown (its rounding, last step dropped)
    rep = analyze_trace(m.trace_path)
    hta_default = TraceAnalysis(trace_dir=str(Path(m.trace_path).parent)).get_temporal_breakdown(visualize=False)
    mine = rep.tables["temporal"]
    rounded = mine[mine["timing"] == "hta_rounded"].iloc[0]
    agree = (abs(rounded["idle_time_pct"] - hta_default["idle_time_pctg"].iloc[0]) <= 2
             and abs(rounded["compute_time_pct"] - hta_default["compute_time_pctg"].iloc[0]) <= 2)
    return {"ok": abs(hta_busy - our_busy) <= 0.01 * max(our_busy, 1.0) and agree, "device": m.provenance.device,
            "temporal_ours": mine.to_dict("records"),
            "temporal_hta": hta_default[["idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"]].to_dict(
                "records"),
            "trace_findings": [f"{f.severity}: {f.message}" for f in rep.findings if f.severity != "ok"],
            "critical_path": rep.tables["critical_path"].drop(columns="ops_on_path").to_dict("records"),
            "hta_busy_us": hta_busy, "our_busy_us": our_busy, "hta_steps": [int(x) for x in hta.get_profiler_steps()],
            "gemm_calls": len(ours.gemms), "headroom_batch": m.headroom_batch,
            "memory_headroom_gb": m.memory_headroom_gb, "mfu_pct": m.mfu_pct, "trace": m.trace_path,
            "waste_budget": {k: {"seconds": b.seconds, "status": b.status, "note": b.note}
                             for k, b in m.waste_budget.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default=str(REPO_ROOT / "workloads" / "minilm_lora_cls"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU visible to torch (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    res = check(args.workload, args.steps)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
