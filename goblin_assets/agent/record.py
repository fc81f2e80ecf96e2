"""The warehouse rows of a conversation: the audits a chat ran, as ``goblin audit`` writes its audit.

A conversation runs the stages its tools ask for, at most once each, in the session and in one
what-if child session per distinct set of overrides (:meth:`AuditSession.what_if`).  Each of them
that measured something (:func:`audits_of`) is an audit of its own, with its own ``audit_id``; :func:`conversation_frames` gives the rows of every stage
each one ran and runs nothing: a conversation that stopped early (a failed tool, a model that asked
for less) records what it measured, and one that ran every stage records exactly what
:meth:`AuditSession.frames` holds.

``goblin chat`` writes :func:`conversation_frames` (its session is the conversation's own audit); the
Dagster ``audit_conversation`` asset, whose session is seeded with the partition's audit (already written
by the audit steps), writes :func:`what_if_frames`: the measured what-if children only.
"""
from __future__ import annotations

import pandas as pd

from goblin_assets.audit.session import STAGES, AuditSession
from goblin_assets.warehouse.frames import join_frames

#: The stages whose rows an audit writes, in order: every stage but ``patched_run``, whose rows are the
#: ``benchmarks`` stage's (the patched run is written with its benchmark, as AuditSession.frames does).
RECORDED: tuple[str, ...] = tuple(st for st in STAGES if st != "patched_run")
#: The results a stage's rows are built from, where they are not the stage's own result.
ROWS_FROM: dict[str, tuple[str, ...]] = {"waste_budget": ("profile_run",), "benchmarks": ("benchmarks", "patched_run")}


def audits_of(session: AuditSession) -> list[AuditSession]:
    """The conversation's audits, the session first: the session once it has a profiled run (measured, or
    replayed from a recording, as ``goblin audit`` records a replay), and each what-if child session that
    measured one.  A what-if of a replay measured nothing: its "profile" is the same recording, which
    knows nothing of the changed config, so it is not recorded."""
    kids = [v for v in session.variants.values() if not v.replay]
    return [s for s in (session, *kids) if "profile_run" in s.results]


def ran_frames(s: AuditSession) -> dict[str, pd.DataFrame]:
    """The warehouse rows of the stages ``s`` ran, by table; runs no stage (``rows`` of a finished stage only)."""
    return join_frames(s.rows(st) for st in RECORDED if all(k in s.results for k in ROWS_FROM.get(st, (st,))))


def conversation_frames(session: AuditSession) -> dict[str, pd.DataFrame]:
    """The rows of every audit of a conversation (:func:`audits_of`), by table, for one warehouse write.

    Empty when nothing was measured (the conversation stopped before the profiled run).
    """
    return join_frames(ran_frames(s) for s in audits_of(session))


def what_if_frames(session: AuditSession) -> dict[str, pd.DataFrame]:
    """The rows of the conversation's measured what-if children only (:func:`audits_of` less ``session``), by
    table, for one warehouse write: what a conversation over an audit already recorded adds to the warehouse.

    Each child's rows carry its own ``audit_id`` (and run ids derived from it).  Empty when no what-if measured
    a run (none was asked, or the workload is a replay).  Runs no stage.
    """
    return join_frames(ran_frames(s) for s in audits_of(session) if s is not session)
