"""Two ranks of one job on this node (torchrun, gloo): a few all-reduces of a small DDP model's gradients,
recorded by Goblin's invariant recorder in each rank (tests/test_invariants.py runs it).

``--bind``: each rank pins itself to its own CPU first (``os.sched_setaffinity``: what torchrun
--numa-binding, numactl or taskset per rank do); without it each rank may run on every CPU.
``--out DIR``: each rank writes its recorder's report to ``DIR/rank<N>.json``.
"""
import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from goblin_assets.runners.invariants import InvariantRecorder

p = argparse.ArgumentParser()
p.add_argument("--bind", action="store_true")
p.add_argument("--out", required=True)
args = p.parse_args()
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
if args.bind:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[local % len(cpus)]})
    torch.set_num_threads(1)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rec = InvariantRecorder(window=1)
rec.begin_measured()
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 16)).square().mean().backward()  # DDP all-reduces the gradients
    opt.step()
rec.end_measured()
Path(args.out, f"rank{rank}.json").write_text(json.dumps(rec.report()))
dist.destroy_process_group()
