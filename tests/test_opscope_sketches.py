"""The sketch set: definitions on small known tensors, layouts, sampling error bounds, inference sketches."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from goblin_assets.opscope.drivers import DISTRIBUTIONS, draw
from goblin_assets.opscope.sketches import (
    HIST_BINS, SCALAR_STATS, SHAPE_SAMPLE, STATS, SketchError, probs_layout, probs_vector, route_vector,
    scalar_sketch, shape_sample, sketch_layout, sketch_length, sketch_vector,
)


#: Many small reductions: on 2 shared cores, 2 intra-op threads make them ~7x slower (measured).
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def stats_of(x: torch.Tensor, row_sample=None, stats=STATS) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """stat -> (idx, values) through the public layout."""
    v = sketch_vector(x, stats, row_sample).numpy()
    out, pos = {}, 0
    for s, idx in sketch_layout(x.shape, stats, row_sample):
        out[s] = (idx, v[pos:pos + len(idx)])
        pos += len(idx)
    assert pos == len(v) == sketch_length(x.shape, stats, row_sample)
    return out


def test_scalar_sketch_is_unchanged():
    x = torch.tensor([[0.0, -2.0], [3.0, 0.0]])
    assert dict(zip(SCALAR_STATS, scalar_sketch(x).tolist())) == {
        "min": -2.0, "max": 3.0, "mean": 0.25, "l1": 5.0, "sumsq": 13.0, "nnz": 2.0}
    assert scalar_sketch(x).dtype == torch.float32


def test_every_stat_on_a_known_2x2_tensor():
    x = torch.tensor([[0.0, -2.0], [3.0, 0.0]])
    s = stats_of(x)
    scal = {k: float(v[1][0]) for k, v in s.items() if len(v[1]) == 1 and k not in ("adj_sumsq",)}
    flat = np.array([0.0, -2.0, 3.0, 0.0])
    d = flat - flat.mean()
    assert scal["kurtosis"] == pytest.approx(np.mean(d ** 4) / np.mean(d ** 2) ** 2)
    assert scal["chan_outlier"] == pytest.approx(3.0 / 2.5)              # chan_maxabs = [3, 2]
    np.testing.assert_allclose(s["chan_maxabs"][1], [3.0, 2.0])
    np.testing.assert_allclose(s["pos_sumsq"][1], [4.0, 9.0])
    np.testing.assert_allclose(s["adj_sumsq"][1], [13.0])               # (3-0)^2 + (0+2)^2
    assert scal["far_sumsq"] == pytest.approx(13.0)                     # R = 2: rows 1 apart, the same pair
    np.testing.assert_array_equal(s["adj_sumsq"][0], [0])
    hist = dict(zip(s["hist"][0].tolist(), s["hist"][1].tolist()))
    # x / 3 = [0, -2/3, 1, 0] -> bins floor((y + 1) * 16) = 16, 5, 31 (y = 1 in the last bin), 16
    assert {b: h for b, h in hist.items() if h} == {5: 0.25, 16: 0.5, 31: 0.25}
    np.testing.assert_allclose(s["sample"][1], flat)
    np.testing.assert_array_equal(s["sample"][0], [0, 1, 2, 3])
    np.testing.assert_array_equal(s["nonfinite"][0], [0, 1, 2])          # NaN, +inf, -inf
    np.testing.assert_array_equal(s["nonfinite"][1], [0.0, 0.0, 0.0])


def test_nonfinite_counts_on_the_torch_path_including_large_chunked_tensors(monkeypatch):
    """Exact NaN/+inf/-inf counts with the kernel off, in the fixed set too; a finite tensor reads zeros."""
    from goblin_assets.opscope import ckernel
    from goblin_assets.opscope.sketches import FIXED_STATS

    monkeypatch.setenv(ckernel.ENV, "torch")
    assert "nonfinite" in FIXED_STATS and "nonfinite" not in SCALAR_STATS
    x = torch.randn(4100, 1040, generator=torch.Generator().manual_seed(7))        # 17 MiB: chunked reductions
    assert stats_of(x, 256)["nonfinite"][1].tolist() == [0.0, 0.0, 0.0]
    x[10, :3] = float("nan")
    x[4000, 7], x[5, 5], x[6, 6] = float("inf"), float("-inf"), float("-inf")
    for stats in (STATS, ("nonfinite",), FIXED_STATS):          # with and without the mean's chunk sums
        assert stats_of(x, 256, stats)["nonfinite"][1].tolist() == [3.0, 1.0, 2.0]
    s = stats_of(x, 256)
    assert np.isnan(s["min"][1][0]) and np.isnan(s["hist"][1]).all() and np.isnan(s["chan_maxabs"][1][:3]).all()


def test_vector_stats_follow_the_row_channel_view_of_a_3d_tensor():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=g)
    s = stats_of(x)
    a = x.numpy().reshape(15, 7)
    np.testing.assert_allclose(s["chan_maxabs"][1], np.abs(a).max(0), rtol=1e-6)
    np.testing.assert_allclose(s["pos_sumsq"][1], (a ** 2).sum(1), rtol=1e-5)
    np.testing.assert_allclose(s["adj_sumsq"][1], ((a[1:] - a[:-1]) ** 2).sum(1), rtol=1e-5)
    assert s["far_sumsq"][1][0] == pytest.approx(((a[7:] - a[:8]) ** 2).sum(1).mean(), rel=1e-5)   # h = 15 // 2
    assert s["hist"][1].sum() == pytest.approx(1.0)
    assert len(s["sample"][1]) == 16 and s["sample"][0][-1] == x.numel() - 1
    np.testing.assert_allclose(s["sample"][1], a.reshape(-1)[s["sample"][0]])


@pytest.mark.parametrize("shape", [(5,), (), (3, 4, 5), (384, 384), (257, 3), (40000,), (9, 300, 70)])
def test_lengths_match_the_layout(shape):
    x = torch.randn(shape)
    for rs in (None, 256):
        assert len(sketch_vector(x, row_sample=rs)) == sketch_length(shape, row_sample=rs)


def test_strided_views_give_the_same_sketches_as_their_copy():
    x = torch.randn(64, 600, 48).transpose(0, 2)          # non-contiguous (48, 600, 64)
    for rs in (None, 256):
        torch.testing.assert_close(sketch_vector(x, row_sample=rs), sketch_vector(x.contiguous(), row_sample=rs),
                                   rtol=1e-5, atol=1e-6)  # float32 reductions in another order


@pytest.mark.parametrize("shape", [(64, 1536), (2, 40, 768), (50, 1536), (64, 384)])
def test_blocked_channel_reduction_is_exact(shape):
    """Wide contiguous views take the blocked per-channel min/max (C >= 512, R % 16 == 0): same values as amax(0)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.1, 9.0, shape[-1])
    s = stats_of(x)
    a = x.reshape(-1, shape[-1])
    np.testing.assert_array_equal(s["chan_maxabs"][1], a.abs().amax(0).numpy())
    assert s["min"][1][0] == float(a.min()) and s["max"][1][0] == float(a.max())
    assert s["chan_outlier"][1][0] == pytest.approx(float(a.abs().amax(0).max() / a.abs().amax(0).mean()), rel=1e-6)


