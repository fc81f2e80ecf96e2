"""The fused CPU sketch kernel (``_sketch.c``) against the torch path of the same sketches."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from goblin_assets.opscope import ckernel
from goblin_assets.opscope.drivers import DISTRIBUTIONS, draw
from goblin_assets.opscope.sketches import STATS, probs_vector, sketch_layout, sketch_vector

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

#: exact in both paths (order-free reductions, copies): compared bit for bit
EXACT = {"min", "max", "chan_maxabs", "sample"}


@pytest.fixture
def torch_path(monkeypatch):
    """Call ``f()`` with the kernel switched off (the torch path)."""
    def run(f):
        with monkeypatch.context() as m:
            m.setenv(ckernel.ENV, "torch")
            return f()
    return run


def test_the_kernel_is_built():
    # `make install` compiles it; a silent fallback would hide a 2-5x slower recorder
    assert ckernel.path() is not None, "goblin_assets/opscope/_sketch.c was not compiled (pip install -e .)"
    assert ckernel.lib() is not None


def assert_same(x: torch.Tensor, stats=STATS, row_sample=256, torch_path=None):
    fused = sketch_vector(x, stats, row_sample)
    ref = torch_path(lambda: sketch_vector(x, stats, row_sample))
    assert fused.dtype == torch.float64 and fused.shape == ref.shape
    pos = 0
    for stat, idx in sketch_layout(x.shape, stats, row_sample):
        a, b = fused[pos:pos + len(idx)], ref[pos:pos + len(idx)]
        pos += len(idx)
        if stat in EXACT:
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{stat}: {m}")
        elif stat == "hist":  # the same bins; the torch path adds 1/n per element (rounding ~1e-11 at n = 1e6),
            # one element in another bin would move a share by 1/n >= 1e-6
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=lambda m: f"{stat}: {m}")
        else:   # float32 sums in another order
            torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-5 * (float(b.abs().max()) if b.numel() else 1.0) + 1e-12,
                                       msg=lambda m: f"{stat}: {m}")


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("row_sample", [256, None])
def test_kernel_equals_torch_path_on_every_distribution(dist, row_sample, torch_path):
    x = draw(dist, (2048, 384), torch.Generator().manual_seed(3))
    assert_same(x, row_sample=row_sample, torch_path=torch_path)


@pytest.mark.parametrize("shape", [(), (5,), (1, 1), (300, 1), (7, 33), (2, 3, 300), (4, 600, 16), (40000,)])
def test_kernel_equals_torch_path_on_odd_shapes(shape, torch_path):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    assert_same(x, torch_path=torch_path)


def test_strided_views_subsets_and_half_precision(torch_path):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(8, 64, 12, 32, generator=g)
    for view in (base.permute(0, 2, 1, 3), base.permute(0, 2, 3, 1)):   # per-head q/v, and k^T
        assert not view.is_contiguous()
        assert_same(view, torch_path=torch_path)
    # not a dense block (a slice with gaps, a broadcast axis): copied contiguous first
    assert_same(base[:, ::3, :, 1:], torch_path=torch_path)
    assert_same(torch.randn(64, 1, 40).expand(64, 30, 40), torch_path=torch_path)
    assert_same(base, stats=("mean", "hist", "far_sumsq"), torch_path=torch_path)
    assert_same(base, stats=("sample",), torch_path=torch_path)
    assert_same(base.to(torch.bfloat16), torch_path=torch_path)


def _nonfinite_cases():
    """Tensors holding NaN and inf in every layout the kernel reads (name, tensor)."""
    g = torch.Generator().manual_seed(5)
    nan, inf = float("nan"), float("inf")
    one = torch.randn(64, 32, generator=g)
    one[3, 5] = nan
    both = torch.randn(64, 32, generator=g)
    both[3, 5], both[7, 1] = inf, -inf
    wide = torch.randn(4096, 384, generator=g)                 # row-sampled; NaN in one channel, inf elsewhere
    wide[100:200, 7], wide[5, 5] = nan, inf
    half = torch.randn(512, 96, generator=g).half()
    half[0, 0] = 70000.0                                       # past fp16's range: +inf
    heads = torch.randn(8, 64, 12, 32, generator=g)
    heads[1, 2, 3, 4], heads[0, 0, 0, 0] = nan, -inf
    return [("one_nan", one), ("pos_and_neg_inf", both), ("wide", wide), ("fp16_overflow", half),
            ("k_transposed", heads.permute(0, 2, 3, 1)), ("per_head", heads.permute(0, 2, 1, 3)),
            ("all_nan", torch.full((16, 8), nan)), ("vector", torch.tensor([1.0, nan, inf, -2.0]))]


@pytest.mark.parametrize("name,x", _nonfinite_cases(), ids=[n for n, _ in _nonfinite_cases()])
def test_non_finite_input_is_sketched_by_the_kernel_as_by_torch(name, x, torch_path):
    """NaN and inf are data: the kernel sketches them (no fallback) with the torch path's values, counts exact."""
    from goblin_assets.opscope.sketches import _sketch_c

    assert _sketch_c(x, STATS, 256) is not None              # the fused kernel, not the torch fallback
    fused = sketch_vector(x)
    ref = torch_path(lambda: sketch_vector(x))
    torch.testing.assert_close(fused, ref, rtol=2e-5, atol=1e-5, equal_nan=True)
    got = dict(zip(("nan", "posinf", "neginf"), fused[-3:].tolist()))
    xf = x.float()
    assert got == {"nan": int(xf.isnan().sum()), "posinf": int((xf == float("inf")).sum()),
                   "neginf": int((xf == float("-inf")).sum())}


