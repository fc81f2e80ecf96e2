"""The actuation plan measured end to end: the packaged workloads' real modules replaced by the exploited forms.

Fast by construction: digits_mlp at its own batch (a forward is ~0.1 ms), few pairs; MiniLM + LoRA at
batch 2 x 16 tokens for the numeric checks only (no timing).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from goblin_assets.opscope.miner import mine_patterns
from goblin_assets.opscope.plan import plan
from goblin_assets.opscope.plan_e2e import (
    E2E_TOLERANCE,
    e2e_verdict,
    exploited_module,
    linear_sites,
    measure_e2e,
    record_target,
    swapped,
    workload_target,
)
from goblin_assets.warehouse.db import validate


def _rel(y, ref):
    return float((y - ref).norm() / ref.norm().clamp_min(1e-12))


@pytest.fixture(scope="module")
def digits():
    target = workload_target("digits_mlp", steps=2)
    sk = record_target(target, run_id="digits-e2e")
    pl, _ = measure_e2e(plan(mine_patterns(sk), sk, repeats=3), target, sk, pairs=3)
    return target, sk, pl


def test_every_kept_candidate_has_end_to_end_numbers(digits):
    target, _, pl = digits
    validate("plan", pl)
    kept = pl[pl.provenance == "measured"]
    assert {"zero_skipping_sparse_gemm", "prepack"} <= set(kept.exploit)
    for r in kept.itertuples():
        ev = json.loads(r.evidence_json)
        assert ev["op_speedup"] == pytest.approx(r.measured_speedup)
        assert ev["op_interval"]["low"] <= ev["op_interval"]["high"]
        e = ev["e2e"]
        f = e["forward"]
        assert f["pairs"] == 3 and f["paired"] and f["low"] <= f["point"] <= f["high"]
        assert f["baseline_median_s"] > 0 and f["exploited_median_s"] > 0
        assert f["verdict"] in ("faster end to end", "slower end to end", "no significant change end to end")
        assert (f["verdict"] == "no significant change end to end") == (f["low"] <= 1.0 <= f["high"])
        assert e["module"] == linear_sites(target)[r.site] and e["within_tolerance"]
        if r.exploit == "zero_skipping_sparse_gemm":      # activation sparsity feeds backward: timed on a step
            assert e["train_step"]["pairs"] == 3 and "train_step_not_applicable" not in e
        else:                                             # prepack of a weight that trains: inference only
            assert "train_step" not in e and e["train_step_not_applicable"].startswith("inference only")
        assert ev["e2e_combined"]["n_modules"] >= 2       # every exploit also applied at all its sites at once


def test_sites_resolve_to_the_linears_matmul_tap_named(digits):
    target, sk, _ = digits
    sites = linear_sites(target)
    assert {s for s in sk.site.unique() if "#" not in s} <= set(sites)
    assert [sites[f"linear_{i}"] for i in range(3)] == ["0", "2", "4"]   # build_model's Sequential indices
    k = sk[(sk.site == "linear_1") & (sk.role == "lhs")]
    assert (int(k.M.iat[0]), int(k.K.iat[0]), int(k.N.iat[0])) == (64, 256, 256)


def _forms(lin):
    """Every exploited form, with the finding evidence it needs."""
    dead = [int(i) for i in range(lin.in_features) if i % 3 == 0]
    return [("zero_skipping_sparse_gemm", "lhs", "csr_incl_conversion", {}, None),
            ("zero_skipping_sparse_gemm", "lhs", "dead_channel_compaction", {}, dead),
            ("zero_skipping_sparse_gemm", "rhs", "csr_weight", {}, None),
            ("int8_gemm_per_channel", "lhs", "int8_int_mm_dynamic", {}, None),
            ("int8_gemm_lut", "lhs", "int8_dynamic_quantized_linear", {}, None),
            ("prepack", "rhs", "onednn_prepacked_linear", {}, None),
            ("prepack", "rhs", "pretransposed_addmm", {}, None),
            ("factored_matmul", "rhs", None, {"rank": {"rank_10pct": 8}}, None)]


def test_exploited_forward_is_within_each_exploits_tolerance():
    """Independent check: logits of the whole model, exploited vs original, on real digits."""
    target = workload_target("digits_mlp", steps=1)
    m, (x, _) = target.model, target.batches[0]
    lin = m[2]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():   # rank-8 weight (so the factored form is exact to fp32) and 1/3 of its inputs dead
        lin.weight.copy_(torch.randn(256, 8, generator=g) @ torch.randn(8, 256, generator=g) / 16)
        m[0].weight[torch.arange(0, 256, 3)] = 0.0
        m[0].bias[torch.arange(0, 256, 3)] = -1.0
        ref = m(x)
    for exploit, role, form, ev, dead in _forms(lin):
        mod, _ = exploited_module(lin, exploit, role, form, ev, dead)
        with torch.no_grad(), swapped(m, {"2": mod}):
            assert m[2] is mod
            y = m(x)
        assert m[2] is lin
        err = _rel(y, ref)
        assert err <= E2E_TOLERANCE[exploit], (exploit, form, err)
        if exploit.startswith("int8"):
            assert err > 0          # really quantised, not the fp32 path


def test_sparse_activation_step_gives_the_same_gradients():
    target = workload_target("digits_mlp", steps=1)
    m = target.model
    target.step()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    mod, no_train = exploited_module(m[2], "zero_skipping_sparse_gemm", "lhs", "csr_incl_conversion", {})
    assert no_train is None
    with swapped(m, {"2": mod}):
        target.step()
    for n, p in m.named_parameters():
        assert _rel(p.grad, ref[n]) < 1e-5, n


def test_minilm_lora_exploits_on_real_modules():
    target = workload_target("minilm_lora_cls", batch=2, seq_len=16, steps=1)
    sites = linear_sites(target)
    q = sites["linear_0"]
    assert q.endswith("layer.0.attention.self.query.base_layer")   # LoRA's frozen base weight
    lin = target.model.get_submodule(q)
    ref = target.forward()
    for exploit, role, form in (("prepack", "rhs", "pretransposed_addmm"), ("prepack", "rhs", "onednn_prepacked_linear"),
                                ("int8_gemm_per_channel", "lhs", "int8_dynamic_quantized_linear")):
        mod, no_train = exploited_module(lin, exploit, role, form, {})
        with swapped(target.model, {q: mod}):
            y = target.forward()
        assert _rel(y, ref) <= E2E_TOLERANCE[exploit]
        assert (no_train is None) == (exploit == "prepack")   # frozen base: prepack trains; int8 does not
    # the frozen base prepacked: the LoRA gradients of a training step are unchanged
    target.step()
    lora = {n: p.grad.clone() for n, p in target.model.named_parameters() if p.requires_grad}
    v1 = sites["linear_10"]                      # layer 1: its input requires grad (LoRA of layer 0 upstream)
    assert v1.endswith("layer.1.attention.self.query.base_layer")
    for form in ("pretransposed_addmm", "onednn_prepacked_linear"):
        reps = {q: exploited_module(lin, "prepack", "rhs", form, {})[0],
                v1: exploited_module(target.model.get_submodule(v1), "prepack", "rhs", form, {})[0]}
        with swapped(target.model, reps):
            target.step()
        for n, p in target.model.named_parameters():
            if p.requires_grad:
                assert _rel(p.grad, lora[n]) < 1e-4, (form, n)


def test_interval_marks_no_significant_change_on_a_synthetic_case():
    from scipy.stats import t

    from goblin_assets.measure.benchmark import CONFIDENCE_LEVEL, per_look_level

    base = [1.00, 1.02, 0.98, 1.01, 0.99, 1.00]
    same = [0.97, 1.04, 1.00, 0.99, 1.01, 0.98]       # ratios straddle 1.0
    r = e2e_verdict(base, same)
    logs = np.log(np.array(base) / np.array(same))    # throughput ratio = baseline time / exploited time
    level = per_look_level(CONFIDENCE_LEVEL, 1)        # each of the audit's planned looks: 98.3 % (benchmark.py)
    half = t.ppf(0.5 + level / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    assert r["point"] == pytest.approx(math.exp(logs.mean()))
    assert (r["low"], r["high"]) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert r["low"] < 1.0 < r["high"] and r["verdict"] == "no significant change end to end"
    assert r["headline"].startswith("no significant change")
    faster = [b / 1.3 * (1 + 0.01 * (-1) ** i) for i, b in enumerate(base)]
    assert e2e_verdict(base, faster)["verdict"] == "faster end to end"
    assert e2e_verdict(base, [b * 1.3 for b in base[:3]] + [b * 1.31 for b in base[3:]])["verdict"] == \
        "slower end to end"
    assert e2e_verdict([1.0], [0.5])["verdict"] == "no interval"


def test_plan_driver_times_packaged_workloads_end_to_end(digits, tmp_path, monkeypatch):
    import functools

    from goblin_assets.opscope import mining, plan_e2e
    from goblin_assets.opscope import plan as planmod
    from goblin_assets.warehouse.db import query, write

    # the driver imports these when it runs: fewer timed blocks keep the test fast
    monkeypatch.setattr(planmod, "plan", functools.partial(planmod.plan, repeats=2))
    monkeypatch.setattr(plan_e2e, "measure_e2e", functools.partial(plan_e2e.measure_e2e, pairs=2, combined=False))

    _, sk, _ = digits
    other = sk.assign(run_id="other-run", workload="synthetic")
    db = tmp_path / "wh.duckdb"
    write({"sketches": pd.concat([sk, other], ignore_index=True)}, db)
    res = mining.plan(lambda sql, params=None: query(sql, db, params=params), ["digits-e2e", "other-run"], e2e=True)
    pl = res.frames["plan"]
    validate("plan", pl)
    ev = {(r.run_id, r.site, r.role, r.exploit): json.loads(r.evidence_json) for r in pl.itertuples()}
    mine_ = [e for (run, *_), e in ev.items() if run == "digits-e2e" and "e2e" in e]
    assert len(mine_) == int(((pl.run_id == "digits-e2e") & (pl.provenance == "measured")).sum()) > 0
    assert all(e["e2e"]["forward"]["verdict"].endswith("end to end") for e in mine_)
    assert all("no end-to-end model for workload 'synthetic'" in e["e2e_not_measured"]
               for (run, *_), e in ev.items() if run == "other-run")
    pat = res.findings[res.findings.run_id == "digits-e2e"]
    assert all("e2e" in json.loads(e) for e in pat.evidence_json if json.loads(e)["provenance"] == "measured")
