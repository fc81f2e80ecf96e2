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


def test_non_finite_input_takes_the_torch_path(torch_path):
    x = torch.randn(64, 32)
    x[3, 5] = float("nan")
    v = sketch_vector(x)
    assert torch.isnan(v[0]) and torch.isnan(v[1])          # min, max propagate NaN as torch's amin/amax do
    torch.testing.assert_close(v, torch_path(lambda: sketch_vector(x)), equal_nan=True)
    x[3, 5] = float("inf")
    assert sketch_vector(x)[1] == float("inf")


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
