"""Host probes on the packaged MiniLM's real weights and activations, checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from goblin_assets.opscope.probe import (
    ProbeError, cardinality, effective_rank, load_tensor, minilm_tensors, probe_file, probe_findings, probe_frame,
    probe_tensor, quant_error, save_tensor, two_four,
)
from goblin_assets.warehouse.db import validate

Q = "encoder.layer.0.attention.self.query.weight"
ACT = "encoder.layer.0.intermediate.dense.input"      # LayerNorm output entering the FFN (real text)


@pytest.fixture(scope="module")
def tensors():
    return minilm_tensors(layers=(0,), max_length=48)


def test_two_four_matches_numpy_and_recognises_pruned(tensors):
    w = tensors[Q].numpy().astype(np.float64)
    g = w.reshape(-1, 4)
    keep = np.argsort(-np.abs(g), axis=1)[:, :2]
    pruned = np.zeros_like(g)
    np.put_along_axis(pruned, keep, np.take_along_axis(g, keep, 1), 1)
    want = np.linalg.norm(g - pruned) / np.linalg.norm(g)
    r = two_four(tensors[Q])
    assert r["rel_err"] == pytest.approx(want, rel=1e-9)
    assert not r["is_2_4"] and not r["feasible"] and 0.2 < r["rel_err"] < 0.5   # a dense trained weight
    already = two_four(torch.tensor(pruned.reshape(w.shape)))
    assert already["is_2_4"] and already["rel_err"] == 0.0 and already["feasible"]


def test_rank_probes_match_numpy(tensors):
    w = tensors[Q].double().numpy()
    s = np.linalg.svd(w, compute_uv=False)
    r = effective_rank(tensors[Q])
    assert r["stable_rank"] == pytest.approx((s**2).sum() / s[0] ** 2, rel=1e-9)
    p = s / s.sum()
    assert r["erank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    # MiniLM's query weight: stable rank under 0.1 * cols, yet far from low rank: keeping 90% of it
    # needs so many singular vectors that a factored matmul costs more than the dense one
    tail = np.sqrt(np.maximum((s**2).sum() - np.cumsum(s**2), 0) / (s**2).sum())
    assert r["rank_10pct"] == int(np.argmax(tail < 0.1)) + 1
    assert r["stable_rank"] < 0.1 * 384 and r["erank"] > 200 and r["factored_cost"] > 1 and not r["low_rank"]
    truly = torch.tensor(w[:, :12] @ w[:12, :])                        # rank 12 built from the real weight
    rt = effective_rank(truly)
    assert rt["low_rank"] and rt["rank_10pct"] <= 12 and rt["factored_cost"] < 0.1


def test_quantisation_error_on_real_weights_and_activations(tensors):
    w, a = tensors[Q], tensors[ACT]
    xw = w.double().numpy()
    scale = np.abs(xw).max(axis=1, keepdims=True) / 127
    want = np.linalg.norm(xw - np.clip(np.round(xw / scale), -127, 127) * scale) / np.linalg.norm(xw)
    assert quant_error(w, 8, per_channel=True, channel_axis=0) == pytest.approx(want, rel=1e-9)
    pw = probe_tensor(w)["quant"]
    assert pw["min_bits_channel"] == 8 and pw["err_channel_8b"] < 0.02
    for b in (3, 4, 6, 8):
        assert pw[f"err_channel_{b}b"] <= pw[f"err_tensor_{b}b"]
    pa = probe_tensor(a, channel_axis=-1)["quant"]
    # BERT-family LayerNorm outputs carry outlier features: per-tensor int8 loses several times per-channel's error
    assert pa["err_tensor_8b"] > 3 * pa["err_channel_8b"]
    assert pa["min_bits_tensor"] is None and pa["min_bits_channel"] == 8


def test_cardinality_of_a_real_weight_quantised_to_4_bits(tensors):
    w = tensors[Q]
    assert not cardinality(w)["lut"] and cardinality(w)["distinct"] > 32
    scale = w.abs().max() / 7
    q4 = torch.clamp(torch.round(w / scale), -7, 7) * scale
    c = cardinality(q4)
    assert c["lut"] and c["distinct"] == c["distinct_exact"] <= 15


def test_save_load_probe_file_and_findings(tensors, tmp_path):
    p = save_tensor(tmp_path / "dump.safetensors", {Q: tensors[Q], ACT: tensors[ACT]}, {"model": "minilm"})
    back = load_tensor(p, Q)
    assert torch.equal(back, tensors[Q])
    res = probe_file(p)
    assert set(res) == {Q, ACT}
    pat = probe_findings(res, run_id="t-probe", workload="minilm")
    validate("patterns", pat)
    assert set(pat[pat.site == Q].finding) == {"int_quant"}
    assert pat[pat.site == Q].role.iloc[0] == "rhs" and pat[pat.site == ACT].role.iloc[0] == "lhs"
    validate("probes", probe_frame(res, "t-probe"))
    with pytest.raises(ProbeError, match="no tensor 'nope'"):
        load_tensor(p, "nope")
    with pytest.raises(ProbeError, match="cannot read"):
        load_tensor(tmp_path / "missing.safetensors")
