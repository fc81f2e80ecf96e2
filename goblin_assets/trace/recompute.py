"""GPU time spent re-running the forward inside backward (activation checkpointing), per profiler step.

Two detectors, the first that applies wins (``method`` column):

* ``python_stack`` (``with_stack`` traces): the non-reentrant
  ``torch.utils.checkpoint`` recomputes a segment inside the saved-tensor
  unpack hook, in the frame ``torch/utils/checkpoint.py(N): recompute_fn``
  (PyTorch ``torch/utils/checkpoint.py``, ``_checkpoint_without_reentrant_generator``
  defines ``recompute_fn`` and runs it from ``_checkpoint_hook.unpack_hook``).
  Every device event launched on that thread while such a frame is open is
  recompute.  Seen in the MI300X ResNet trace of TraceLens's test suite
  (``tests/traces/mi300/resnet_act_checkpoint.json.gz``): 4 frames per step on
  the autograd thread, under ``autograd::engine::evaluate_function: ReluBackward0``.
* ``autograd_forward_ops`` (no Python stack): inside a backward node
  (nested in an ``autograd::engine::evaluate_function:`` range on the same
  thread), an op that carries a ``Sequence number`` (it was recorded with
  autograd on, i.e. under ``torch.enable_grad()`` as checkpoint
  recomputation is) and is not itself a backward node (``autograd::...``,
  ``torch::autograd::CppNode<...>`` of custom C++ Functions, ``*Backward<N>``)
  is a forward op being re-run; its outermost occurrences
  and the device events launched inside them are recompute
  (:func:`forward_ops_in_backward`).  On the trace above both detectors select the same ops.

``recompute_pct`` is recompute GPU time over the step's (CPU-side
``ProfilerStep#N``) duration; the grade uses ``THRESHOLDS['recompute_pct']``.
A step's recompute is the device events launched from inside the step window.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from goblin_assets.trace.events import TraceEvents
from goblin_assets.trace.ops import launched_gpu_us, outermost, require_kineto
from goblin_assets.trace.severity import THRESHOLDS, Finding, graded

RECOMPUTE_COLS = ["step", "step_us", "recompute_us", "recompute_pct", "recompute_ops", "method", "severity"]
_RECOMPUTE_FRAME = re.compile(r"torch/utils/checkpoint\.py\(\d+\): recompute_fn$")
_BACKWARD_NODE = re.compile(r"^autograd::|^torch::autograd::|Backward\d*$")  # CppNode<...>: custom C++ Functions


def recompute_regions(ev: TraceEvents) -> tuple[pd.DataFrame, str]:
    """The host intervals (``tid``, ``ts_us``, ``end_us``) inside which forward work is re-run, and the method used."""
    py = ev.python
    frames = py[py["name"].str.contains(_RECOMPUTE_FRAME)] if not py.empty else py
    if not frames.empty:
        return outermost(frames)[["tid", "ts_us", "end_us"]], "python_stack"
    return outermost(forward_ops_in_backward(ev.cpu_ops))[["tid", "ts_us", "end_us"]], "autograd_forward_ops"


def forward_ops_in_backward(ops: pd.DataFrame) -> pd.DataFrame:
    """The forward ops (a ``Sequence number``, not a backward node) that run *inside* a backward node.

    Checkpoint recomputation runs inside the backward node that unpacks the
    saved tensors (``autograd::engine::evaluate_function: <Node>``), so a
    re-run forward op is nested in such a range on the same thread.  A forward
    op merely on a thread that also runs a few backward nodes (the main
    thread, which evaluates CPU-side nodes such as ``AccumulateGrad`` or a
    loss's backward) is the ordinary forward pass: without this nesting test
    the whole forward of such a trace counted as recompute (issue 29: HTA's
    ``trace_diff`` training traces, 40-80 % of the step, no checkpointing).
    """
    nodes = ops[ops["name"].str.startswith("autograd::engine::evaluate_function")]
    fwd = ops[ops["tid"].isin(nodes["tid"].unique()) & ops["sequence_number"].notna()
              & ~ops["name"].str.contains(_BACKWARD_NODE)]
    keep = np.zeros(len(fwd), dtype=bool)
    for tid, g in outermost(nodes).groupby("tid"):
        starts, ends = g["ts_us"].to_numpy(), g["end_us"].to_numpy()
        on = (fwd["tid"] == tid).to_numpy()
        ts, end = fwd["ts_us"].to_numpy()[on], fwd["end_us"].to_numpy()[on]
        at = np.searchsorted(starts, ts, "right") - 1
        keep[on] = (at >= 0) & (end <= ends[np.clip(at, 0, None)])
    return fwd[keep]


def activation_recompute(ev: TraceEvents) -> pd.DataFrame:
    """Recompute GPU time per profiler step.

    Columns
    -------
    ``step`` (ProfilerStep number), ``step_us`` (µs, the step's CPU-side
    duration), ``recompute_us`` (µs, GPU time of the device events launched
    inside the recompute regions that start in the step), ``recompute_pct``
    (% of ``step_us``), ``recompute_ops`` (number of recompute regions),
    ``method`` (``python_stack`` | ``autograd_forward_ops``, see the module
    docstring), ``severity`` (graded by ``THRESHOLDS['recompute_pct']``).
    Empty (same columns) when the trace has no ``ProfilerStep`` windows.

    Raises
    ------
    TraceReadError
        ``ev`` is not a Kineto :class:`TraceEvents`.
    """
    require_kineto(ev, "activation_recompute")
    if not ev.has_steps:
        return pd.DataFrame(columns=RECOMPUTE_COLS)
    regions, method = recompute_regions(ev)
    gpu = launched_gpu_us(ev, regions["tid"], regions["ts_us"], regions["end_us"])
    steps = ev.steps.sort_values("start_us")
    starts, ends = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
    at = np.searchsorted(starts, regions["ts_us"].to_numpy(), "right") - 1
    inside = (at >= 0) & (regions["ts_us"].to_numpy() < ends[np.clip(at, 0, None)])
    per = pd.DataFrame({"i": at[inside], "us": gpu[inside]}).groupby("i")["us"].agg(["sum", "size"])
    out = pd.DataFrame({"step": steps["step"].to_numpy(), "step_us": steps["dur_us"].to_numpy()})
    out["recompute_us"] = per["sum"].reindex(range(len(out))).fillna(0.0).to_numpy()
    out["recompute_ops"] = per["size"].reindex(range(len(out))).fillna(0).astype(int).to_numpy()
    out["recompute_pct"] = 100.0 * out["recompute_us"] / out["step_us"]
    out["method"] = method
    out["severity"] = [THRESHOLDS["recompute_pct"].grade(v) for v in out["recompute_pct"]]
    return out[RECOMPUTE_COLS]


def recompute_findings(ev: TraceEvents, table: pd.DataFrame) -> list[Finding]:
    """One finding graded by the median step's ``recompute_pct`` (``THRESHOLDS['recompute_pct']``); none when
    the trace has no steps or no recompute.  Evidence: per-step µs, the method, regions per step."""
    if table.empty or float(table["recompute_us"].sum()) <= 0:
        return []
    pct, us = float(table["recompute_pct"].median()), float(table["recompute_us"].median())
    return [graded("recompute", "activation_recompute", "recompute_pct", pct,
                   f"activation checkpointing re-runs {us / 1e3:.2f} ms of forward GPU work per step "
                   f"({pct:.1f}% of the step; {table['method'].iloc[0].replace('_', ' ')})",
                   per_step_us={int(s): round(float(u), 3) for s, u in zip(table["step"], table["recompute_us"])},
                   regions_per_step=int(table["recompute_ops"].median()))]
