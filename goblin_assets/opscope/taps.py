"""On-device taps for eager user scripts (the dispatcher-level tap of DESIGN.md).

Where no graph can be taken from a user's script, :class:`MatmulTap` (a
``TorchDispatchMode``) sees every aten matmul as it executes, computes the
sketches of ``lhs``, ``rhs`` and ``out`` with the backend's own kernels on the
operands' device, and keeps them there; :meth:`MatmulTap.flush` stacks a
step's sketches and reads them back to the host once per step, never per op.
Backward-pass matmuls are skipped (``torch._C._current_autograd_node()`` is set
inside the autograd engine), so a site is a forward matmul.

Sites are named by the leaf module that issued the op (``linear_0``,
``linear_1``, ... in first-call order, via a global forward pre-hook), and by
op and call order when no module is active.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from goblin_assets.opscope.sketches import ROW_SAMPLE, STATS, sketch_layout, sketch_vector

aten = torch.ops.aten

#: op -> (lhs arg index, rhs arg index)
MATMUL_OPS = {
    aten.addmm.default: (1, 2),
    aten.mm.default: (0, 1),
    aten.bmm.default: (0, 1),
    aten.baddbmm.default: (1, 2),
}


def _mkn(lhs: torch.Tensor, rhs: torch.Tensor) -> tuple[int, int, int]:
    """(M, K, N) of ``lhs @ rhs`` with batch dims folded into M."""
    k = int(lhs.shape[-1])
    m = int(lhs.numel() // max(k, 1))
    n = int(rhs.shape[-1])
    return m, k, n


class MatmulTap(TorchDispatchMode):
    """Record sketches of every forward matmul; rows per step after :meth:`flush`.

    ``stats``: names from :data:`goblin_assets.opscope.sketches.STATS`, by
    default all of them (what the audit's ``tensor_sketches`` records), with
    the per-row sketches on ``row_sample`` rows and the histogram, kurtosis,
    l1 and nnz on the shape sample of large tensors (stated error:
    :mod:`goblin_assets.opscope.sketches`); at most ``~C + 2 * row_sample +
    60`` values per tensor.  :data:`~goblin_assets.opscope.sketches.FIXED_STATS`
    (no per-row or per-channel vectors) keeps a huge model's rows small.
    ``rows`` is a list of dicts with keys step, site, role (lhs|rhs|out),
    stat, idx, value, M, K, N, numel: the tidy schema of DESIGN.md minus run
    columns (vector stats use ``idx``, scalars idx 0).  ``value`` may be NaN
    or ``±inf``: a tensor holding them is sketched like any other, and its
    ``nonfinite`` stat counts them (idx 0 NaN, 1 +inf, 2 -inf).

    Cost (measured in process on workloads/digits_mlp's MLP, batch 64, one
    thread, best of 8 x 20 training steps on a shared 2-core machine): a
    plain step 1.2 ms; the tap adds 5.4 ms per step with the six scalars,
    14.6 ms with the full set (row-sampled) and 16.7 ms with every sketch
    exact, against the workload's ~60 ms of data loading per step (its
    augmentation; ``docs/measured_facts.md``): about +25 % on the few
    steps of a sketch run, ~4,000 rows per step.
    """

    def __init__(self, stats: tuple[str, ...] = STATS, row_sample: int | None = ROW_SAMPLE) -> None:
        super().__init__()
        self.stats = tuple(stats)
        self.row_sample = row_sample
        self.rows: list[dict] = []
        self._pending: list[tuple[str, str, tuple[int, int, int], tuple[int, ...], torch.Tensor]] = []
        self._module_names: dict[int, str] = {}
        self._per_class: dict[str, int] = {}
        self._current: str | None = None
        self._seen_in_step: dict[str, int] = {}
        self._hook = None

    # the leaf module currently running, for site names
    def _pre_hook(self, module, args):
        if next(module.children(), None) is None:
            key = id(module)
            if key not in self._module_names:
                cls = type(module).__name__.lower()
                n = self._per_class.get(cls, 0)
                self._per_class[cls] = n + 1
                self._module_names[key] = f"{cls}_{n}"
            self._current = self._module_names[key]

    def __enter__(self):
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._pre_hook)
        return super().__enter__()

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        roles = MATMUL_OPS.get(func)
        if roles is not None and torch._C._current_autograd_node() is None:
            lhs, rhs = args[roles[0]], args[roles[1]]
            base = self._current or func.__name__.split(".")[0]
            k = self._seen_in_step.get(base, 0)
            self._seen_in_step[base] = k + 1
            site = base if k == 0 else f"{base}#{k}"
            mkn = _mkn(lhs, rhs)
            for role, t in (("lhs", lhs), ("rhs", rhs), ("out", out)):
                self._pending.append((site, role, mkn, tuple(t.shape),
                                      sketch_vector(t, self.stats, self.row_sample)))
        return out

    def flush(self, step: int) -> None:
        """Read this step's sketches back to the host (one transfer) and append rows."""
        self._seen_in_step.clear()
        if not self._pending:
            return
        values = torch.cat([p[4] for p in self._pending]).cpu().tolist()
        pos = 0
        for site, role, (m, k, n), shape, _ in self._pending:
            numel = int(torch.Size(shape).numel())
            for stat, idx in sketch_layout(shape, self.stats, self.row_sample):
                for i in idx.tolist():
                    self.rows.append({"step": step, "site": site, "role": role, "stat": stat, "idx": i,
                                      "value": float(values[pos]), "M": m, "K": k, "N": n, "numel": numel})
                    pos += 1
        self._pending.clear()
