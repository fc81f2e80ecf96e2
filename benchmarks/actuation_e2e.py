"""The actuation plan's speedups, op level vs end to end, on the packaged workloads (CPU, one thread).

    .venv/bin/python benchmarks/actuation_e2e.py [--models digits_mlp,minilm_lora_cls] [--steps 2]
                                                [--repeats 5] [--pairs 6] [--no-train] [--limit N] [--json]

For each model (``workloads/digits_mlp``: the 64-256-256-10 MLP of its
``train.py`` on its augmented scikit-learn digits, batch 64;
``workloads/minilm_lora_cls``: all-MiniLM-L6-v2 + LoRA r=8 on query/value,
12 labels, standard-library docstrings padded to 64 tokens, batch 8), in one
run:

1. record ``--steps`` training steps' matmul sketches with ``MatmulTap``
   (:func:`goblin_assets.opscope.plan_e2e.record_target`);
2. mine them and build the actuation plan with its op-level A/B micro-benchmarks
   (:func:`goblin_assets.opscope.plan.plan`, ``--repeats`` timed blocks per form);
3. for every kept candidate (an op-level A/B measured, on an ``nn.Linear``
   site) replace that module in the model by the exploited form that won at
   op level and time the whole forward (and a training step: forward +
   backward, where the exploit runs under autograd) A/B, ``--pairs``
   alternating blocks, Student's t interval on the paired log ratios
   (:func:`goblin_assets.measure.benchmark.speedup_interval`); the exploited
   output is checked against the original (relative Frobenius error vs the
   exploit's tolerance, :data:`~goblin_assets.opscope.plan_e2e.E2E_TOLERANCE`);
4. apply each exploit at all its kept sites at once and time that too.

Printed per candidate: op-level speedup (median ratio, and the unpaired Welch
interval of the per-block times), end-to-end forward and training-step
speedups with 95 % intervals and verdicts (``no significant change end to
end`` when the interval contains 1.0), and the numeric check.  Speedups are
original time / exploited time (> 1 is faster).  ``--limit N``: only the first N
distinct replacements per model are timed alone (MiniLM has ~130, ~20 s each
with the training step on a 2-core machine); the all-sites-at-once A/B still
covers every kept candidate.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from goblin_assets.opscope.miner import mine_patterns  # noqa: E402
from goblin_assets.opscope.plan import AB_THREADS, REPEATS, plan  # noqa: E402
from goblin_assets.opscope.plan_e2e import E2E_PAIRS, measure_e2e, record_target, workload_target  # noqa: E402


def _iv(d: dict | None) -> str:
    if not d:
        return "-"
    if d.get("low") is None:
        return f"{d['point']:.2f}x (no interval)"
    return f"{d['point']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]"


def run_model(name: str, steps: int, repeats: int, pairs: int, train: bool, limit: int | None) -> dict:
    t0 = time.perf_counter()
    target = workload_target(name, steps=steps)
    sk = record_target(target, run_id=f"actuation-e2e-{name}")
    pat = mine_patterns(sk)
    pl = plan(pat, sk, repeats=repeats)
    out, comb = measure_e2e(pl, target, sk, pairs=pairs, train=train, max_candidates=limit,
                            log=lambda s: print("  " + s, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    rows = []
    for r in out.itertuples():
        ev = json.loads(r.evidence_json)
        e = ev.get("e2e")
        rows.append({"site": r.site, "module": (e or {}).get("module"), "role": r.role, "exploit": r.exploit,
                     "form": ev.get("form"), "op_speedup": r.measured_speedup, "op_interval": ev.get("op_interval"),
                     "e2e_forward": (e or {}).get("forward"), "e2e_train_step": (e or {}).get("train_step"),
                     "train_note": (e or {}).get("train_step_not_applicable"),
                     "rel_err": (e or {}).get("rel_err"), "tolerance": (e or {}).get("tolerance"),
                     "within_tolerance": (e or {}).get("within_tolerance"),
                     "shared_with": ev.get("e2e_shared_with"), "not_measured": ev.get("e2e_not_measured")})
    b0 = target.batches[0]
    shape = list((b0[0] if isinstance(b0, tuple) else b0["input_ids"]).shape)
    return {"model": name, "batch_shape": shape, "sketch_rows": len(sk), "findings": len(pat), "plan_rows": len(pl),
            "candidates": rows, "combined": comb.to_dict("records"), "wall_s": wall}


def show(res: dict) -> None:
    print(f"\n== {res['model']}  batch {res['batch_shape']}  ({res['sketch_rows']} sketch rows, {res['findings']} "
          f"findings, {res['plan_rows']} plan rows, {res['wall_s']:.0f} s)")
    print(f"{'site':<12} {'role':<4} {'exploit':<26} {'form':<30} {'op level':<22} {'e2e forward':<22} "
          f"{'verdict (forward)':<34} {'e2e train step':<22} {'rel err / tol':<18}")
    measured = [c for c in res["candidates"] if c["e2e_forward"] is not None]
    for c in measured:
        f = c["e2e_forward"]
        opiv = c["op_interval"]
        op = f"{c['op_speedup']:.2f}x" + (f" [{opiv['low']:.2f}, {opiv['high']:.2f}]" if opiv and opiv.get("low") else "")
        step = _iv(c["e2e_train_step"]) if c["e2e_train_step"] else "inference only"
        chk = f"{c['rel_err']:.1e}/{c['tolerance']:.0e}" + ("" if c["within_tolerance"] else " OVER")
        shared = " (=" + c["shared_with"] + ")" if c["shared_with"] else ""
        print(f"{c['site']:<12} {c['role']:<4} {c['exploit']:<26} {str(c['form']):<30} {op:<22} {_iv(f):<22} "
              f"{f['verdict']:<34} {step:<22} {chk}{shared}")
    skipped = [c for c in res["candidates"] if c["e2e_forward"] is None]
    if skipped:
        why: dict[str, int] = {}
        for c in skipped:
            k = (c["not_measured"] or "?").split(":")[0]
            why[k] = why.get(k, 0) + 1
        print("not measured end to end: " + "; ".join(f"{n} x {k}" for k, n in why.items()))
    for k in ("faster end to end", "slower end to end", "no significant change end to end"):
        n = sum(1 for c in measured if c["e2e_forward"]["verdict"] == k)
        print(f"  forward {k}: {n} of {len(measured)}")
    n_op = sum(1 for c in measured if c["op_interval"] and c["op_interval"].get("low") and c["op_interval"]["low"] > 1)
    print(f"  faster at op level (Welch interval > 1): {n_op} of {len(measured)}")
    for c in res["combined"]:
        step = (f"{c['step_point']:.2f}x [{c['step_low']:.2f}, {c['step_high']:.2f}] {c['step_verdict']}"
                if c.get("step_point") == c.get("step_point") and c.get("step_point") is not None
                else f"inference only ({c['train_note']})")
        print(f"  all {c['n_modules']} {c['exploit']} sites at once: forward {c['fwd_point']:.2f}x "
              f"[{c['fwd_low']:.2f}, {c['fwd_high']:.2f}] {c['fwd_verdict']}; train step {step}; "
              f"rel err {c['rel_err']:.1e} (tol {c['tolerance']:.0e})"
              + ("" if c["rel_err"] <= c["tolerance"] else "  OUTSIDE TOLERANCE: not a usable exploit as is"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="digits_mlp,minilm_lora_cls")
    ap.add_argument("--steps", type=int, default=2, help="training steps recorded (sketches)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed blocks per op-level form")
    ap.add_argument("--pairs", type=int, default=E2E_PAIRS, help="alternating pairs per end-to-end A/B")
    ap.add_argument("--no-train", action="store_true", help="forward only")
    ap.add_argument("--limit", type=int, default=None, help="replacements timed alone per model (default all)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    print(f"actuation_e2e: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{AB_THREADS} intra-op thread(s), op-level repeats {a.repeats}, e2e pairs {a.pairs}")
    results = [run_model(m, a.steps, a.repeats, a.pairs, not a.no_train, a.limit) for m in a.models.split(",")]
    if a.json:
        print(json.dumps(results, default=float, indent=1))
    else:
        for r in results:
            show(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
