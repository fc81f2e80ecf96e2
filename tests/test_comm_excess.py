"""comm_excess on a real CPU trace: two gloo ranks training with DistributedDataParallel under torch.profiler.

On CPU, gloo runs each collective in a ``gloo:<op>`` range on its worker
thread while the training thread issues ``c10d::allreduce_`` and goes on (or
waits, outside any op).  The exposed communication of a step is the gloo time
during which no other op runs on any thread.  The test recomputes it on a
1 µs grid, thread by thread, independently of the reader's interval algebra.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from goblin_assets.measure.waste import waste_budget
from goblin_assets.runners.categories import classify
from goblin_assets.runners.trace import read_trace

DDP = """\
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP

    def rank_main(rank, world, out):
        dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 256)
        sched = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                    record_shapes=True) as prof:
            for _ in range(4):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                prof.step()
        if rank == 0:
            prof.export_chrome_trace(f"{out}/rank0.json")
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank_main, args=(2, sys.argv[1]), nprocs=2)
    """


@pytest.fixture(scope="module")
def gloo_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gloo")
    script = out / "ddp.py"
    script.write_text(textwrap.dedent(DDP))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # loopback only
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300,
                          env=env)
    if proc.returncode != 0:
        pytest.fail(f"the 2-rank gloo run failed: {proc.stderr[-2000:]}")
    return out / "rank0.json"


def _grid_exposed(path: Path) -> tuple[list[float], list[float]]:
    """Per step: collective µs and exposed collective µs, on a 1 µs grid, thread by thread."""
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    coll_us, exposed_us = [], []
    for st in steps:
        lo, n = st["ts"], int(np.ceil(st["dur"]))
        coll = np.zeros(n, bool)
        busy = np.zeros(n, bool)
        threads: dict = {}
        for e in events:
            is_coll = classify(e["name"]).category == "collective"
            if e.get("cat") == "cpu_op" or (e.get("cat") == "user_annotation" and is_coll):
                threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], is_coll))
        for evs in threads.values():
            t_coll = np.zeros(n, bool)
            t_busy = np.zeros(n, bool)
            for a, b, is_coll in evs:
                i, j = max(int(round(a - lo)), 0), min(int(round(b - lo)), n)
                if i < j:
                    (t_coll if is_coll else t_busy)[i:j] = True
            coll |= t_coll
            busy |= t_busy & ~t_coll  # an op of this thread counts only outside its collectives
        coll_us.append(float(coll.sum()))
        exposed_us.append(float((coll & ~busy).sum()))
    return coll_us, exposed_us


def test_gloo_collectives_are_measured_and_their_exposed_time_found(gloo_trace):
    s = read_trace(gloo_trace)
    assert not s.has_device and s.backend == "gloo" and s.world_size == 2
    assert s.collectives > 0 and s.others > 0
    coll, exposed = _grid_exposed(gloo_trace)
    for st, c, x in zip(s.steps, coll, exposed):
        assert st.collective_us == pytest.approx(c, abs=0.02 * c + 5)
        assert st.comm_exposed_us == pytest.approx(x, abs=0.02 * c + 5)
        assert 0 < st.comm_exposed_us <= st.collective_us
    step_s = float(np.median([st.dur_us for st in s.steps])) * 1e-6
    b = waste_budget(s, step_s, bf16_matmul=False)
    comm = b["comm_excess"]
    assert comm.status == "measured" and comm.seconds > 0
    assert f"{s.collectives} collective ops (c10d/gloo)" in comm.note
    assert sum(v.seconds for v in b.values()) == pytest.approx(step_s, rel=0.05)


def test_an_nccl_job_traced_without_device_activity_cannot_show_its_collectives(gloo_trace, tmp_path):
    """The same trace claiming an NCCL process group: collective time is on a device it did not record."""
    doc = json.loads(gloo_trace.read_text())
    doc["distributedInfo"]["backend"] = "nccl"
    path = tmp_path / "nccl_cpu_only.json"
    path.write_text(json.dumps(doc))
    s = read_trace(path)
    step_s = float(np.median([st.dur_us for st in s.steps])) * 1e-6
    b = waste_budget(s, step_s, bf16_matmul=False)
    assert b["comm_excess"].status == "not_observable" and "nccl" in b["comm_excess"].note
    assert b["comm_excess"].seconds == 0.0
    assert sum(v.seconds for v in b.values()) == pytest.approx(step_s, rel=0.05)
