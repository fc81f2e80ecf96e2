"""Dataflow mining: repeated cones of MiniLM's exported graph and of a small MoE model, motifs, the edge-list loader."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from goblin_assets.opscope.dataflow import (
    GraphFormatError, dataflow, dataflow_findings, dump_graph, graph, graph_from_module, minilm_graph, motifs,
    op_histogram, parse_graph,
)
from goblin_assets.warehouse.db import validate


class MoEBlock(nn.Module):
    """Top-2-of-8 mixture of experts, dense-gated (every expert runs, unchosen gates are 0) so that it exports."""

    def __init__(self, d: int = 64, h: int = 32, n_experts: int = 8, k: int = 2, router_bias=None):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
                                     for _ in range(n_experts))
        if router_bias is not None:
            with torch.no_grad():
                self.gate.bias.copy_(torch.as_tensor(router_bias, dtype=torch.float32))

    def forward(self, x):
        probs = self.gate(x).softmax(-1)
        w, idx = torch.topk(probs, self.k, dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, idx, w)
        y = x
        for e, expert in enumerate(self.experts):
            y = y + expert(x) * gates[..., e:e + 1]
        return y


class TinyMoE(nn.Module):
    """Two stacked MoE blocks on 64-d tokens (the digits' 64 pixels)."""

    def __init__(self, blocks: int = 2, **kw):
        super().__init__()
        self.blocks = nn.ModuleList(MoEBlock(**kw) for _ in range(blocks))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def digits_tokens(n: int = 512) -> torch.Tensor:
    from sklearn.datasets import load_digits

    return torch.tensor(load_digits().data[:n] / 16.0, dtype=torch.float32)


@pytest.fixture(scope="module")
def minilm():
    return minilm_graph()


def test_minilm_flow_finds_the_encoder_layer_six_times(minilm):
    hist = op_histogram(minilm)
    assert hist["linear"] == 37 and hist["softmax"] == 6            # measured_facts: 37 linear sites, eager softmax
    cones = dataflow(minilm)
    top = cones.iloc[0]
    assert top["count"] == 6 and top["within"] is None
    assert top["name"] == "fused_transformer_layer"
    ops = list(top["ops"])
    # one encoder layer: q, k, v, attention output, FFN in and out = 6 linears; softmax; GELU; 2 LayerNorms
    assert ops.count("linear") == 6 and ops.count("softmax") == 1 and ops.count("gelu") == 1
    assert ops.count("layer_norm") == 2 and ops.count("matmul") == 2
    assert [int(r.split("_")[-1]) for r in top["roots"]] == [2, 4, 6, 8, 10, 12]   # the layers' output LayerNorms
    inside = cones[cones.within == top["cone_id"]]
    assert {"fused_attention_block", "fused_matmul_bias_act"} <= set(inside.name)
    att = inside[inside.name == "fused_attention_block"].iloc[0]
    assert att["count"] == 6 and "softmax" in att["ops"]
    pat = dataflow_findings(cones, run_id="t-flow", workload="minilm")
    validate("patterns", pat)
    assert (pat.finding == "fusion_candidate").all() and pat.score.iloc[0] == 6 * (top["size"] + 1)


def test_edge_list_round_trip_finds_the_same_layer(minilm, tmp_path):
    p = tmp_path / "minilm.graph"
    p.write_text(dump_graph(minilm))
    g = graph(p)
    assert len(g.nodes) == len(minilm.nodes)
    top = dataflow(g).iloc[0]
    assert top["count"] == 6 and top["size"] == dataflow(minilm).iloc[0]["size"]


def test_moe_flow_names_a_fused_moe_block():
    m = TinyMoE().eval()
    g = graph_from_module(m, (digits_tokens(64),))
    assert op_histogram(g)["topk"] == 2
    cones = dataflow(g)
    top = cones.iloc[0]
    assert top["name"] == "fused_moe_block" and top["count"] == 2 and "topk" in top["ops"]
    assert top["ops"].count("linear") == 1 + 2 * 8                  # router + 8 experts x 2
    experts = cones[cones.within == top["cone_id"]]
    assert (experts.name == "fused_matmul_bias_act").any()
    assert experts[experts.name == "fused_matmul_bias_act"].iloc[0]["count"] == 16   # 8 experts x 2 blocks


def test_motifs_on_an_op_chain():
    chain = ["embed"] + ["linear", "relu", "linear", "add"] * 3 + ["softmax"]
    m = motifs(chain, min_len=2, max_len=6)
    best = m.iloc[0]
    assert best["count"] == 3 and best["length"] == 4
    assert set(best["motif"].split(" > ")) == {"linear", "relu", "add"}


def test_edge_list_errors_name_file_and_line(tmp_path):
    ok = "# comment\nx input -\nw param -\nn1 aten.linear.default x,w\nn2 aten.relu.default n1\n"
    g = parse_graph(ok, "ok.graph")
    assert [n.kind for n in g.ops()] == ["linear", "relu"]
    with pytest.raises(GraphFormatError, match=r"bad.graph:2: expected 'id op inputs'"):
        parse_graph("x input -\nn1 relu\n", "bad.graph")
    with pytest.raises(GraphFormatError, match=r"bad.graph:1: node 'n1' reads undefined input 'zz'"):
        parse_graph("n1 relu zz\n", "bad.graph")
    with pytest.raises(GraphFormatError, match="cycle"):
        parse_graph("a relu b\nb relu a\n", "bad.graph")
    with pytest.raises(GraphFormatError, match="defined twice"):
        parse_graph("a input -\na input -\n", "bad.graph")
    with pytest.raises(GraphFormatError, match="cannot read"):
        graph(tmp_path / "missing.graph")
