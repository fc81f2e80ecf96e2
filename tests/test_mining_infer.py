"""Inference dynamics on MiniLM with real text (softmax taps) and on a small MoE (top-k taps)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from goblin_assets.opscope.infer import infer_dynamics, load_minilm, minilm_batches, record_minilm_attention
from goblin_assets.opscope.inject import Recorder, inject_infer_stats
from goblin_assets.warehouse.db import validate
from goblin_assets.warehouse.tables import columns
from tests.test_mining_flow import TinyMoE, digits_tokens


@pytest.fixture(scope="module")
def minilm_probs():
    return record_minilm_attention(run_id="t-infer")


def test_minilm_attention_numbers_match_a_direct_forward(minilm_probs):
    validate("sketches", minilm_probs)
    pat = infer_dynamics(minilm_probs)
    validate("patterns", pat)
    model, _ = load_minilm("eager")
    peaks, masses = [], []
    with torch.no_grad():
        for enc in minilm_batches():                  # the same real-text batches, no padding
            att = model(**enc, output_attentions=True).attentions
            peaks.append([a.amax(-1).mean((0, 1)).numpy() for a in att])      # per query, mean over batch and heads
            masses.append([a.sum(-2).mean((0, 1)).numpy() for a in att])      # per key
    main = pat[pat.finding.isin(["sparse_attention", "dense_attention"])]
    assert len(main) == 6
    for layer in range(6):
        site = f"encoder.layer.{layer}.attention.self:softmax_0"
        ev = json.loads(main[main.site == site].evidence_json.iloc[0])
        peak = np.mean([p[layer] for p in peaks], axis=0)
        mass = np.mean([m[layer] for m in masses], axis=0)
        assert ev["concentrated_query_share"] == pytest.approx(float((peak > 0.3).mean()))
        assert ev["first_token_share"] == pytest.approx(float(mass[0] / mass.sum()), rel=1e-5)
        assert ev["keys"] == 32 and ev["queries"] == 32
    # BERT-family models park attention on [CLS] (Clark et al. 2019): most layers have a first-token sink
    sinks = pat[pat.finding == "attention_sink"]
    assert len(sinks) >= 4
    assert all(json.loads(e)["first_token_share"] >= 5 / 32 for e in sinks.evidence_json)


def test_moe_cold_and_hot_experts_follow_the_real_routing():
    # A router biased toward experts 0-1 and against 6-7: the imbalance Switch Transformer's
    # load-balancing loss exists to fight.  The findings must follow the routing actually computed.
    torch.manual_seed(0)
    m = TinyMoE(router_bias=[1.0, 0.5, 0, 0, 0, 0, -2, -2.5]).eval()
    x = digits_tokens(512)
    inj = inject_infer_stats(m, (x,))
    rec = Recorder(inj)
    rec(x)
    df = rec.flush().assign(run_id="t-moe", workload="tiny_moe", model="tiny_moe", backend="cpu", dist="digits")
    df = df[columns("sketches")]
    validate("sketches", df)
    pat = infer_dynamics(df)
    validate("patterns", pat)
    assert not pat.finding.isin(["sparse_attention", "dense_attention"]).any()   # the router softmax is not attention
    inputs = []
    hooks = [b.register_forward_pre_hook(lambda mod, a: inputs.append(a[0])) for b in m.blocks]
    with torch.no_grad():
        m(x)
    for h in hooks:
        h.remove()
    for bi, (block, xin) in enumerate(zip(m.blocks, inputs)):
        idx = torch.topk(block.gate(xin).softmax(-1), 2, dim=-1).indices
        share = torch.bincount(idx.reshape(-1), minlength=8).double() / idx.numel()
        got = pat[pat.site.str.startswith(f"blocks.{bi}:topk")]
        cold = {int(s.rsplit("expert", 1)[1]) for s in got[got.finding == "cold_expert"].site}
        hot = {int(s.rsplit("expert", 1)[1]) for s in got[got.finding == "hot_expert"].site}
        assert cold == {e for e in range(8) if share[e] < 0.02}
        assert hot == {e for e in range(8) if share[e] > 2 / 8}
        assert cold and hot and {6, 7} <= cold and 0 in hot


def test_missing_stats_are_reported_not_observable():
    df = pd.DataFrame([{"run_id": "r", "workload": "w", "model": "m", "step": 0, "backend": "cpu", "dist": "d",
                        "M": 4, "K": 4, "N": 0, "numel": 16, "site": "attn:softmax_0", "role": "probs",
                        "stat": "something_else", "idx": 0, "value": 1.0}])
    pat = infer_dynamics(df)
    assert set(pat.finding) == {"not_observable"}
    assert any("peak_prob" in json.loads(e)["skipped"] for e in pat.evidence_json)
