"""tensor_sketches and mined_patterns on the real digits MLP (real pixels, real activations)."""
from __future__ import annotations

import pytest
import torch

from goblin_assets.opscope.miner import mine_patterns
from goblin_assets.opscope.record import SKETCH_COLUMNS, record_workload
from goblin_assets.opscope.sketches import SCALAR_STATS, scalar_sketch
from goblin_assets.opscope.taps import MatmulTap
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse.db import validate
from tests.conftest import WORKLOADS


def test_scalar_sketch_values():
    x = torch.tensor([[0.0, -2.0], [3.0, 0.0]])
    s = dict(zip(SCALAR_STATS, scalar_sketch(x).tolist()))
    assert s == {"min": -2.0, "max": 3.0, "mean": 0.25, "l1": 5.0, "sumsq": 13.0, "nnz": 2.0}


def test_tap_sees_forward_matmuls_only_and_reads_back_per_step():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 8)
    with MatmulTap() as tap:
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
    validate("sketches", df)
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
    pat = mine_patterns(digits_sketches)
    validate("patterns", pat)
    got = {(r.site, r.role, r.finding) for r in pat.itertuples()}
    for site in ("linear_0", "linear_1", "linear_2"):
        for role in ("lhs", "rhs", "out"):
            sparse = _density(digits_sketches, site, role) < 0.5
            assert ((site, role, "sparse_gemm") in got) == sparse
            assert ((site, role, "dense_not_observable") in got) == (not sparse)
    assert ("linear_0", "lhs", "sparse_gemm") in got   # the pixels (about 0.46 non-zero after augmentation)
    assert ("linear_0", "lhs", "drifting") in got      # a new batch every step
