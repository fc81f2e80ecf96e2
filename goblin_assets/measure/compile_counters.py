"""torch.compile's record of a run read back: graphs, graph breaks, recompiles, compile time, and the signals.

The harness's probe (:mod:`goblin_assets.runners.compile_probe`) writes
dynamo's own counters (``torch._dynamo.utils.counters``), the records of its
``graph_breaks`` and ``recompiles`` log artifacts and each compile's
duration into ``result.json`` (``dynamo``; carried on
:attr:`RunMetrics.dynamo <goblin_assets.contracts.RunMetrics>`).
:func:`compile_stats` validates it into :class:`CompileStats`:

- ``graph_breaks``: one row per distinct break (the user's ``file:line`` and
  dynamo's reason), with how often dynamo hit it (a recompiled frame breaks
  again) and the step it first came in;
- ``recompiles``: one row per recompile with the guard that failed, its
  class (:func:`guard_class`: ``size`` for a tensor size or stride guard,
  ``value`` for a Python scalar guarded as a constant (what a tensor value
  read with ``.item()`` and used in a branch becomes), ``other``);
- ``first_call_graphs``: graphs compiled during the first step that
  compiled: what :func:`torch._dynamo.explain` counts for one call
  (``graph_count``; its ``graph_break_count`` is ``graph_count - 1``);
- ``compile_s`` / ``run_s``: seconds compiling (dynamo's compile start/end
  callbacks) and seconds of the harness's run, measured; their ratio is
  ``compile_share``.

:func:`compile_signals` turns them into the run's signals that rules read
(``signals.dynamo_graph_break_item`` ...; :data:`COMPILE_SIGNALS`).  Source
of the kinds of break and recompile: PyTorch, "torch.compile
troubleshooting" (graph breaks, recompilation, dynamic shapes),
https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from goblin_assets.contracts import Signal
from goblin_assets.errors import GoblinError
from goblin_assets.warehouse.tables import columns

#: Derived signals of a compiled run (``signals.<id>`` of detect conditions), with what each counts.
COMPILE_SIGNALS: dict[str, str] = {
    "dynamo_graph_breaks": "distinct torch.compile graph breaks in the run (dynamo's graph_breaks log)",
    "dynamo_graph_break_item": "graph breaks on a tensor value read into Python (Tensor.item(), data-dependent "
                               "control flow)",
    "dynamo_graph_break_print": "graph breaks on print or logging calls inside the compiled code",
    "dynamo_recompile_shapes": "recompiles because a tensor's size changed (dynamo's size guard failed)",
    "dynamo_recompile_values": "recompiles because a Python scalar guarded as a constant changed (a tensor value "
                               "read with .item() and branched on)",
}

_ITEM = re.compile(r"Tensor\.item\(\)|data[- ]dependent|capture_scalar_outputs|Tensor\.tolist|"
                   r"generic_jump|jump.*TensorVariable", re.IGNORECASE)
_PRINT = re.compile(r"builtin operator `print`|\bprint\b|logging|Logger", re.IGNORECASE)
_SIZE_GUARD = re.compile(r"size mismatch|stride mismatch|\.size\(\)\[|dimension|numel", re.IGNORECASE)
_VALUE_GUARD = re.compile(r"==\s*-?[\d.]+(e-?\d+)?\b|!=\s*-?[\d.]+")


class CompileRecordError(GoblinError):
    """A harness result's ``dynamo`` object of the wrong shape (names the field)."""


class _Located(BaseModel):
    """A record at the user's ``file`` and ``line`` (None when dynamo named none)."""

    model_config = ConfigDict(extra="forbid")

    file: str | None
    line: int | None

    @property
    def where(self) -> str:
        """``train.py:31`` (``unknown`` when dynamo named no line)."""
        return f"{Path(self.file).name}:{self.line}" if self.file else "unknown"


class GraphBreak(_Located):
    """One distinct graph break: where (the user's file and line), why (dynamo's reason), how often, first step."""

    reason: str
    detail: str = ""
    count: int = Field(ge=1)
    first_step: int


class Recompile(_Located):
    """One recompile: the function and line dynamo recompiled, the first failing guard, its class, the step."""

    function: str | None
    guard: str
    guard_class: Literal["size", "value", "other"]
    step: int


class CompileStats(BaseModel):
    """What dynamo recorded of one run (see the module docstring); seconds are measured."""

    model_config = ConfigDict(extra="forbid")

    graphs: int | None
    first_call_graphs: int | None
    frames: int | None
    graph_breaks: list[GraphBreak] = Field(default_factory=list)
    graph_break_occurrences: int = 0
    recompiles: list[Recompile] = Field(default_factory=list)
    compiles: int = 0
    compile_s: float = 0.0
    run_s: float | None = None
    compile_steps: list[int] = Field(default_factory=list)
    error: str = ""

    @property
    def compile_share(self) -> float | None:
        """Seconds compiling over seconds of the run (None without the run's length)."""
        return self.compile_s / self.run_s if self.run_s else None

    def headline(self) -> str:
        """``5 graphs, 1 graph break (train.py:31: Unsupported Tensor.item() ...), 7 recompiles (value guard ...);
        compile 2.1 s = 30% of the run``."""
        breaks = "; ".join(f"{b.where}: {b.reason}" for b in self.graph_breaks[:3])
        rc = {}
        for r in self.recompiles:
            rc[r.guard_class] = rc.get(r.guard_class, 0) + 1
        rc_text = ", ".join(f"{n} on a {k} guard" for k, n in sorted(rc.items()))
        share = self.compile_share
        return (f"{self.graphs if self.graphs is not None else 'undetermined'} graphs, "
                f"{len(self.graph_breaks)} distinct graph break{'s' if len(self.graph_breaks) != 1 else ''}"
                + (f" ({breaks})" if breaks else "")
                + f", {len(self.recompiles)} recompile{'s' if len(self.recompiles) != 1 else ''}"
                + (f" ({rc_text})" if rc_text else "")
                + f"; compiling took {self.compile_s:.2f} s"
                + (f" = {share:.0%} of the run (measured)" if share is not None else ""))


