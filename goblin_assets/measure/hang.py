"""A hung run in the report: where each thread waited, the kind of wait, and the rules that read it.

The local runner stops a run that made no progress after dumping every
thread's stack (:mod:`goblin_assets.runners.stall`) and records
``RUN_DIR/hang.json`` (:class:`goblin_assets.runners.stacks.HangState`).
:func:`read_hang_state` reads it back for a failed run; :func:`hang_signals`
names the wait kinds as signals (``signals.hang_collective`` ...; rules of
``kb/rocm_rules.yaml`` read them); :func:`hang_section` is the report's
"Where it waited" section.  A hung run has no throughput: nothing here
reports one.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from goblin_assets.runners.stacks import HANG_NAME, HangState, wait_text

#: The wait kinds as signals rules read (``signals.<id>``: threads that waited so).
HANG_SIGNALS: dict[str, str] = {
    "hang_collective": "threads of a hung run waiting in a torch.distributed collective",
    "hang_loader_queue": "threads of a hung run waiting on a DataLoader worker queue",
    "hang_lock": "threads of a hung run waiting on a lock, condition, event or barrier",
    "hang_queue": "threads of a hung run waiting on a queue",
    "hang_io": "threads of a hung run waiting in I/O",
}
_KIND_SIGNAL = {"collective": "hang_collective", "DataLoader worker queue": "hang_loader_queue", "lock": "hang_lock",
                "queue": "hang_queue", "I/O": "hang_io"}


def read_hang_state(run_dir: str | Path | None) -> HangState | None:
    """The run's :class:`HangState` (None: the run did not hang, or its record is unreadable)."""
    if not run_dir:
        return None
    path = Path(run_dir) / HANG_NAME
    try:
        return HangState.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError):
        return None


def hang_signals(state: HangState) -> dict[str, int]:
    """``signals.<id>`` counts of a hung run (every id of :data:`HANG_SIGNALS`, 0 when no thread waited so)."""
    out = dict.fromkeys(HANG_SIGNALS, 0)
    for p in state.processes:
        for t in p.threads:
            if t.wait in _KIND_SIGNAL:
                out[_KIND_SIGNAL[t.wait]] += 1
    return out


def linked_rules(state: HangState, rules: list) -> list:
    """The KB rules whose detect conditions read a hang signal this run has (``signals.hang_collective > 0``)."""
    fired = {k for k, n in hang_signals(state).items() if n}
    return [r for r in rules if any(f"signals.{k}" in cond for cond in r.detect for k in fired)]


def hang_section(state: HangState, rules: list) -> list[str]:
    """Markdown lines: what stopped the run, a table of the waiting threads, the linked rules with citations."""
    if state.stopped_by == "stall":
        how = (f"No optimizer step finished in {state.since_last_step_s or 0:.1f} s after step {state.steps_done} "
               f"(the watch stops a run after {state.stall_factor:g} x the median step time of "
               f"{state.median_step_s or 0:.3f} s, and at least {state.stall_min_s:g} s).")
    else:
        how = (f"The run reached its wall-clock limit of {state.timeout_s:.0f} s after {state.steps_done} optimizer "
               "steps.")
    lines = ["## Where it waited", "", f"{how} Before stopping it, Goblin dumped the Python stack of every thread "
             f"of {len(state.processes)} process(es) (faulthandler). No throughput is reported for a run that hung.",
             ""]
    waits = state.waits()
    if waits:
        lines += ["| process | thread | wait | line | innermost frame |", "|---|---|---|---|---|"]
        for p, t in waits:
            code = f" `{t.user_code}`" if t.user_code else ""
            lines.append(f"| {p.role} {p.pid} | {'main' if t.main else t.thread_id} | {t.wait} | "
                         f"{t.user_line or '-'}{code} | {t.wait_detail or (t.frames[0] if t.frames else '-')} |")
        lines.append("")
        main = state.main_thread()
        if main is not None:
            lines += [f"The training process's main thread {wait_text(main)}.", ""]
    else:
        lines += ["No process answered the dump signal (it had not started the harness yet, or had exited).", ""]
    linked = linked_rules(state, rules)
    if linked:
        lines += ["Rules of the knowledge base about this kind of wait:", ""]
        lines += [f"- `{r.id}` ({r.kind}): {r.expected_impact.strip()} Source: [{r.citation.title}]"
                  f"({r.citation.url})" for r in linked]
        lines.append("")
    return lines
