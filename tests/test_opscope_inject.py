"""Graph-rewrite taps: sites, the correctness gate, the pytree out-spec pin, fx fallback, recording per step."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import goblin_assets.opscope.inject as inject_mod
from goblin_assets.opscope.inject import (
    InjectionError, Recorder, SiteFilter, inject_infer_stats, inject_matmul_stats,
)
from goblin_assets.opscope.sketches import probs_vector, sketch_vector


#: Many small reductions: on 2 shared cores, 2 intra-op threads make them ~7x slower (measured).
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


class Toy(nn.Module):
    """Every matmul form: Linear, @, softmax, mm with a parameter, bmm, addmm, baddbmm; dict output."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        h = torch.relu(self.l1(x))                                    # (2, 5, 16)
        a = torch.softmax(h @ h.transpose(-1, -2), dim=-1)            # (2, 5, 5)
        h = torch.bmm(a, h)
        flat = torch.mm(h.reshape(-1, 16), self.w)
        flat = torch.addmm(self.b, flat, self.w)
        h = torch.baddbmm(h, flat.reshape(2, 5, 16), self.w.expand(2, 16, 16))
        return {"out": self.l2(h), "h": h}


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    return Toy().eval(), torch.randn(2, 5, 8)


@pytest.fixture(scope="module")
def injected(toy):
    model, x = toy
    return inject_matmul_stats(model, (x,), infer=True, row_sample=None)


def test_every_site_is_tapped_and_the_gate_passes(injected):
    ops = injected.ops()
    assert injected.frontend == "export"
    assert sorted(ops.values()) == sorted(["linear", "linear", "matmul", "softmax", "bmm", "mm", "addmm", "baddbmm"])
    assert {"l1", "l2"} <= set(ops)
    assert injected.gate.passed and injected.gate.outputs_compared == 2 and injected.gate.max_abs_diff == 0.0
    # weights read from parameters are sketched once per step, outside the graph
    assert set(injected.weight_names) >= {"l1.weight", "l2.weight", "w"}


def test_model_output_structure_is_kept_and_values_match_eager_sketches(toy, injected):
    model, x = toy
    out, packed = injected(x)
    ref = model(x)
    assert set(out) == {"out", "h"}
    torch.testing.assert_close(out["out"], ref["out"], rtol=0, atol=0)
    assert packed.dtype == torch.float64 and packed.numel() == injected.packed_length
    rec = Recorder(injected)
    rec(x)
    rows = rec.flush()
    got = rows[(rows.site == "l1") & (rows.role == "lhs")]["value"].to_numpy()
    np.testing.assert_allclose(got, sketch_vector(x, row_sample=None).numpy())
    got_w = rows[(rows.site == "l1") & (rows.role == "rhs")]["value"].to_numpy()
    np.testing.assert_allclose(got_w, sketch_vector(model.l1.weight, row_sample=None).numpy())
    h = torch.relu(model.l1(x))
    probs = rows[rows.role == "probs"]
    np.testing.assert_allclose(probs["value"].to_numpy(),
                               probs_vector(torch.softmax(h @ h.transpose(-1, -2), -1)).numpy(), rtol=1e-6)
    lhs = rows[(rows.site == "l1") & (rows.role == "lhs")].iloc[0]
    assert (lhs.M, lhs.K, lhs.N, lhs.numel) == (10, 8, 16, 80)


def test_weights_once_per_step_and_one_readback_per_step(toy, injected):
    _, x = toy
    rec = Recorder(injected)
    calls = {"n": 0}
    real = injected.weight_vector

    def counting():
        calls["n"] += 1
        return real()

    injected.weight_vector = counting
    try:
        for _ in range(2):
            rec(x)
            rec(x)          # two forwards in one step (e.g. gradient accumulation)
            rows = rec.flush()
    finally:
        del injected.weight_vector
    assert calls["n"] == 2 and rec.readbacks == 2
    rhs_sites = set(rows[rows.role == "rhs"].site)
    assert "l1" in rhs_sites and "l1#1" not in rhs_sites                  # weights: once per step
    assert {"l1", "l1#1"} <= set(rows[rows.role == "lhs"].site)           # activations: per forward
    assert set(rows.step) == {1}


def test_weight_sketches_recomputed_only_when_a_weight_changes():
    torch.manual_seed(3)
    model, x = Toy().eval(), torch.randn(2, 5, 8)
    inj = inject_matmul_stats(model, (x,))
    first = inj.weight_vector()
    assert inj.weight_vector() is first                       # frozen: computed once
    with torch.no_grad():
        model.l1.weight.mul_(2.0)                             # an in-place update, as optimizer.step() does
    second = inj.weight_vector()
    assert second is not first and not torch.equal(second, first)


def test_sampled_recorder_records_every_kth_step(toy, injected):
    _, x = toy
    rec = Recorder(injected, every=3)
    sizes = []
    for _ in range(6):
        out = rec(x)
        assert set(out) == {"out", "h"}
        sizes.append(len(rec.flush()))
    assert [s > 0 for s in sizes] == [True, False, False, True, False, False]
    assert rec.readbacks == 2


def test_gate_fails_loudly_on_a_broken_injection(monkeypatch):
    torch.manual_seed(0)
    model, x = Toy().eval(), torch.randn(2, 5, 8)

    def mutating(t, stats, row_sample, out=None):  # a sketch that writes into the tensor it reads
        if t.is_contiguous():
            t.detach().mul_(2.0)
        return out.fill_(0.0)

    monkeypatch.setattr(inject_mod, "sketch_vector", mutating)
    with pytest.raises(InjectionError, match="correctness gate failed: injected output 0 differs"):
        inject_matmul_stats(model, (x,))

    def crashing(t, stats, row_sample, out=None):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(inject_mod, "sketch_vector", crashing)
    with pytest.raises(InjectionError, match="the injected graph failed to run: RuntimeError: kernel exploded"):
        inject_matmul_stats(model, (x,))