def guard_class(guard: str) -> Literal["size", "value", "other"]:
    """``size`` (a tensor size/stride guard failed: a new shape), ``value`` (a scalar constant guard), or ``other``."""
    head = guard.split("#", 1)[0]
    if _SIZE_GUARD.search(head):
        return "size"
    if _VALUE_GUARD.search(head):
        return "value"
    return "other"


def compile_stats(record: dict[str, Any] | None) -> CompileStats | None:
    """The :class:`CompileStats` of a harness result's ``dynamo`` object (None: nothing was compiled).

    Raises
    ------
    CompileRecordError
        The object is not of the shape :mod:`goblin_assets.runners.compile_probe` writes.
    """
    if record is None:
        return None
    try:
        counters = record.get("counters") or {}
        breaks: dict[tuple, GraphBreak] = {}
        for b in record.get("graph_breaks") or []:
            key = (b.get("file"), b.get("line"), b.get("reason"))
            if key in breaks:
                breaks[key].count += 1
            else:
                breaks[key] = GraphBreak(file=b.get("file"), line=b.get("line"), reason=b.get("reason") or "",
                                         detail=b.get("detail") or "", count=1, first_step=int(b.get("step") or 0))
        recompiles = [Recompile(function=r.get("function"), file=r.get("file"), line=r.get("line"),
                                guard=r.get("guard") or "", guard_class=guard_class(r.get("guard") or ""),
                                step=int(r.get("step") or 0)) for r in record.get("recompiles") or []]
        compiles = list(record.get("compiles") or [])
        first = None
        if compiles:
            step1 = compiles[0]["step"]
            first = max((c.get("graphs_so_far") or 0) for c in compiles if c["step"] == step1)
        stats = counters.get("stats") or {}
        return CompileStats(graphs=stats.get("unique_graphs"), first_call_graphs=first,
                            frames=(counters.get("frames") or {}).get("total"), graph_breaks=list(breaks.values()),
                            graph_break_occurrences=sum((counters.get("graph_break") or {}).values()),
                            recompiles=recompiles, compiles=len(compiles),
                            compile_s=float(record.get("compile_s") or 0.0), run_s=record.get("run_s"),
                            compile_steps=sorted({int(c["step"]) for c in compiles}),
                            error=record.get("error") or "")
    except (AttributeError, KeyError, TypeError, ValueError, ValidationError) as exc:
        raise CompileRecordError(f"result.json: field 'dynamo' is not torch.compile's record: {exc}") from exc


def compile_signals(stats: CompileStats | None) -> list[Signal]:
    """The derived signals of :data:`COMPILE_SIGNALS` that came (count > 0), each with its first ``file:line``."""
    if stats is None:
        return []
    out = []

    def add(sid: str, rows: list, text) -> None:
        if rows:
            out.append(Signal(id=sid, count=len(rows), message=text(rows[0])[:300], where=rows[0].where,
                              step=getattr(rows[0], "first_step", None) or getattr(rows[0], "step", None),
                              meaning=COMPILE_SIGNALS[sid],
                              source="https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html"))

    add("dynamo_graph_breaks", stats.graph_breaks, lambda b: f"graph break: {b.reason}")
    add("dynamo_graph_break_item", [b for b in stats.graph_breaks if _ITEM.search(b.reason + " " + b.detail)],
        lambda b: f"graph break: {b.reason}")
    add("dynamo_graph_break_print", [b for b in stats.graph_breaks if _PRINT.search(b.reason)],
        lambda b: f"graph break: {b.reason}")
    add("dynamo_recompile_shapes", [r for r in stats.recompiles if r.guard_class == "size"],
        lambda r: f"recompiled {r.function}: {r.guard}")
    add("dynamo_recompile_values", [r for r in stats.recompiles if r.guard_class == "value"],
        lambda r: f"recompiled {r.function}: {r.guard}")
    return out


def compile_events_frame(stats: CompileStats | None, run_id: str, workload: str) -> pd.DataFrame:
    """Rows of the ``compile_events`` table: one per distinct graph break (``count``: times dynamo hit it,
    ``step``: the first) and one per recompile (``guard_class``, ``step``); empty when nothing was compiled."""
    rows = []
    for b in stats.graph_breaks if stats else []:
        rows.append({"run_id": run_id, "workload": workload, "event": "graph_break", "file": b.file, "line": b.line,
                     "function": None, "reason": b.reason, "guard_class": None, "count": b.count,
                     "step": b.first_step})
    for r in stats.recompiles if stats else []:
        rows.append({"run_id": run_id, "workload": workload, "event": "recompile", "file": r.file, "line": r.line,
                     "function": r.function, "reason": r.guard, "guard_class": r.guard_class, "count": 1,
                     "step": r.step})
    return pd.DataFrame(rows, columns=columns("compile_events"))
