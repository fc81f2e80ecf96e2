"""Actuation plan: guards and their stability from real digits sketches, speedups from real A/B timings."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from goblin_assets.opscope.miner import mine_patterns
from goblin_assets.opscope.plan import ab_int8, plan, plan_findings, time_call
from goblin_assets.warehouse.db import validate
from tests.test_mining_miner import record_digits, rows_of

REPEATS = 5


@pytest.fixture(scope="module")
def digits_plan():
    df, _, _ = record_digits(run_id="digits-plan")
    return df, plan(mine_patterns(df), df, repeats=REPEATS)


def test_sparse_sites_get_a_stable_density_guard_and_measured_timings(digits_plan):
    df, pl = digits_plan
    validate("plan", pl)
    sp = pl[pl.exploit == "zero_skipping_sparse_gemm"]
    assert set(zip(sp.site, sp.role)) >= {("linear_1", "lhs")}
    for r in sp.itertuples():
        g = df[(df.site == r.site) & (df.role == r.role) & (df.stat == "nnz")]
        dens = (g.value / g.numel).to_numpy()
        assert r.guard == "density < 0.5"
        assert r.guard_mean == pytest.approx(dens.mean()) and r.guard_sigma == pytest.approx(dens.std())
        assert r.guard_stable == (dens.std() < 0.02)
        assert r.est_speedup == pytest.approx(1 / dens.mean())
        # measured, not modelled: real medians of repeated timings at the site's shape
        assert r.provenance == "measured" and r.repeats == REPEATS
        assert r.dense_median_s > 0 and r.special_median_s > 0
        assert r.measured_speedup == pytest.approx(r.dense_median_s / r.special_median_s)
        assert (r.M, r.K, r.N) == (64, 256, 256 if r.site == "linear_1" else 10)
        ev = json.loads(r.evidence_json)
        assert ev["forms"]["csr_incl_conversion"]["repeats"] == REPEATS


def test_stationary_weights_become_measured_prepack_items(digits_plan):
    _, pl = digits_plan
    pp = pl[pl.exploit == "prepack"]
    assert set(pp.site) == {"linear_0", "linear_1", "linear_2"} and set(pp.role) == {"rhs"}
    assert (pp.guard_sigma == 0).all() and pp.guard_stable.all()
    assert (pp.measured_speedup > 0).all() and (pp.repeats == REPEATS).all()
    forms = json.loads(pp.evidence_json.iloc[0])["forms"]
    assert set(forms) == {"onednn_prepacked_linear", "pretransposed_addmm"}
    pat = plan_findings(pl)
    validate("patterns", pat)
    assert set(pat[pat.site == "linear_0"].finding) == {"prepack"}


def test_prepack_guard_fails_when_weights_train():
    df, _, _ = record_digits(optimizer="sgd", run_id="digits-sgd-plan")
    pl = plan(mine_patterns(df), df, measure=False)
    pp = pl[(pl.exploit == "prepack") & (pl.site == "linear_1")]
    assert len(pp) == 1
    stable = pp.guard_stable.iloc[0]
    assert stable is not None and not stable       # l1 CV < 1e-4, yet the weights change every step


def test_outlier_channels_get_a_measured_int8_gemm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 384, generator=g)
    x[:, :4] *= 20.0
    df = pd.concat([rows_of(x, "ffn_in", steps=3)], ignore_index=True)
    pat = mine_patterns(df)
    assert "int_quant" in set(pat.finding)
    pl = plan(pat, df, repeats=REPEATS)
    r = pl[pl.exploit == "int8_gemm_per_channel"].iloc[0]
    assert r.provenance == "measured" and r.measured_speedup > 0 and r.repeats == REPEATS
    assert r.guard.startswith("absmax <= ") and r.est_speedup == 4.0
    ev = json.loads(r.evidence_json)
    assert ev["int8_rel_err"] < 0.05
    assert set(ev["forms"]) == {"int8_int_mm_dynamic", "int8_dynamic_quantized_linear"}
    assert all(f["median_s"] > 0 and f["repeats"] == REPEATS for f in ev["forms"].values())


def test_int8_ab_is_numerically_close_and_estimates_only_mode():
    res = ab_int8(64, 128, 96, repeats=3)
    assert all(f["rel_err"] < 0.02 for f in res["forms"].values())
    assert res["dense"].median_s > 0 and len(res["special"].times_s) == 3
    t = time_call(lambda: torch.mm(torch.ones(8, 8), torch.ones(8, 8)), repeats=4)
    assert len(t.times_s) == 4 and t.median_s == pytest.approx(float(np.median(t.times_s)))
    df, _, _ = record_digits(steps=2, run_id="digits-est")
    pl = plan(mine_patterns(df), df, measure=False)
    assert (pl.provenance == "estimated").all() and pl.measured_speedup.isna().all()