def test_pytree_out_spec_pin(toy):
    """Private API: an exported module re-packs outputs with graph._codegen.pytree_info.out_spec.

    Clearing out_spec is what lets the extra output through; if this test
    fails after a torch upgrade, inject._inject must find another way.
    """
    model, x = toy
    gm = torch.export.export(model, (x,)).module()
    info = gm.graph._codegen.pytree_info
    assert info.out_spec is not None and info.out_spec.num_leaves == 2
    assert isinstance(gm(x), dict)
    gm.graph._codegen.pytree_info = info._replace(out_spec=None)
    gm.recompile()
    flat = gm(x)
    assert isinstance(flat, tuple) and len(flat) == 2
    inj = inject_matmul_stats(model, (x,))
    raw = inj.module(x)
    assert isinstance(raw, tuple) and len(raw) == 3 and raw[-1].numel() == inj.packed_length
    torch.testing.assert_close(raw[0], model(x)["out"])


def test_fx_fallback_when_export_fails(toy, monkeypatch):
    model, x = toy

    def broken(*a, **k):
        raise RuntimeError("export unavailable")

    monkeypatch.setattr(torch.export, "export", broken)
    inj = inject_matmul_stats(model, (x,), infer=True)
    assert inj.frontend == "fx" and inj.gate.passed
    assert "torch.export failed (RuntimeError: export unavailable)" in inj.notes[0]
    assert sorted(inj.ops().values()) == sorted(["linear", "linear", "matmul", "softmax", "bmm", "mm", "addmm",
                                                 "baddbmm"])
    out, packed = inj(x)
    torch.testing.assert_close(out["out"], model(x)["out"])


def test_graph_module_input_and_site_filter(toy):
    model, x = toy
    gm = torch.fx.symbolic_trace(model)
    inj = inject_matmul_stats(gm, (x,), site_filter=SiteFilter(include=r"^l[12]$"))
    assert inj.frontend == "fx" and set(inj.sites) == {"l1", "l2"}
    big = inject_matmul_stats(model, (x,), site_filter=SiteFilter(min_numel=161))   # only (.., 16) x (16, 16) sites
    assert "l1" not in big.sites and "l2" not in big.sites and big.sites
    with pytest.raises(InjectionError, match="no site to tap"):
        inject_matmul_stats(model, (x,), site_filter=SiteFilter(include="nothing-matches"))


class SdpaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(2, 6, 3, 16).unbind(2)
        return F.scaled_dot_product_attention(q, k, v)


def test_sdpa_has_no_softmax_node_and_says_so():
    x = torch.randn(2, 6, 16)
    m = SdpaBlock().eval()
    with pytest.raises(InjectionError, match="scaled_dot_product_attention"):
        inject_infer_stats(m, (x,))
    inj = inject_matmul_stats(m, (x,), infer=True)
    assert inj.sites == ["qkv"] and "attn_implementation='eager'" in inj.notes[-1]


class TinyMoE(nn.Module):
    """Top-2 routing over 4 experts (the router's decision is what is tapped)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.Linear(8, 8)

    def forward(self, x):
        w, idx = torch.topk(self.router(x).softmax(-1), k=2, dim=-1)
        return self.experts(x) * w.sum(-1, keepdim=True), idx


def test_topk_routing_expert_load():
    torch.manual_seed(1)
    m = TinyMoE().eval()
    x = torch.randn(32, 8)
    inj = inject_infer_stats(m, (x,))
    rec = Recorder(inj)
    (_, idx) = rec(x)
    rows = rec.flush()
    load = rows[rows.role == "route"].sort_values("idx")
    assert load.stat.unique().tolist() == ["expert_load"] and load.value.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(load.value.to_numpy(), torch.bincount(idx.reshape(-1), minlength=4).numpy() / 64)
    assert (load.M.iat[0], load.K.iat[0], load.N.iat[0]) == (32, 2, 4)


def test_one_forward_flush_is_the_general_path_frame_and_unrecorded_steps_are_empty(toy, injected):
    """The laid-out-once fast path of flush gives the same frame as the general path (same columns, dtypes, order)."""
    _, x = toy
    rec = Recorder(injected, every=2)
    rec(x)
    fast = rec.flush()
    rec.step = 0                                   # record again, through the general path this time
    rec(x)
    length = injected.weight_length
    injected.weight_length = -1                    # disables the fast path for this flush
    try:
        slow = rec.flush()
    finally:
        injected.weight_length = length
    pd.testing.assert_frame_equal(fast, slow)
    fast.loc[:, "idx"] = -7                        # a caller editing its frame never edits the next step's
    rec.step = 2
    rec._one = inject_mod._one_call_columns(*rec._templates, injected.weight_length)
    rec(x)
    again = rec.flush()
    assert (again["idx"].to_numpy() == slow["idx"].to_numpy()).all()
    rec(x)                                         # step 3: not recorded
    empty = rec.flush()
    assert len(empty) == 0 and list(empty.columns) == list(slow.columns) and rec.readbacks == 3


def test_recorder_memory_is_fixed_by_the_layout(toy, injected):
    _, x = toy
    rec = Recorder(injected)
    rec(x)
    rows = rec.flush()
    m = rec.memory()
    assert m["packed_per_forward"] == 8 * injected.packed_length
    assert m["weights"] == 8 * injected.weight_length
    assert m["per_step"] == m["packed_per_forward"] + m["weights"]
    assert m["rows_per_step"] == len(rows)
    assert m["scratch"] >= 0 and m["templates"] > 0
