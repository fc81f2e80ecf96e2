"""Sketches: cheap on-device reductions of a matmul operand or output.

Every function takes a tensor on any device and returns tensors on the same
device (no host transfer): the caller stacks a step's sketches and reads them
back once.  Statistics are computed in float32.
"""
from __future__ import annotations

import torch

#: Scalar statistics of :func:`scalar_sketch`, in output order.
SCALAR_STATS: tuple[str, ...] = ("min", "max", "mean", "l1", "sumsq", "nnz")


def scalar_sketch(x: torch.Tensor) -> torch.Tensor:
    """Scalar sketch of ``x``: min, max, mean, l1 (sum |x|), sumsq (sum x²), nnz.

    Shapes: any ``x`` -> float32 tensor of shape ``(6,)`` on ``x.device``, in
    the order of :data:`SCALAR_STATS`.  ``nnz`` counts exact non-zeros
    (``nnz / numel`` is the density).
    """
    xf = x.detach().reshape(-1).float()
    if xf.numel() == 0:
        return torch.zeros(len(SCALAR_STATS), device=x.device)
    mn, mx = torch.aminmax(xf)
    return torch.stack(
        (mn, mx, xf.mean(), xf.abs().sum(), (xf * xf).sum(), (xf != 0).sum().float())
    )
