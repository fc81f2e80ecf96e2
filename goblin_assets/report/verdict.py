"""The verdict: the one or two things that matter most about an audit, ranked, said first at every front door.

Every front door (the terminal summary, the report's headline, the HTML page,
the Dagster metadata, ``goblin audit --json``'s ``verdict`` object) starts with
:func:`audit_verdict`'s :class:`Verdict`.  The ranking is fixed, most urgent
first:

1. ``failed``: the original program failed as written (nothing else was
   measured, so nothing else can be judged); ``hung`` when it failed by making
   no progress (stopped by the stall watch or the timeout after its stacks
   were dumped: :mod:`goblin_assets.measure.hang`);
2. ``unhealthy``: the run went non-finite (NaN/inf in the loss, the model's
   output or its parameters): the numbers it trained on are wrong, so no
   speedup matters until that is fixed;
3. ``hazard``: a known-bad combination of versions, device and settings fired
   (a KB rule of kind ``hazard``);
4. the measured effect of the patch: ``faster``, ``slower`` (then the patch is
   *not recommended* and not offered as a fix), ``no significant change``,
   ``no patch`` (nothing to change, or nothing that could be written: nothing
   was benchmarked) or ``not measured`` (a replay: nothing ran).

A patch is offered (``patch_offered``) only when it changes the program and
was not measured slower: a measured interval entirely below 1, or a point
estimate below 1 with no decision, withdraws it (the measurement is kept).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from goblin_assets.measure.benchmark import SpeedupInterval
from goblin_assets.measure.evidence import NonfiniteEvidence

Kind = Literal["failed", "hung", "unhealthy", "hazard", "faster", "slower", "no significant change", "no patch",
               "not measured"]

#: Verdict kinds that mean the run itself is not healthy (``--fail-on unhealthy``).
UNHEALTHY = ("failed", "hung", "unhealthy")


class VerdictItem(BaseModel):
    """One finding of the verdict: its kind and the sentence a person reads."""

    kind: Kind
    text: str


class Verdict(BaseModel):
    """The ranked verdict of one audit (see the module docstring for the ranking).

    ``status`` is the first item's kind; ``healthy`` is False when the run
    failed or went non-finite; ``headline`` is the first one or two items in
    one line (the first line of every front door); ``patch_offered`` says
    whether the patch is handed over as a fix; ``not_recommended`` holds the
    reason when a measured patch is withdrawn.
    """

    status: Kind
    healthy: bool
    headline: str
    items: list[VerdictItem] = Field(default_factory=list)
    patch_offered: bool = False
    not_recommended: str = ""

    def lines(self) -> list[str]:
        """Every item as ``kind: text``, most important first."""
        return [f"{i.kind}: {i.text}" for i in self.items]


def measured_slower(iv: SpeedupInterval | None) -> bool:
    """True when the measurement says the patch slows the program down.

    Either the interval lies entirely below 1 (verdict ``slower``), or it
    did not decide and the point estimate is below 1: a patch that most
    likely costs time is never handed over as a fix.
    """
    if iv is None:
        return False
    return iv.verdict == "slower" or (iv.verdict != "faster" and iv.point < 1.0)


def _effect(iv: SpeedupInterval | None, patch_changes: bool, why_no_patch: str,
            not_measured: str, no_change_because: str = "") -> VerdictItem:
    if not patch_changes:
        return VerdictItem(kind="no patch", text=why_no_patch or "no rule asked for a change: nothing to benchmark")
    if iv is None:
        return VerdictItem(kind="not measured", text=f"the patch was not benchmarked ({not_measured or 'no runs'})")
    if measured_slower(iv):
        return VerdictItem(kind="slower", text=f"patch not recommended: measured {iv.headline()}")
    if iv.verdict == "faster":
        return VerdictItem(kind="faster", text=f"patch measured faster: {iv.headline()}")
    why = f"; {no_change_because}" if no_change_because else ""
    return VerdictItem(kind="no significant change", text=f"patch measured {iv.headline()}{why}")


def audit_verdict(*, failure: str = "", failure_class: str = "", nonfinite: NonfiniteEvidence | None = None,
                  loss_nonfinite_step: int | None = None, hazards: list | None = None,
                  interval: SpeedupInterval | None = None, patch_changes: bool = True, why_no_patch: str = "",
                  not_measured: str = "", failure_kind: Literal["failed", "hung"] = "failed",
                  no_change_because: str = "") -> Verdict:
    """The ranked verdict of an audit (pure function).

    Parameters
    ----------
    failure : str
        Why the original program failed ('' when it ran): stage and the child's error line.
    failure_class : str
        The failure's class in words (:class:`goblin_assets.measure.failure.FailureDiagnosis` ``label``, e.g.
        "out of memory"), named first in the ``failed`` item; '' when unknown.
    no_change_because : str
        Why a measured patch may change nothing, added to a ``no significant change`` item (e.g. a patch that
        turns on torch.compile: the patched run's graph breaks, recompiles and compile share).
    failure_kind : str
        ``hung`` when the failure is a run that made no progress (its item's kind), else ``failed``.
    nonfinite : NonfiniteEvidence, optional
        Where NaN/inf appeared (:func:`goblin_assets.measure.evidence.nonfinite_evidence`).
    loss_nonfinite_step : int, optional
        The harness's first training step whose loss was non-finite (the run's ``loss_nonfinite`` signal), when
        no sketch evidence located it.
    hazards : list of HazardNote
        The fired hazard and warning rules (:func:`goblin_assets.report.compare.hazard_notes`; only
        ``kind == "hazard"`` enter the verdict).
    interval : SpeedupInterval, optional
        The measured speedup's interval (None when nothing was benchmarked).
    patch_changes : bool
        Whether the patch changes the program at all (a diff or environment changes).
    why_no_patch : str
        When it does not: why (no rule fired, or the rules that fired could not be written).
    not_measured : str
        Why the benchmark did not run (a replay), for the ``not measured`` item.

    Returns
    -------
    Verdict
        Items ranked failed > unhealthy > hazard > the patch's measured effect.
    """
    items: list[VerdictItem] = []
    if failure:
        verb = "hung" if failure_kind == "hung" else "failed"
        cls = f" ({failure_class})" if failure_class and failure_kind != "hung" else ""  # "hung" says it
        items.append(VerdictItem(kind=failure_kind, text=f"the original program {verb} as written{cls}: {failure}"))
    if nonfinite is not None:
        items.append(VerdictItem(kind="unhealthy", text=nonfinite.headline or "the run went non-finite (NaN/inf)"))
    elif loss_nonfinite_step is not None:
        items.append(VerdictItem(kind="unhealthy", text=f"the loss turned non-finite (NaN/inf) at training step "
                                                        f"{loss_nonfinite_step}"))
    found = [h for h in hazards or [] if h.kind == "hazard"]
    if found:
        more = f" (and {len(found) - 1} more hazard{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        text = found[0].text if len(found[0].text) <= 160 else found[0].text[:157].rstrip() + "..."
        items.append(VerdictItem(kind="hazard", text=f"{found[0].rule_id}: {text}{more}"))
    if not failure:
        items.append(_effect(interval, patch_changes, why_no_patch, not_measured, no_change_because))
    slower = not failure and patch_changes and measured_slower(interval)
    healthy = not any(i.kind in UNHEALTHY for i in items)
    return Verdict(status=items[0].kind, healthy=healthy, items=items,
                   headline="; ".join(i.text.rstrip(".") for i in items[:2]),
                   patch_offered=not failure and patch_changes and not slower,
                   not_recommended=f"measured {interval.headline()}" if slower and interval is not None else "")