def test_non_finite_semantics_are_documented_ones(torch_path):
    """min/max/chan_outlier NaN with a NaN, hist NaN when max|x| is not finite, nnz counts NaN as non-zero."""
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(6))
    x[3, 5] = float("nan")
    for path in (lambda f: f(), torch_path):
        v = dict((s, path(lambda s=s: sketch_vector(x, (s,)))) for s in ("min", "max", "chan_outlier", "hist", "nnz",
                                                                          "chan_maxabs", "sample"))
        assert torch.isnan(v["min"]) and torch.isnan(v["max"]) and torch.isnan(v["chan_outlier"])
        assert torch.isnan(v["hist"]).all()
        assert float(v["nnz"]) == int((x != 0).sum())                   # exact: 2048 elements, all sampled
        assert torch.isnan(v["chan_maxabs"][5]) and torch.isfinite(v["chan_maxabs"][:5]).all()
    x[3, 5] = float("inf")
    assert sketch_vector(x, ("max",)) == float("inf") and torch.isnan(sketch_vector(x, ("hist",))).all()
    big = torch.full((16, 8), 1e30)                             # finite values whose squares overflow float32
    v = sketch_vector(big, ("sumsq", "nonfinite"))
    assert v[0] == float("inf") and v[1:].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(v, torch_path(lambda: sketch_vector(big, ("sumsq", "nonfinite"))))


def test_a_stale_kernel_build_is_not_used(monkeypatch):
    """A library built from another interface version (e.g. before `nonfinite`) falls back to the torch path."""
    monkeypatch.setattr(ckernel, "_state", {})
    monkeypatch.setattr(ckernel, "ABI", ckernel.ABI + 1)
    assert ckernel.lib() is None
    x = torch.randn(32, 16)
    assert sketch_vector(x).shape == (len(torch.cat([torch.as_tensor(i) for _, i in sketch_layout(x.shape)])),)


def test_row_blocks_on_threads_equal_one_pass(torch_path):
    x = torch.randn(4096, 384, generator=torch.Generator().manual_seed(4))
    one = sketch_vector(x)
    torch.set_num_threads(2)
    try:
        two = sketch_vector(x)
    finally:
        torch.set_num_threads(1)
    torch.testing.assert_close(two, one, rtol=0, atol=0)


def test_probs_kernel_equals_torch_path(torch_path):
    scores = torch.randn(4, 3, 20, 20, generator=torch.Generator().manual_seed(5))
    scores[..., 15:] = float("-inf")                          # padded keys
    p = scores.softmax(-1)
    for dim in (-1, 2):
        q = p if dim == -1 else p.transpose(-1, -2)
        fused = probs_vector(q, dim)
        torch.testing.assert_close(fused, torch_path(lambda: probs_vector(q, dim)), rtol=1e-6, atol=1e-6)
    assert np.allclose(probs_vector(p).numpy()[20 + 15:], 0.0)


def test_out_is_written_in_place_on_both_paths(torch_path):
    from goblin_assets.opscope.sketches import SketchError, sketch_length

    x = torch.randn(300, 48, generator=torch.Generator().manual_seed(6))
    n = sketch_length(x.shape)
    for run in (lambda f: f(), torch_path):
        buf = torch.full((n + 4,), -7.0, dtype=torch.float64)
        got = run(lambda: sketch_vector(x, out=buf[2:2 + n]))
        assert got.data_ptr() == buf[2:].data_ptr()
        torch.testing.assert_close(buf[2:2 + n], sketch_vector(x), rtol=2e-5, atol=1e-5)
        assert buf[:2].eq(-7.0).all() and buf[-2:].eq(-7.0).all()      # nothing written outside the slice
    with pytest.raises(SketchError, match="out has 3 values"):
        sketch_vector(x, out=torch.empty(3, dtype=torch.float64))
