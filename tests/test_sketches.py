"""tensor_sketches and mined_patterns on the real digits MLP (real pixels, real activations)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from goblin_assets.opscope.miner import mine_patterns
from goblin_assets.opscope.record import SKETCH_COLUMNS, record_workload
from goblin_assets.opscope.sketches import SCALAR_STATS, STATS, scalar_sketch, sketch_layout, sketch_vector
from goblin_assets.opscope.taps import MatmulTap
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse.db import validate
from goblin_assets.warehouse.tables import TEXT, columns
from tests.conftest import WORKLOADS


def test_scalar_sketch_values():
    x = torch.tensor([[0.0, -2.0], [3.0, 0.0]])
    s = dict(zip(SCALAR_STATS, scalar_sketch(x).tolist()))
    assert s == {"min": -2.0, "max": 3.0, "mean": 0.25, "l1": 5.0, "sumsq": 13.0, "nnz": 2.0}


def test_tap_sees_forward_matmuls_only_and_reads_back_per_step():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 8)
    with MatmulTap(SCALAR_STATS) as tap:
        model(x).sum().backward()  # backward mm ops must not become sites
        tap.flush(0)
    sites = {r["site"] for r in tap.rows}
    assert sites == {"linear_0", "linear_1"}
    first = {(r["role"], r["stat"]): r for r in tap.rows if r["site"] == "linear_0"}
    assert first[("lhs", "nnz")]["M"] == 5
    assert first[("lhs", "nnz")]["K"] == 8 and first[("lhs", "nnz")]["N"] == 4
    assert first[("lhs", "max")]["value"] == pytest.approx(float(x.max()))
    assert first[("rhs", "sumsq")]["value"] == pytest.approx(float((model[0].weight.detach() ** 2).sum()), rel=1e-5)


@pytest.fixture(scope="module")
def digits_sketches(tmp_path_factory):
    import os

    os.environ["GOBLIN_HOME"] = str(tmp_path_factory.mktemp("sk_home"))
    return record_workload(load_workload(WORKLOADS / "digits_mlp"), LocalRunner(timeout_s=300), steps=2,
                           run_id="test-sketch")


def _density(df, site, role):
    g = df[(df.site == site) & (df.role == role)]
    nnz = g[g.stat == "nnz"].value.to_numpy()
    numel = g[g.stat == "nnz"].numel.to_numpy()
    return float((nnz / numel).mean())


def test_digits_sketch_rows_are_tidy_and_valid(digits_sketches):
    df = digits_sketches
    assert list(df.columns) == SKETCH_COLUMNS
    assert all(df[c].dtype == TEXT for c in ("run_id", "site", "role", "stat"))   # no per-cell work to validate
    validate("sketches", df)
    assert set(df.stat) == set(STATS)                                   # the full sketch set by default
    assert set(df.site) == {"linear_0", "linear_1", "linear_2"}
    assert set(df.role) == {"lhs", "rhs", "out"}
    assert sorted(df.step.unique()) == [0, 1]
    first = df[(df.site == "linear_0") & (df.role == "lhs")]
    assert set(first.M) == {64} and set(first.K) == {64} and set(first.N) == {256}


def test_digits_real_values(digits_sketches):
    df = digits_sketches
    assert _density(df, "linear_0", "lhs") < 0.7       # pixel density of the digits input
    assert _density(df, "linear_1", "lhs") < 0.6       # post-ReLU activations
    assert _density(df, "linear_0", "rhs") == 1.0      # dense weights
    px = df[(df.site == "linear_0") & (df.role == "lhs")]
    assert px[px.stat == "min"].value.min() >= 0 and px[px.stat == "max"].value.max() <= 1.0


def test_miner_findings_follow_the_measured_density(digits_sketches):
    """With the full sketch set every rule can run; on this MLP only density is exploitable.

    Two findings the full set used to add were wrong and are pinned here: the
    post-ReLU lhs of ``linear_1`` (density ~0.52) has ~0.57 of its values in
    the histogram bin of 0, but that spike is its zeros (sparsity, rule 1), not
    a few quantisation levels; and the outputs of ``linear_1``/``linear_2``
    have adjacent rows alike (adj/pos < 0.5) only because every row shares a
    per-channel offset: the rows are shuffled samples, adjacent pairs differ as
    much as rows half the batch apart (adj/far ~1), so there is no delta to
    compute.
    """
    pat = mine_patterns(digits_sketches)
    validate("patterns", pat)
    got = {(r.site, r.role, r.finding) for r in pat.itertuples()}
    for site in ("linear_0", "linear_1", "linear_2"):
        for role in ("lhs", "rhs", "out"):
            sparse = _density(digits_sketches, site, role) < 0.5
            assert ((site, role, "sparse_gemm") in got) == sparse
            assert ((site, role, "dense_not_observable") in got) == (not sparse)
            ev = json.loads(pat[(pat.site == site) & (pat.role == role)].iloc[0].evidence_json)
            assert "skipped" not in ev, ev                                # every rule had its statistic
            assert 0.7 < ev["adj_far_ratio"] < 1.3                          # rows in no particular order
    assert ("linear_0", "lhs", "sparse_gemm") in got   # the pixels (about 0.46 non-zero after augmentation)
    assert ("linear_0", "lhs", "drifting") in got      # a new batch every step
    hist = digits_sketches[(digits_sketches.site == "linear_1") & (digits_sketches.role == "lhs")
                           & (digits_sketches.stat == "hist")]
    assert hist.groupby("step").value.max().min() > 0.25                # the raw zero spike is there ...
    assert ("linear_1", "lhs", "quantize_lut") not in got              # ... and is not read as few levels


def _rows(x: torch.Tensor, site: str, steps: int = 2) -> pd.DataFrame:
    """Tidy rows of the full sketch set of ``x`` recorded ``steps`` times."""
    lay = sketch_layout(x.shape, STATS)
    one = pd.DataFrame({"run_id": "rules", "workload": "synthetic", "model": "none", "backend": "cpu", "dist": "synthetic",
                        "M": x.shape[0], "K": x.shape[-1], "N": 8, "numel": x.numel(), "site": site, "role": "out",
                        "stat": np.concatenate([np.full(len(i), s, dtype=object) for s, i in lay]),
                        "idx": np.concatenate([i for _, i in lay]), "value": sketch_vector(x, STATS).numpy()})
    return pd.concat([one.assign(step=s) for s in range(steps)], ignore_index=True)[columns("sketches")]


def test_delta_compute_needs_row_order_and_lut_ignores_zeros():
    g = torch.Generator().manual_seed(0)
    r, c = 512, 128
    offset = 3 * torch.randn(1, c, generator=g) + torch.randn(r, c, generator=g)        # shared offset, rows i.i.d.
    walk = torch.randn(1, c, generator=g) + 0.02 * torch.randn(r, c, generator=g).cumsum(0)  # coherent rows
    relu = torch.relu(torch.randn(r, c, generator=g) + 0.05)                         # density ~0.52, zero spike
    pat = mine_patterns(pd.concat([_rows(offset, "offset"), _rows(walk, "walk"), _rows(relu, "relu")]))
    ev = {r.site: json.loads(r.evidence_json) for r in pat.itertuples() if r.finding not in ("stationary", "drifting")}
    find = {r.site: r.finding for r in pat.itertuples() if r.finding not in ("stationary", "drifting")}
    assert ev["offset"]["adj_ratio"] < 0.5 and ev["offset"]["adj_far_ratio"] > 0.8
    assert find["offset"] != "delta_compute"
    assert find["walk"] == "delta_compute" and ev["walk"]["adj_far_ratio"] < 0.1
    raw_top = float(sketch_vector(relu, ("hist",)).max())
    assert raw_top > 0.4 and ev["relu"]["top_bin_share"] < 0.25 and find["relu"] != "quantize_lut"
