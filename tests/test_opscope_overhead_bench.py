"""benchmarks/opscope_overhead.py's helpers: the naive-hooks statistics and the one-extra-read graph."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from goblin_assets.opscope.inject import inject_matmul_stats

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

_SPEC = importlib.util.spec_from_file_location(
    "opscope_overhead_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "opscope_overhead.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(torch.softmax(h @ h.transpose(-1, -2), -1) @ h)


def test_naive_hook_stats_are_the_sketch_set_by_torch_ops():
    x = torch.tensor([[1.0, -2.0, 0.0], [3.0, 0.0, -4.0]])
    sink: list = []
    bench.naive_hook_stats(x, sink)
    mn, mx, mean, l1, sumsq, nnz = sink[:6]
    assert (mn, mx, l1, sumsq, nnz) == (-4.0, 3.0, 10.0, 30.0, 4)
    assert mean == pytest.approx(-1 / 3)
    hist, chan, pos = sink[6:]
    assert hist.shape == (32,) and float(hist.sum()) == 6
    assert chan.tolist() == [3.0, 2.0, 4.0] and pos.tolist() == [5.0, 25.0]
    assert all(t.device.type == "cpu" for t in sink[6:])


def test_one_read_graph_keeps_the_outputs_and_reads_each_tapped_tensor_once():
    torch.manual_seed(0)
    model, x = Two().eval(), torch.randn(2, 5, 8)
    inj = inject_matmul_stats(model, (x,), infer=True)
    g = bench.one_read_graph(inj)
    with torch.no_grad():
        out = g(x)
        torch.testing.assert_close(out[0], model(x), rtol=0, atol=0)
        assert out[-1].numel() == inj.packed_length
    targets = [n.target for n in g.graph.nodes if n.op == "call_function"]
    reads = [n for n in g.graph.nodes if n.op == "call_function" and n.target is bench._read_once_into]
    assert len({n.args[0] for n in reads}) == len(reads) > 0          # each tensor once
    assert not any(getattr(t, "__name__", "") in ("_sketch_into", "_probs_into") for t in targets)