def test_large_tensors_reduced_in_chunks_give_the_exact_whole_tensor_values():
    """>= 16 MiB: the whole-tensor reductions run over ~1 MiB chunks of rows (and a ragged last chunk)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4100, 1040, generator=g) * torch.linspace(0.1, 5.0, 1040)       # 17 MiB, R % 16 != 0
    s = stats_of(x)
    a = x.double()
    np.testing.assert_array_equal(s["chan_maxabs"][1], x.abs().amax(0).numpy())
    assert s["min"][1][0] == float(x.min()) and s["max"][1][0] == float(x.max())
    assert s["mean"][1][0] == pytest.approx(float(a.mean()), rel=1e-5, abs=1e-7)
    assert s["sumsq"][1][0] == pytest.approx(float((a * a).sum()), rel=1e-6)
    np.testing.assert_allclose(s["pos_sumsq"][1], (a * a).sum(1).numpy(), rtol=1e-5)
    y = torch.randn(16, 1100, 256, generator=g).transpose(0, 1)                       # strided 3-D, 17 MiB
    torch.testing.assert_close(sketch_vector(y, row_sample=None), sketch_vector(y.contiguous(), row_sample=None),
                               rtol=1e-5, atol=1e-6)


def test_nnz_is_exact_on_sparse_data_and_in_low_precision():
    x = torch.randn(300, 70)
    x[x < 0.4] = 0
    x = x[:200]                                                                   # 14000 <= SHAPE_SAMPLE: exact
    assert float(sketch_vector(x, ("nnz",))) == int(torch.count_nonzero(x))
    assert float(sketch_vector(x, ("nnz",), row_sample=None)) == int(torch.count_nonzero(x))
    assert float(sketch_vector(x.to(torch.bfloat16), ("nnz",))) == int(torch.count_nonzero(x.to(torch.bfloat16)))
    assert float(sketch_vector(torch.zeros(5, 5), ("nnz", "kurtosis", "chan_outlier")).abs().sum()) == 0.0


def test_unknown_stat_is_a_typed_error():
    with pytest.raises(SketchError, match="bogus"):
        sketch_vector(torch.ones(2, 2), ("min", "bogus"))


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_sampled_sketches_stay_within_the_stated_error(dist):
    """Module docstring: exact tier exact; density 0.01, l1 3 %, far_sumsq 10 %, hist 0.05, kurtosis 10 % below 10."""
    x = draw(dist, (4096, 384), torch.Generator().manual_seed(1))
    exact, samp = stats_of(x, None), stats_of(x, 256)
    for s in ("min", "max", "mean", "sumsq", "chan_outlier"):
        assert samp[s][1][0] == pytest.approx(exact[s][1][0], rel=1e-6, abs=1e-6), s
    np.testing.assert_array_equal(samp["chan_maxabs"][1], exact["chan_maxabs"][1])
    e1 = lambda s: exact[s][1][0]  # noqa: E731
    s1 = lambda s: samp[s][1][0]   # noqa: E731
    assert abs(s1("nnz") - e1("nnz")) / x.numel() < 0.01
    assert s1("l1") == pytest.approx(e1("l1"), rel=0.03)
    assert s1("far_sumsq") == pytest.approx(e1("far_sumsq"), rel=0.10)
    assert np.abs(samp["hist"][1] - exact["hist"][1]).sum() < 0.05
    if e1("kurtosis") < 10:   # heavy tails (heavy-tailed, outlier-channel): no useful sampled estimate
        assert s1("kurtosis") == pytest.approx(e1("kurtosis"), rel=0.10)
    rows = samp["pos_sumsq"][0]
    assert len(rows) == 256 and rows[1] == 4096 // 256
    np.testing.assert_allclose(samp["pos_sumsq"][1], exact["pos_sumsq"][1][rows], rtol=1e-6)
    np.testing.assert_allclose(samp["adj_sumsq"][1], exact["adj_sumsq"][1][rows], rtol=1e-5)


def test_sampling_is_deterministic_and_visits_every_channel():
    x = torch.randn(2048, 384)
    torch.testing.assert_close(sketch_vector(x), sketch_vector(x.clone()))
    stride, count = shape_sample(x.numel(), 384, 256)
    assert 0.9 * SHAPE_SAMPLE < count <= SHAPE_SAMPLE and np.gcd(stride, 384) == 1
    assert len(set((np.arange(count) * stride % 384).tolist())) == 384


def test_known_distribution_values():
    g = torch.Generator().manual_seed(2)
    kurt = {d: stats_of(draw(d, (1024, 256), g))["kurtosis"][1][0] for d in ("gaussian", "uniform", "heavy-tailed")}
    assert kurt["gaussian"] == pytest.approx(3.0, abs=0.15)
    assert kurt["uniform"] == pytest.approx(1.8, abs=0.05)
    assert kurt["heavy-tailed"] > 6


def test_probs_sketch_definitions():
    p = torch.tensor([[[0.7, 0.3], [0.5, 0.5]],
                      [[1.0, 0.0], [0.1, 0.9]]])          # (batch 2, Q 2, K 2), softmax over the last axis
    v = probs_vector(p).numpy()
    lay = probs_layout(p.shape)
    assert [s for s, _ in lay] == ["peak_prob", "key_mass"]
    np.testing.assert_allclose(v[:2], [(0.7 + 1.0) / 2, (0.5 + 0.9) / 2])   # per query, mean over batch
    np.testing.assert_allclose(v[2:], [(1.2 + 1.1) / 2, (0.8 + 0.9) / 2])   # per key, summed over queries
    assert v[2:].sum() == pytest.approx(2.0)                                  # = Q
    # softmax over a non-last axis
    np.testing.assert_allclose(probs_vector(p.transpose(-1, -2), dim=-2).numpy(), v)


def test_route_sketch_is_the_expert_load_share():
    idx = torch.tensor([[0, 1], [0, 2], [0, 1]])
    vals = torch.zeros_like(idx, dtype=torch.float32)
    np.testing.assert_allclose(route_vector((vals, idx), 4).numpy(), [3 / 6, 2 / 6, 1 / 6, 0.0])
    assert HIST_BINS == 32
