"""Predictions that learn from history: each rule's measured/predicted record scales the next prediction.

The waste-budget model (patch/changeset.py) predicts a speedup range and a
confidence for a patch.  Once the warehouse holds measured audits of a rule,
its record says how far the model's predictions for it have been from what
the benchmark then measured.  :func:`calibrate` scales a new patch's
predicted range and confidence by the records of the rules it applies (the
seed design's ``historical_calibration`` term).  It is pure: the caller reads
the rows (:data:`HISTORY_SQL` on the ``audits`` table) and passes them in;
nothing here opens the warehouse.

Per rule ``r`` with ``n`` measured audits (each audit that applied ``r``,
with measured speedup ``m`` and the model's predicted range ``[lo, hi]``):

* ``measured_over_predicted`` = mean of ``m / ((lo + hi) / 2)``, and
  ``within_range`` = share of audits with ``lo <= m <= hi``: the columns
  ``measured_over_predicted_mid`` and ``within_predicted_range`` of the SQL
  model ``marts/speedup_calibration.sql``, which computes them the same way
  (an audit that applied several rules counts in each rule's record);
* credibility ``Z = n / (n + K)`` with ``K`` = :data:`CREDIBILITY_K`:
  Buhlmann's credibility weight (Buhlmann & Gisler, "A Course in
  Credibility Theory and its Applications", Springer 2005, ch. 3): a record
  of few audits moves the prediction a little, a long one almost fully;
* the rule's scale ``1 + Z (measured_over_predicted - 1)`` and confidence
  factor ``1 - Z + Z within_range``.

A patch's scale and confidence factor are the means of its applied rules'
values weighted by their predicted recovery (``AppliedRule.predicted_recovery``;
a rule with fewer than :data:`MIN_AUDITS` audits contributes 1, the model
unchanged).  The calibrated range is the model's range times the scale; the
calibrated confidence is the model's confidence times the factor.

Unlike the SQL model, an audit whose numbers repeat another's exactly (same
workload, rules, measured and predicted speedups: a benchmark replayed from
the cache) counts once: a replay is the same measurement, not new evidence.
The audits table rows must hold the *model's* prediction
(``predicted_speedup_low/high``), never a calibrated one, or the record would
measure the calibration against itself.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd
from pydantic import BaseModel, Field

from goblin_assets.contracts import Patch

#: The ``audits`` columns a history needs, in the order :data:`HISTORY_SQL` selects them.
HISTORY_COLUMNS: tuple[str, ...] = ("audit_id", "workload", "rules", "measured_speedup", "predicted_speedup_low",
                                    "predicted_speedup_high")

#: What the caller runs on the warehouse to get the history rows (the measured audits that applied a rule).
HISTORY_SQL = (f"SELECT {', '.join(HISTORY_COLUMNS)} FROM audits "
               "WHERE measured_speedup IS NOT NULL AND rules <> '' ORDER BY created_at")

#: Audits a rule's record needs before it scales a prediction ("a few measured audits", issue 15).
MIN_AUDITS = 2

#: Buhlmann's ``K``: the number of audits at which the record and the model weigh the same (``Z = 1/2``).
#: 3: a record of 2 audits moves a prediction 40 % of the way, one of 12 audits 80 %.
CREDIBILITY_K = 3.0


class RuleRecord(BaseModel):
    """One rule's measured/predicted record (see the module docstring for every formula).

    ``audits``: distinct measured audits that applied the rule;
    ``measured_over_predicted``: mean measured / predicted-mid speedup;
    ``within_range``: share whose measured speedup lay in the predicted range
    (0..1); ``credibility``: ``Z`` (0..1); ``scale``, ``confidence_factor``:
    what the rule contributes.
    """

    rule_id: str
    audits: int
    measured_over_predicted: float
    within_range: float
    credibility: float
    scale: float
    confidence_factor: float


class Calibration(BaseModel):
    """A patch's prediction before (``model_*``) and after its rules' records scaled it.

    Speedups are throughput ratios; confidences 0..1.  ``records``: the
    applied rules that have a record of at least :data:`MIN_AUDITS` audits
    (empty: nothing was scaled, ``low``/``high``/``confidence`` equal the
    model's); ``audits``: distinct audits behind those records;
    ``rules``: the patch's applied rules.
    """

    model_low: float
    model_high: float
    model_confidence: float
    low: float
    high: float
    confidence: float
    scale: float = 1.0
    confidence_factor: float = 1.0
    audits: int = 0
    records: list[RuleRecord] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)

    @property
    def applied(self) -> bool:
        """True when at least one rule's record scaled the prediction."""
        return bool(self.records)

    def note(self) -> str:
        """One sentence for the report: what scaled the prediction and how many audits it came from."""
        if not self.rules:
            return "No rule applied: no prediction to scale."
        if not self.records:
            return ("No rule of this patch has a record of measured audits yet (at least "
                    f"{MIN_AUDITS} are needed): the prediction is the waste-budget model's alone.")
        per = "; ".join(
            f"{r.rule_id}: {r.audits} audits, measured/predicted {r.measured_over_predicted:.2f}, "
            f"{r.within_range:.0%} within the predicted range, weight {r.credibility:.2f}" for r in self.records)
        return (f"Scaled by the record of {self.audits} measured audit{'s' if self.audits != 1 else ''} "
                f"({per}): range ×{self.scale:.2f}, confidence ×{self.confidence_factor:.2f}. The waste-budget "
                f"model alone predicted {self.model_low:.2f}x–{self.model_high:.2f}x, confidence "
                f"{self.model_confidence:.2f}.")


def _history_frame(history: pd.DataFrame | Iterable[Mapping] | None) -> pd.DataFrame:
    """The usable, de-duplicated history rows (module docstring), one per measured audit."""
    df = history if isinstance(history, pd.DataFrame) or history is None else pd.DataFrame(list(history))
    if df is None or df.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    missing = [c for c in HISTORY_COLUMNS if c not in df.columns and c not in ("audit_id", "workload")]
    if missing:
        raise ValueError(f"calibration history: missing column(s) {', '.join(missing)} "
                         f"(select {', '.join(HISTORY_COLUMNS)} from audits)")
    df = df.assign(**{c: df[c] if c in df.columns else "" for c in ("audit_id", "workload")})
    num = {c: pd.to_numeric(df[c], errors="coerce")
           for c in ("measured_speedup", "predicted_speedup_low", "predicted_speedup_high")}
    df = df.assign(**num, rules=df["rules"].fillna("").astype(str))
    ok = ((df["measured_speedup"] > 0) & (df["predicted_speedup_low"] > 0)
          & (df["predicted_speedup_high"] >= df["predicted_speedup_low"]) & (df["rules"].str.strip() != ""))
    return df[ok].drop_duplicates(subset=["workload", "rules", "measured_speedup", "predicted_speedup_low",
                                          "predicted_speedup_high"]).reset_index(drop=True)


def rule_records(history: pd.DataFrame | Iterable[Mapping] | None) -> dict[str, RuleRecord]:
    """Every rule's record in ``history`` (rows of :data:`HISTORY_COLUMNS`), by rule id.

    Rows without a measured speedup or a predicted range, and exact repeats,
    are left out (module docstring).  Rules with fewer than
    :data:`MIN_AUDITS` audits are included (``credibility`` is computed the
    same way); :func:`calibrate` ignores them.

    Raises
    ------
    ValueError
        ``history`` lacks ``rules`` or a speedup column.
    """
    df = _history_frame(history)
    if df.empty:
        return {}
    mid = (df["predicted_speedup_low"] + df["predicted_speedup_high"]) / 2
    df = df.assign(ratio=df["measured_speedup"] / mid,
                   within=((df["measured_speedup"] >= df["predicted_speedup_low"])
                           & (df["measured_speedup"] <= df["predicted_speedup_high"])).astype(float),
                   rule_id=df["rules"].str.split(","))
    df = df.explode("rule_id").assign(rule_id=lambda d: d["rule_id"].str.strip())
    out = {}
    for rid, g in df[df["rule_id"] != ""].groupby("rule_id", sort=True):
        n = len(g)
        z = n / (n + CREDIBILITY_K)
        ratio, within = float(g["ratio"].mean()), float(g["within"].mean())
        out[rid] = RuleRecord(rule_id=rid, audits=n, measured_over_predicted=ratio, within_range=within,
                              credibility=z, scale=1.0 + z * (ratio - 1.0), confidence_factor=1.0 - z + z * within)
    return out


def calibrate(patch: Patch, history: pd.DataFrame | Iterable[Mapping] | None) -> Calibration:
    """``patch``'s predicted range and confidence scaled by its applied rules' records (pure).

    Parameters
    ----------
    patch : Patch
        The model's prediction: ``expected_speedup_low/high``, ``confidence``
        and the applied rules with their ``predicted_recovery`` (weights).
    history : DataFrame, iterable of mappings, or None
        Rows of the warehouse's ``audits`` table (:data:`HISTORY_SQL`), read
        by the caller; None or empty: no history.

    Returns
    -------
    Calibration
        Equal to the model's prediction when no applied rule has
        :data:`MIN_AUDITS` audits; otherwise scaled as the module docstring says.

    Raises
    ------
    ValueError
        ``history`` lacks a needed column.
    """
    base = Calibration(model_low=patch.expected_speedup_low, model_high=patch.expected_speedup_high,
                       model_confidence=patch.confidence, low=patch.expected_speedup_low,
                       high=patch.expected_speedup_high, confidence=patch.confidence,
                       rules=[a.rule_id for a in patch.applied])
    if not patch.applied or history is None:
        return base
    records = rule_records(history)
    used = [records[a.rule_id] for a in patch.applied
            if a.rule_id in records and records[a.rule_id].audits >= MIN_AUDITS]
    if not used:
        return base
    total = sum(max(a.predicted_recovery, 0.0) for a in patch.applied)
    weights = {a.rule_id: (max(a.predicted_recovery, 0.0) / total if total > 0 else 1.0 / len(patch.applied))
               for a in patch.applied}
    rec = {r.rule_id: r for r in used}
    scale = sum(w * (rec[rid].scale if rid in rec else 1.0) for rid, w in weights.items())
    factor = sum(w * (rec[rid].confidence_factor if rid in rec else 1.0) for rid, w in weights.items())
    df = _history_frame(history)
    ids = set(rec)
    audits = int(df["rules"].map(lambda s: bool(ids & {x.strip() for x in s.split(",")})).sum())
    return base.model_copy(update={
        "low": patch.expected_speedup_low * scale, "high": patch.expected_speedup_high * scale,
        "confidence": min(1.0, max(0.0, patch.confidence * factor)), "scale": scale, "confidence_factor": factor,
        "audits": audits, "records": used})
