"""``goblin fit``'s predicted peak against the measured peak of a real profiled run, on the shipped workloads.

    .venv/bin/python benchmarks/fit_accuracy.py [--workloads digits_mlp,minilm_lora_cls,../tests/data/docstring_lm_oom]
                                                [--steps 3] [--json]

For each workload (its folder relative to ``workloads/``, CPU, no
address-space cap):

1. ``goblin fit``: two memory probes at micro-batches 2 and 4, never the
   configured batch (:func:`goblin_assets.audit.fit.memory_fit`); the
   predicted peak is the memory model's sum of terms at the configured
   micro-batch;
2. a profiled run of the workload as configured (1 warm-up + ``--steps``
   steps, the harness's memory census on): its measured peak tensor memory
   (:func:`goblin_assets.audit.fit.measured_peak`: the live tensors at the
   step boundary plus the profiler's in-step peak over the step's start);
3. the weights + gradients + Adam-state terms against ``accelerate
   estimate-memory``'s formula on the same parameter count
   (``estimate_training_usage``, float32) where the workload's optimizer is
   Adam/AdamW and every parameter trains; else the terms it would give.

Printed per workload: predicted, measured, the error (predicted / measured -
1) and whether it is within 15 % (the issue's bar).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAR = 0.15


def one(name: str, steps: int) -> dict:
    from goblin_assets.audit.fit import measured_peak, memory_fit
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.runners.memory_probe import PROBE_ENV
    from goblin_assets.runners.workload import load_workload
    from goblin_assets.settings import AuditSettings

    st = AuditSettings(kind="local", device="cpu", mem_cap_gb=None, warmup_steps=1, profiled_steps=steps)
    s = AuditSession.open(load_workload(ROOT / "workloads" / name), settings=st)
    t0 = time.perf_counter()
    ans = memory_fit(s)
    t_fit = time.perf_counter() - t0
    raw = s.runner.run(s.workload, "profile", steps=steps, warmup=1, env={PROBE_ENV: "1"}, label="measured")
    if not raw.ok:
        return {"workload": Path(name).name, "error": raw.failure}
    measured, how = measured_peak(raw)
    pred = ans["peak_bytes"]
    terms = {t["name"]: t["bytes"] for t in ans["step"]["terms"]}
    return {"workload": Path(name).name, "micro_batch": ans["step"]["micro_batch"], "predicted_bytes": pred,
            "measured_bytes": measured, "error": pred / measured - 1.0, "within_bar": abs(pred / measured - 1) <= BAR,
            "measured_how": how, "fit_seconds": t_fit, "terms": terms,
            "saved_for_backward_bytes": (raw.result.memory or {}).get("saved_activation_bytes_by_step")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="digits_mlp,minilm_lora_cls")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("GOBLIN_HOME", tempfile.mkdtemp(prefix="goblin-fit-"))
    rows = [one(w, args.steps) for w in args.workloads.split(",")]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    print(f"{'workload':<20} {'micro-batch':>11} {'predicted MB':>13} {'measured MB':>12} {'error':>8}  within 15 %")
    for r in rows:
        if "error" in r and isinstance(r["error"], str):
            print(f"{r['workload']:<20} failed: {r['error']}")
            continue
        print(f"{r['workload']:<20} {r['micro_batch']:>11} {r['predicted_bytes'] / 1e6:>13.3f} "
              f"{r['measured_bytes'] / 1e6:>12.3f} {r['error']:>+8.1%}  {'yes' if r['within_bar'] else 'NO'}")
        print("    terms: " + ", ".join(f"{k} {(v or 0) / 1e6:.3f} MB" for k, v in r["terms"].items()))
    return 0 if all(r.get("within_bar") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
