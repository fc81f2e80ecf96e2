"""Record real multi-rank traces on the CPU: DDP over gloo, one rank slowed on purpose, torch.profiler per rank.

    torchrun --nproc-per-node 2 benchmarks/record_gloo_ranks.py OUT_DIR [--slow-rank 1] [--slow-ms 20]
    python benchmarks/record_gloo_ranks.py OUT_DIR --single --sleep-every 4   # one process, injected slow steps

Each rank trains a small MLP (256-512-256, batch 64) under
``DistributedDataParallel`` (gloo all-reduces its gradients in backward) and
writes ``rank<R>.json.gz``: the Kineto trace ``torch.profiler`` exports, with
``ProfilerStep#N`` windows (schedule wait 1, warmup 1, active 6).  The slow
rank runs ``--slow-ms`` of extra matrix multiplies in every step's forward
(``extra_compute`` range), so the other ranks wait for it inside the
all-reduce: the straggler's cause is compute.  ``--single`` records one
process without a process group whose every ``--sleep-every``-th step sleeps
``--slow-ms`` (``time.sleep``, no op: host time) and whose DataLoader stalls
on one batch (loader time), the per-step outlier test data.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule


class _Slow(torch.utils.data.Dataset):
    """64x256 random batches; item ``stall`` sleeps ``stall_s`` (a data-loading stall)."""

    def __init__(self, n: int, stall: int, stall_s: float):
        self.n, self.stall, self.stall_s = n, stall, stall_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.stall:
            time.sleep(self.stall_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow-ms", type=float, default=20.0)
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--sleep-every", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    single = args.single
    rank = 0
    if not single:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    if not single:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps = 8
    # item 5 of the loader is fetched in profiler step 5 (after wait 1 + warmup 1 the active steps are 2..7)
    loader = torch.utils.data.DataLoader(_Slow(steps, 5 if single else -1, args.slow_ms / 1e3),
                                         batch_size=None)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / f".rank{rank}.json"
    w = torch.randn(512, 512)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=6), record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(tmp))) as prof:
        for step, (x, y) in enumerate(loader):
            if not single and rank == args.slow_rank:
                with record_function("extra_compute"):
                    t0 = time.perf_counter()
                    while time.perf_counter() - t0 < args.slow_ms / 1e3:
                        w = torch.tanh(w @ w * 1e-3)
            if single and step % args.sleep_every == args.sleep_every - 1:
                time.sleep(args.slow_ms / 1e3)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    with open(tmp, "rb") as src, gzip.open(args.out / f"rank{rank}.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(tmp)
    if not single:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
