"""torch.compile's own record of a run: graphs, graph breaks, recompiles and compile time (child side).

Standard library and torch only: runs inside the user's interpreter, loaded
by the harness from its file path.  Nothing happens unless the script imports
``torch._dynamo`` (``torch.compile`` does on its first call): the harness
calls :meth:`CompileProbe.attach` right after that import (a post-import
hook), so an eager script never pays dynamo's import.

What is recorded, all from dynamo itself:

- ``torch._dynamo.utils.counters`` at the end of the run: ``stats``
  (``unique_graphs``: graphs compiled, recompiles included;
  ``calls_captured``), ``frames`` (``total``/``ok``), ``graph_break``
  (reason -> occurrences) and ``recompiles`` where the release has it;
- the ``graph_breaks`` and ``recompiles`` log artifacts (the records
  ``TORCH_LOGS=graph_breaks,recompiles`` prints: "Graph break in user code at
  FILE:LINE / Graph Break Reason: ..." and "Recompiling function F in
  FILE:LINE triggered by the following guard failure(s): ..."; PyTorch,
  "torch.compile troubleshooting",
  https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html),
  caught by a handler of our own on those two loggers, with
  ``propagate=False`` unless the user asked for them in ``TORCH_LOGS``, so the
  script's stderr is unchanged;
- compile time: ``torch._dynamo.callback`` start/end callbacks
  (``callback_handler.register_start_callback``), on the harness's
  monotonic clock, with the optimizer step each compile started in.

:meth:`CompileProbe.summary` is the ``dynamo`` object of ``result.json``
(read by :mod:`goblin_assets.measure.compile_counters`).
"""
from __future__ import annotations

import logging
import os
import re
import time

#: The dynamo log artifacts read (``torch._logging`` artifact names).
ARTIFACTS = ("graph_breaks", "recompiles")
#: The most log records kept per artifact (a run that recompiles every step stays bounded).
MAX_RECORDS = 200

_BREAK_AT = re.compile(r"in user code at (.+):(\d+)")
_RECOMPILE = re.compile(r"Recompiling function (\S+) in (.+):(\d+)")


class _Collect(logging.Handler):
    def __init__(self, probe: CompileProbe):
        super().__init__(logging.DEBUG)
        self.probe = probe

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.probe.on_record(record.name, record.getMessage())
        except Exception:  # noqa: BLE001 - a record we cannot read is not the script's failure
            pass


class CompileProbe:
    """Collects dynamo's records of one run; ``step`` is a callable giving the harness's optimizer step now."""

    def __init__(self, step=lambda: 0):
        self.step = step
        self.attached = False
        self.breaks: list[dict] = []
        self.recompiles: list[dict] = []
        self.compiles: list[dict] = []
        self._t0: float | None = None
        self.t_start = time.monotonic()
        self.error = ""

    def attach(self, dynamo) -> None:
        """Hook ``torch._dynamo`` (the module, just imported): log handlers and compile callbacks."""
        try:
            import torch._logging._internal as internal

            user_logs = os.environ.get("TORCH_LOGS", "")
            handler = _Collect(self)
            for name in ARTIFACTS:
                for qname in list(internal.log_registry.artifact_log_qnames):
                    if qname.endswith(f".__{name}"):
                        log = logging.getLogger(qname)
                        log.addHandler(handler)
                        log.setLevel(logging.DEBUG)
                        if name not in user_logs:
                            log.propagate = False  # the script's stderr stays as it was
                internal.log_state.enable_artifact(name)
            cb = dynamo.callback.callback_handler
            cb.register_start_callback(self._start)
            cb.register_end_callback(self._end)
            self.attached = True
        except Exception as err:  # noqa: BLE001 - another release's internals: say so, never fail the run
            self.error = f"{type(err).__name__}: {err}"[:300]

    def _start(self, *args) -> None:
        self._t0 = time.monotonic()

    def _end(self, *args) -> None:
        if self._t0 is not None:
            graphs = None
            try:
                from torch._dynamo.utils import counters

                graphs = int(counters["stats"]["unique_graphs"])  # cumulative: graphs compiled so far
            except Exception:  # noqa: BLE001 - another release's counters
                pass
            self.compiles.append({"step": self.step() + 1, "seconds": time.monotonic() - self._t0,
                                  "graphs_so_far": graphs})
            self._t0 = None

    def on_record(self, logger: str, msg: str) -> None:
        """One record of the ``graph_breaks`` or ``recompiles`` artifact."""
        if logger.endswith("__graph_breaks") and len(self.breaks) < MAX_RECORDS:
            m = _BREAK_AT.search(msg)
            reason = msg.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in msg else msg
            lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
            # the dynamo message's first line is the generic "Encountered graph break when attempting to trace
            # CALL"; the next one names what was unsupported
            short = next((ln for ln in lines if not ln.startswith("Encountered graph break")), lines[0] if lines
                         else "")
            self.breaks.append({"file": m.group(1) if m else None, "line": int(m.group(2)) if m else None,
                                "reason": short[:300], "detail": "\n".join(lines[:6])[:1200],
                                "step": self.step() + 1})
        elif logger.endswith("__recompiles") and len(self.recompiles) < MAX_RECORDS:
            m = _RECOMPILE.search(msg)
            guards = [ln.strip()[2:].strip() for ln in msg.splitlines() if ln.strip().startswith("- ")
                      and not ln.strip().startswith(("- User stack", "-   "))]
            self.recompiles.append({"function": m.group(1) if m else None, "file": m.group(2) if m else None,
                                    "line": int(m.group(3)) if m else None,
                                    "guard": (guards[0] if guards else msg.splitlines()[-1].strip())[:400],
                                    "step": self.step() + 1})

    def summary(self) -> dict | None:
        """The ``dynamo`` object of ``result.json`` (None when nothing was compiled)."""
        if not self.attached and not self.error:
            return None
        counters: dict = {}
        try:
            from torch._dynamo.utils import counters as c

            counters = {k: {str(kk): int(vv) for kk, vv in v.items()} for k, v in c.items()
                        if k in ("stats", "frames", "graph_break", "recompiles", "unimplemented")}
        except Exception as err:  # noqa: BLE001
            self.error = self.error or f"{type(err).__name__}: {err}"[:300]
        if not self.compiles and not counters.get("frames", {}).get("total") and not self.error:
            return None  # dynamo imported (torch.optim does) but nothing compiled
        return {"counters": counters, "graph_breaks": self.breaks, "recompiles": self.recompiles,
                "compiles": self.compiles, "run_s": time.monotonic() - self.t_start,
                "compile_s": sum(c["seconds"] for c in self.compiles), "error": self.error}
