"""Trace reading at scale: our reader and HTA's TraceAnalysis on one 3-million-event Kineto trace.

    nice -n 19 python benchmarks/trace_scale.py [--events 3000000] [--base PATH] [--skip-hta] [--analyze]
                                                [--keep DIR]

Builds the trace from a shared one (default: the MI300X ResNet training trace,
``../shared/traces/mi300x_resnet_act_checkpoint_train.json.gz``, 56,451 events,
6 profiler steps): its events repeated copy after copy, each copy shifted by
the trace's span in time and renumbered (``ProfilerStep#N``, ``correlation``,
``External id``) so the copies are further steps of one run, written as one
``.json.gz`` (gzip level 1).  Then, each in its own subprocess, so each peak is
its own:

* **ours**: :func:`goblin_assets.trace.events.load_trace` (the frames and the
  audit's per-step summary every ``goblin trace`` analysis reads);
* **ours, every analysis** (``--analyze``): :func:`goblin_assets.trace.analysis.analyze_trace`,
  the reader and every ``goblin trace`` analysis (temporal breakdown, idle,
  kernels, launches, ops, recompute, critical path, sync causes, steps ...),
  with each analysis's seconds on stderr;
* **hta**: ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` (HTA 0.5 parses
  the trace into its frames on construction).

Printed per reader: wall seconds and peak resident memory (the child's own
``ru_maxrss``, from ``os.wait4``), both measured; with the ratios and the file's compressed and decompressed
sizes.  A reader that fails (e.g. runs out of memory) is reported with its
exit status, not hidden.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT.parent / "shared" / "traces" / "mi300x_resnet_act_checkpoint_train.json.gz"

_OURS = """
import sys
from goblin_assets.trace.events import load_trace
ev = load_trace(sys.argv[1])
print(len(ev.kernels), len(ev.cpu_ops), len(ev.steps), flush=True)
"""
_ANALYZE = """
import sys, time
from goblin_assets.trace.analysis import analyze_trace
last = [time.perf_counter()]
def say(line):
    now = time.perf_counter()
    print(f"  {now - last[0]:7.1f} s  {line}", file=sys.stderr, flush=True)
    last[0] = now
rep = analyze_trace(sys.argv[1], progress=say)
print(len(rep.tables), "analyses,", sum(len(t) for t in rep.tables.values()), "rows,",
      len(rep.not_observable), "not observable", flush=True)
"""
_HTA = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = TraceAnalysis(trace_dir=sys.argv[1])
df = t.t.get_trace(0)
print(len(df), flush=True)
"""


def build(base: Path, events: int, out: Path) -> tuple[int, int]:
    """Write ``out`` (.json.gz): ``base``'s events repeated until at least ``events``; returns (events, bytes raw)."""
    doc = json.load(gzip.open(base))
    evs = doc.pop("traceEvents")
    xs = [e for e in evs if "ts" in e]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in xs) - min(float(e["ts"]) for e in xs)
    span = float(int(span) + 1000)
    steps = [int(e["name"].split("#")[1]) for e in evs if str(e.get("name", "")).startswith("ProfilerStep#")]
    nstep = max(steps) - min(steps) + 1 if steps else 0
    ids = [v for e in evs for k in ("correlation", "External id") if isinstance(v := (e.get("args") or {}).get(k), int)]
    idspan = max(ids) + 1 if ids else 0
    copies = -(-events // len(evs))
    head = msgspec.json.encode(doc)[:-1]  # the header object without its closing brace
    n = raw = 0
    with gzip.open(out, "wb", compresslevel=1) as f:
        def put(b: bytes) -> None:
            nonlocal raw
            f.write(b)
            raw += len(b)

        put(head + (b',"traceEvents":[' if len(head) > 1 else b'"traceEvents":['))
        for c in range(copies):
            batch = []
            for e in evs:
                e = dict(e)
                if "ts" in e and c:
                    e["ts"] = float(e["ts"]) + c * span
                name = str(e.get("name", ""))
                if c and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + c * nstep}"
                if c and isinstance(e.get("args"), dict):
                    a = dict(e["args"])
                    for k in ("correlation", "External id"):
                        if isinstance(a.get(k), int) and a[k] > 0:
                            a[k] += c * idspan
                    e["args"] = a
                if c and e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
                    e["id"] += c * idspan
                batch.append(e)
            body = msgspec.json.encode(batch)[1:-1]
            put((b"," if c else b"") + body)
            n += len(batch)
        put(b"]}")
    return n, raw


def measure(code: str, arg: str, show_stderr: bool = False) -> dict:
    """Run ``code`` in a child interpreter: wall seconds, its own peak RSS (MiB, ``os.wait4``'s ``ru_maxrss``)
    and exit status (measured); ``show_stderr``: its stderr goes to ours as it runs (progress lines)."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE,
                         stderr=None if show_stderr else subprocess.PIPE, text=True)
    out, err = p.stdout.read(), (p.stderr.read() if p.stderr else "")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    tail = out.strip() or (err.strip().splitlines() or [""])[-1]
    return {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024, "rc": p.returncode, "out": tail}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--base", type=Path, default=BASE)
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--analyze", action="store_true", help="also time analyze_trace (every goblin trace analysis)")
    ap.add_argument("--keep", type=Path, help="build the trace in this folder and keep it")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="trace_scale_") if args.keep is None else None
    d = Path(tmp.name) if tmp else args.keep
    d.mkdir(parents=True, exist_ok=True)
    path = d / "rank-0.json.gz"
    t0 = time.perf_counter()
    n, raw = build(args.base, args.events, path)
    print(f"built {path.name}: {n:,} events from {args.base.name}, {raw / 2**20:,.0f} MiB decompressed, "
          f"{path.stat().st_size / 2**20:,.0f} MiB gzip, in {time.perf_counter() - t0:.0f} s")
    res = {"ours (goblin load_trace, msgspec)": measure(_OURS, str(path))}
    if args.analyze:
        res["ours, every analysis (analyze_trace)"] = measure(_ANALYZE, str(path), show_stderr=True)
    if not args.skip_hta:
        res["HTA 0.5 TraceAnalysis"] = measure(_HTA, str(d))
    for name, r in res.items():
        print(f"{name}: {r['wall_s']:.1f} s wall, peak RSS {r['peak_mib']:,.0f} MiB, exit {r['rc']} "
              f"[{r['out']}] (measured)")
    if "HTA 0.5 TraceAnalysis" in res:
        a, b = res["ours (goblin load_trace, msgspec)"], res["HTA 0.5 TraceAnalysis"]
        if a["rc"] == 0 and b["rc"] == 0:
            print(f"HTA / ours: time x{b['wall_s'] / a['wall_s']:.2f}, peak memory x{b['peak_mib'] / a['peak_mib']:.2f}")
    print(f"ours: peak RSS / decompressed size = {res['ours (goblin load_trace, msgspec)']['peak_mib'] * 2**20 / raw:.2f}")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "0")
    sys.exit(main())
