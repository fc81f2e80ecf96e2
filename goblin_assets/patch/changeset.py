"""Step 1 of patching: resolve the fired rules into one change-set, as data (no file I/O).

:func:`resolve_changes` takes the rules that fired on a run and decides, rule
by rule in order of predicted uplift (highest first, ties by rule id), what
each one contributes:

* ``excluded``: the caller named it in ``exclude`` (a later step found that
  the file cannot carry it, or that the patched program fails with it);
* ``not_applicable``: its ``fix.config`` expression cannot be evaluated here
  (``kb.eval_fix_value``: an unknown or null name);
* ``superseded``: a ``config.*`` detect condition that held on the original
  config no longer holds after a higher-uplift rule's change (a TF32 rule
  for fp32 once another rule switched the run to bf16);
* ``conflict``: it sets a field or environment variable an earlier rule set
  to something else; the earlier rule wins with the larger predicted uplift;
* ``satisfied``: the config already has every value it sets;
* ``applied``: its changes join the set.

The result, a :class:`ChangeSet`, is field -> value, the companion edits the
values need (``fields.PY_VALUE_NEEDS``), env / unset_env, one
:class:`RuleDecision` per fired rule and the uplift numbers.  It also keeps
what it was resolved from (the fired rules, the config values, the cores and
the waste-budget shares), so :meth:`ChangeSet.without` can re-resolve it
without some rules: writing it into the file (``patch.write_changes``) and
validating the patched program do that.

Uplift (DESIGN.md): per rule ``recovery_fraction x T_bucket / T_total``.
Rules on the same bucket are combined as ``1 - prod(1 - recovery_fraction)``
of that bucket (each saves its fraction of what the others leave), so the
recovery never exceeds the bucket's share; predicted speedup
``1 / (1 - recoverable)`` with low = half the recovery, high = all of it.
``rule_consistency`` = (combined / naively summed recovery) x (applied rules
/ applied + conflicting rules); confidence = ``evidence_coverage x
rule_consistency``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from goblin_assets.config import fields as F
from goblin_assets.contracts import AppliedRule, ConfigDict, KeywordEdit, Rule, RuleMatch, RunMetrics
from goblin_assets.errors import KBError
from goblin_assets.kb.rules import WARNED_FIX, KnowledgeBase, check_condition, eval_fix_value, fix_assignments
from goblin_assets.measure.invariants import warned_values
from goblin_assets.measure.waste import evidence_coverage, shares

#: Largest share of a step the model predicts can be recovered (speedup <= 20x).
MAX_RECOVERABLE = 0.95

Outcome = Literal["applied", "excluded", "blocked", "not_applicable", "superseded", "conflict", "satisfied"]


class RuleDecision(BaseModel):
    """What resolution did with one fired rule.

    ``uplift`` is the rule's own predicted recovery, ``recovery_fraction x
    T_bucket / T_total`` (share of the step, 0..1).  ``reason`` is the text
    ``Patch.dropped`` shows after ``"<rule_id>: "`` (empty when applied).
    For a conflict or a superseded rule, ``winner`` is the applied rule that
    won and ``on`` the field (or ``env.VAR``) they meet on; ``condition`` is
    the detect condition a superseded rule lost.  ``applied`` carries the
    changes (``{field: {"from", "to"}}``, ``env.VAR: {"to"}``) when applied.
    """

    rule_id: str
    outcome: Outcome
    uplift: float
    reason: str = ""
    winner: str | None = None
    on: str | None = None
    condition: str | None = None
    applied: AppliedRule | None = None

    @property
    def line(self) -> str:
        """The ``Patch.dropped`` line: ``"<rule_id>: <reason>"``."""
        return f"{self.rule_id}: {self.reason}"

    @property
    def fields(self) -> dict[str, Any]:
        """Config field -> new value this rule writes (empty unless applied; env excluded)."""
        if self.applied is None:
            return {}
        return {f: c["to"] for f, c in self.applied.changes.items() if not f.startswith(("env.", "keyword."))}


class CompanionEdit(BaseModel):
    """Code a value needs besides its own key (``fields.PY_VALUE_NEEDS``).

    E.g. ``padding="dynamic"`` needs a collator that pads each batch:
    ``template`` (``"DataCollatorWithPadding({tokenizer})"``) is passed as the
    first of ``consumers`` (``(callee regex, keyword)``) the script calls,
    with ``import_line``; a keyword already built by one of ``met_by`` is
    kept.  Only the Python writer states companions.
    """

    field: str
    value: Any
    consumers: list[tuple[str, str]]
    template: str
    import_line: str
    met_by: list[str]


def companions_for(changes: Mapping[str, Any]) -> list[CompanionEdit]:
    """The companion edits ``changes`` need, in the order of their fields."""
    out = []
    for fld, value in changes.items():
        need = F.PY_VALUE_NEEDS.get((fld, value))
        if need is not None:
            consumers, template, import_line, met_by = need
            out.append(CompanionEdit(field=fld, value=value, consumers=list(consumers), template=template,
                                     import_line=import_line, met_by=list(met_by)))
    return out


class ChangeSet(BaseModel):
    """The resolved change of one config: what to write, and why each fired rule is in or out.

    Inputs (kept so :meth:`without` can re-resolve): ``rules``, the fired
    rules in uplift order; ``values``, the parsed config; ``cores``;
    ``shares``, each waste bucket's share of the step (0..1);
    ``evidence_coverage`` (0..1); ``excluded``, rule id -> reason; ``warned``,
    field -> the value a warning of the run names (``warned_<field>`` in fix
    expressions).

    Result: ``changes`` (field -> new value, in the order rules set them),
    ``owner`` (field or ``env.VAR`` -> the rule that set it), ``companions``,
    ``env`` / ``unset_env``, ``decisions`` (one per fired rule, uplift
    order), ``recoverable`` (combined share of the step, capped at
    :data:`MAX_RECOVERABLE`), ``rule_consistency`` and ``consistency_notes``.
    """

    rules: list[Rule]
    hazards: list[Rule] = Field(default_factory=list)
    values: dict[str, Any]
    cores: int
    shares: dict[str, float]
    evidence_coverage: float
    excluded: dict[str, str] = Field(default_factory=dict)
    #: values the run's warnings name per field (measure/invariants.py ``warned_values``): ``warned_<field>``
    warned: dict[str, Any] = Field(default_factory=dict)
    decisions: list[RuleDecision] = Field(default_factory=list)
    changes: dict[str, Any] = Field(default_factory=dict)
    owner: dict[str, str] = Field(default_factory=dict)
    companions: list[CompanionEdit] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    recoverable: float = 0.0
    rule_consistency: float = 1.0
    consistency_notes: list[str] = Field(default_factory=list)

    @computed_field
    @property
    def confidence(self) -> float:
        """``evidence_coverage x rule_consistency`` (0..1)."""
        return self.evidence_coverage * self.rule_consistency

    @computed_field
    @property
    def expected_speedup_low(self) -> float:
        """``1 / (1 - recoverable / 2)``: half the predicted recovery (throughput ratio)."""
        return 1.0 / (1.0 - self.recoverable / 2)

    @computed_field
    @property
    def expected_speedup_high(self) -> float:
        """``1 / (1 - recoverable)``: all of it (throughput ratio)."""
        return 1.0 / (1.0 - self.recoverable)

    @computed_field
    @property
    def dropped(self) -> list[str]:
        """``"<rule_id>: <reason>"`` per fired rule not applied, in uplift order."""
        return [d.line for d in self.decisions if d.outcome != "applied"]

    @property
    def applied(self) -> list[AppliedRule]:
        """The applied rules, in uplift order."""
        return [d.applied for d in self.decisions if d.applied is not None]

    def keyword_edits(self, decisions: list[RuleDecision] | None = None) -> list[KeywordEdit]:
        """The companion keyword edits of the applied rules (or of ``decisions``), in uplift order."""
        ds = self.outcomes("applied") if decisions is None else decisions
        return [k for d in ds for k in _rule(self, d.rule_id).fix.keywords]

    def outcomes(self, outcome: Outcome) -> list[RuleDecision]:
        """The decisions with one outcome (``"conflict"``, ``"superseded"``, ``"satisfied"`` ...)."""
        return [d for d in self.decisions if d.outcome == outcome]

    @property
    def new_config(self) -> dict[str, Any]:
        """The config values with the changes applied."""
        return {**self.values, **self.changes}

    def without(self, exclude: Mapping[str, str]) -> ChangeSet:
        """This set re-resolved with ``exclude`` (rule id -> reason) added to its exclusions."""
        return _resolve(self.model_copy(update={"excluded": {**self.excluded, **exclude}}))


def resolve_changes(config: ConfigDict, kb: KnowledgeBase, matches: list[RuleMatch], metrics: RunMetrics,
                    cores: int, exclude: Mapping[str, str] | None = None) -> ChangeSet:
    """Resolve the fired rules into one :class:`ChangeSet` (pure: reads no file).

    Parameters
    ----------
    config : ConfigDict
        The parsed config; its values are the ``from`` side of each change
        and names in fix expressions.
    kb : KnowledgeBase
        The rules; a match whose rule id the KB lacks is ignored.
    matches : list of RuleMatch
        The rules checked on this run; only ``fired`` ones are resolved.
    metrics : RunMetrics
        The profiled run: its waste budget gives each bucket's share of the
        step (``T_bucket / T_total``) and the evidence coverage.
    cores : int
        CPU cores of the job (the ``cores`` name in fix expressions and
        detect conditions).
    exclude : mapping, optional
        Rule id -> reason.  Each excluded fired rule is left out with that
        reason (``ChangeSet.dropped`` shows ``"<rule_id>: <reason>"`` at the
        rule's place in uplift order), and the rules after it are resolved
        as if it had not fired.  Ids of rules that did not fire are ignored.

    Returns
    -------
    ChangeSet
        See the module docstring for the outcomes and the uplift formulas.
        ``AppliedRule.predicted_recovery`` and ``RuleDecision.uplift`` are
        shares of the step time (0..1); speedups are throughput ratios.

    Raises
    ------
    Nothing: a fix expression that cannot be evaluated makes its rule
    ``not_applicable`` instead of raising.
    """
    sh = shares(metrics.waste_budget)
    fired = [kb.by_id[m.rule_id] for m in matches if m.fired and m.rule_id in kb.by_id]
    hazards = [r for r in fired if r.kind == "hazard"]
    # a warning changes nothing; a hazard's own fix (a correctness fix) goes first, then tuning by uplift
    fired = [r for r in fired if r.kind != "warning" and (r.kind == "tuning" or _has_fix(r))]
    fired.sort(key=lambda r: (r.kind != "hazard", -_uplift_of(r, sh), r.id))
    return _resolve(ChangeSet(rules=fired, hazards=hazards, values=config.values(), cores=cores, shares=sh,
                              warned=warned_values(metrics.invariants),
                              evidence_coverage=evidence_coverage(metrics.waste_budget), excluded=dict(exclude or {})))


def _has_fix(rule: Rule) -> bool:
    fix = rule.fix
    return bool(fix.config or fix.env or fix.unset_env or fix.keywords)


def _blocker(cs: ChangeSet, rule: Rule) -> str | None:
    """Why a fired hazard forbids ``rule`` (None when none does): it names the rule or a field the rule changes."""
    for h in cs.hazards:
        if h.id == rule.id:
            continue
        hit = rule.id in h.blocks or any(f"config.{f}" in h.blocks for f in rule.fix.config)
        if hit:
            first = " ".join(h.symptom.split()).split(". ")[0].rstrip(".")
            return (f"blocked by hazard {h.id}: {first} ({h.citation.title}, {h.citation.url}); "
                    "Goblin proposes no change into that path")
    return None


def _uplift_of(rule: Rule, sh: dict[str, float]) -> float:
    return rule.recovery_fraction * sh.get(rule.targets_bucket, 0.0)


def _resolve(cs: ChangeSet) -> ChangeSet:
    """Fill ``cs``'s result fields from its inputs (a fresh copy; ``cs`` is not changed)."""
    out = cs.model_copy(update={"decisions": [], "changes": {}, "owner": {}, "env": {}, "unset_env": []})
    for rule in out.rules:
        out.decisions.append(_decide(out, rule))
    conflicted = len(out.outcomes("conflict")) + len(out.outcomes("superseded"))
    out.recoverable, out.rule_consistency, out.consistency_notes = _combine(out, conflicted)
    out.companions = companions_for(out.changes)
    return out


def _decide(cs: ChangeSet, rule: Rule) -> RuleDecision:
    """One rule's outcome given the rules before it (``cs`` holds their changes; updated when applied)."""
    up = _uplift_of(rule, cs.shares)

    def drop(outcome: Outcome, reason: str, **kw: Any) -> RuleDecision:
        return RuleDecision(rule_id=rule.id, outcome=outcome, uplift=up, reason=reason, **kw)

    def beaten(winner: str) -> str:
        return (f"{winner} wins with the larger predicted uplift "
                f"({_uplift_of(_rule(cs, winner), cs.shares):.1%} vs {up:.1%} of the step)")

    if rule.id in cs.excluded:
        return drop("excluded", cs.excluded[rule.id])
    blocked = _blocker(cs, rule)
    if blocked is not None:
        return drop("blocked", blocked)
    values, changes = cs.values, cs.changes
    try:
        proposal: dict[str, Any] = {}
        for fld, raw in fix_assignments(rule.fix.config, cs.warned):
            proposal[fld] = eval_fix_value(raw, {"cores": cs.cores, **{f"warned_{k}": v for k, v in cs.warned.items()},
                                                 **values, **changes, **proposal})
        if WARNED_FIX in rule.fix.config and not proposal:
            raise KBError("no warning of the run names a value for a field the patch writes")
    except Exception as exc:  # KBError: an unknown name; the rule cannot apply here
        return drop("not_applicable", f"transform not applicable ({exc})")
    gone = _superseded(rule, values, changes, cs.cores)
    if gone is not None:
        cond, fld = gone
        winner = cs.owner[fld]
        return drop("superseded", f"superseded by {winner}: after its change ({fld} {values.get(fld)!r} -> "
                    f"{changes[fld]!r}) `{cond}` no longer holds; {beaten(winner)}",
                    winner=winner, on=fld, condition=cond)
    clash = _clash(cs, rule, proposal)
    if clash is not None:
        what, mine, theirs = clash
        winner = cs.owner[what]
        return drop("conflict", f"conflicts with {winner} on {what} ({mine!r} vs {theirs!r}); {beaten(winner)}",
                    winner=winner, on=what)
    proposal = {f: v for f, v in proposal.items() if values.get(f) != v}
    if not proposal and not rule.fix.env and not rule.fix.unset_env and not rule.fix.keywords:
        return drop("satisfied", "the config already has the values this rule sets")
    changes.update(proposal)
    cs.owner.update({f: rule.id for f in proposal})
    cs.owner.update({f"env.{k}": rule.id for k in [*rule.fix.env, *rule.fix.unset_env]})
    cs.env.update(rule.fix.env)
    cs.unset_env.extend(v for v in rule.fix.unset_env if v not in cs.unset_env)
    return RuleDecision(rule_id=rule.id, outcome="applied", uplift=up, applied=AppliedRule(
        rule_id=rule.id, category=rule.category, targets_bucket=rule.targets_bucket,
        citation=rule.citation, rationale=rule.expected_impact.strip(), predicted_recovery=up,
        changes={**{f: {"from": values.get(f), "to": v} for f, v in proposal.items()},
                 **{f"env.{k}": {"to": v} for k, v in rule.fix.env.items()},
                 **{f"env.{k}": {"to": None} for k in rule.fix.unset_env},
                 **{f"keyword.{k.names[0]}": {"to": k.value} for k in rule.fix.keywords}},
    ))


def _rule(cs: ChangeSet, rule_id: str) -> Rule:
    return next(r for r in cs.rules if r.id == rule_id)


def _clash(cs: ChangeSet, rule: Rule, proposal: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first field or ``env.VAR`` where ``rule`` disagrees with the set so far: (what, mine, theirs)."""
    changes, env = cs.changes, cs.env
    clash = [f for f, v in proposal.items() if f in changes and changes[f] != v]
    clash += [f"env.{k}" for k, v in rule.fix.env.items() if (k in env and env[k] != v) or k in cs.unset_env]
    clash += [f"env.{k}" for k in rule.fix.unset_env if k in env]
    if not clash:
        return None
    what = clash[0]
    if what.startswith("env."):
        var = what[4:]
        return what, rule.fix.env.get(var, "unset"), env.get(var, "unset")
    return what, proposal[what], changes[what]


def _superseded(rule: Rule, values: dict[str, Any], changes: dict[str, Any], cores: int) -> tuple[str, str] | None:
    """A ``config.*`` condition of ``rule`` that held on the original config but not after ``changes``.

    E.g. a TF32-for-fp32 rule once a higher-uplift rule has switched the run
    to bf16.  Returns ``(condition, field)`` or None.
    """
    if not changes:
        return None
    ctx = {"config": {**values, **changes}, "cores": cores}
    for cond in rule.detect:
        path = cond.split()[0] if cond.split() else ""
        fld = path.removeprefix("config.")
        if not path.startswith("config.") or fld not in changes:
            continue
        holds, why = check_condition(cond, ctx)
        if not holds and "not available" not in why:
            return cond, fld
    return None


def _combine(cs: ChangeSet, conflicted: int) -> tuple[float, float, list[str]]:
    """(recoverable share of the step, rule_consistency, notes on rules sharing a bucket)."""
    by_bucket: dict[str, list[Rule]] = {}
    for a in cs.applied:
        r = _rule(cs, a.rule_id)
        by_bucket.setdefault(r.targets_bucket, []).append(r)
    combined = naive = 0.0
    notes = []
    for bucket, rules in by_bucket.items():
        share = cs.shares.get(bucket, 0.0)
        keep = 1.0
        for r in rules:
            keep *= 1.0 - r.recovery_fraction
        frac = 1.0 - keep
        combined += frac * share
        naive += min(1.0, sum(r.recovery_fraction for r in rules)) * share
        if len(rules) > 1:
            ids = " and ".join(r.id for r in rules)
            terms = "".join(f"(1 - {r.recovery_fraction:g})" for r in rules)
            notes.append(
                f"{ids} both target `{bucket}` ({share:.0%} of the step): their savings overlap, so they are "
                f"combined as 1 - {terms} = {frac:.2f} of the bucket, not the sum "
                f"{min(1.0, sum(r.recovery_fraction for r in rules)):.2f}")
    overlap = combined / naive if naive > 0 else 1.0
    applied = len(cs.applied)
    agree = applied / (applied + conflicted) if applied else 1.0
    if conflicted:
        notes.append(f"{conflicted} fired rule(s) conflicted with an applied one and were dropped "
                     f"(consistency x{agree:.2f})")
    return min(MAX_RECOVERABLE, combined), overlap * agree, notes
