"""Fit and score `goblin kb search` on real symptom phrasings (issue and forum-thread titles).

``tests/data/symptoms_train.yaml`` is what search was tuned on: this script
chooses the fusion weight there (best mean reciprocal rank over a 0.05 grid;
Bruch et al. 2023's convex combination) and fits the Platt sigmoid of the fused
score on every (phrasing, rule) pair (label: the rule answers the phrasing),
then prints the constants to keep in ``goblin_assets/kb/retrieval.py``
(``FUSION_LEXICAL_WEIGHT``, ``PLATT_A``, ``PLATT_B``).

``--saturation`` also compares lexical mappings by leave-one-phrasing-out
log loss of the calibrated relevance on the training phrasings: the raw BM25
saturated as ``raw / (raw + K)`` for several K, and BM25 divided by the
query's own bound ``sum(idf * (k1 + 1))``.

``--heldout`` also scores ``tests/data/symptoms_heldout.yaml`` with the
constants *in the module* (never fitted on it): recall@5, MRR, and how often
the top hit of a report no rule answers is flagged a weak match.

    .venv/bin/python benchmarks/kb_search_fit.py [--saturation] [--heldout] [--misses]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import yaml

from goblin_assets.kb import retrieval as R
from goblin_assets.kb.rules import load_kb

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def ranks(scores: np.ndarray, ids: list[str], rows: list[dict]) -> list[int | None]:
    """Best rank (1-based) of an answering rule per row; None for rows no rule answers."""
    out: list[int | None] = []
    for s, r in zip(scores, rows):
        if not r["rules"]:
            out.append(None)
            continue
        order = list(np.argsort(-s, kind="stable"))
        out.append(min(order.index(ids.index(x)) + 1 for x in r["rules"]))
    return out


def summary(name: str, scores: np.ndarray, ids: list[str], rows: list[dict], misses: bool = False) -> None:
    """Print recall@1/@5 and MRR of the rows some rule answers; with ``misses``, each miss at 5."""
    rk = [k for k in ranks(scores, ids, rows) if k is not None]
    if not rk:
        return
    print(f"{name:44s} N={len(rk):3d}  recall@1 {np.mean([k <= 1 for k in rk]):.3f}  "
          f"recall@5 {np.mean([k <= 5 for k in rk]):.3f}  MRR {np.mean([1 / k for k in rk]):.3f}")
    if misses:
        for s, r, k in zip(scores, rows, ranks(scores, ids, rows)):
            if k is not None and k > 5:
                top = [ids[j] for j in np.argsort(-s, kind="stable")[:3]]
                print(f"    miss (rank {k}): {r['text'][:70]!r} -> {top}")


def calibration(name: str, fused: np.ndarray, ids: list[str], rows: list[dict]) -> None:
    """Print the top hit's relevance and weak-match flag for answered and unanswered rows, and the Brier score."""
    rel = R.relevance(fused)
    top = rel.max(axis=1)
    ans = np.array([bool(r["rules"]) for r in rows])
    correct = np.array([bool(r["rules"]) and ids[int(np.argmax(f))] in r["rules"] for f, r in zip(fused, rows)])
    labels = np.array([[rid in r["rules"] for rid in ids] for r in rows])
    brier = float(np.mean((rel - labels) ** 2))
    weak = top < R.WEAK_MATCH_BELOW
    print(f"{name}: Brier {brier:.4f} over {labels.size} pairs; top hit correct {correct.sum()}/{ans.sum()} "
          f"(mean relevance {top[correct].mean() if correct.any() else float('nan'):.2f}, weak {weak[correct].sum()}); "
          f"top hit wrong {(ans & ~correct).sum()} (mean {top[ans & ~correct].mean() if (ans & ~correct).any() else float('nan'):.2f}, "
          f"weak {weak[ans & ~correct].sum()}); unanswered {(~ans).sum()} (mean {top[~ans].mean() if (~ans).any() else float('nan'):.2f}, "
          f"weak {weak[~ans].sum()})")


def best_weight(dense: np.ndarray, lex: np.ndarray, ids: list[str], rows: list[dict]) -> float:
    """The fusion weight (0.05 grid) with the best MRR on ``rows``; ties: better recall@5, then nearer 0.5."""
    def key(w: float) -> tuple[float, float, float]:
        rk = [k for k in ranks(R.fuse(dense, lex, w), ids, rows) if k is not None]
        return float(np.mean([1 / k for k in rk])), float(np.mean([k <= 5 for k in rk])), -abs(w - 0.5)
    return max((round(w, 2) for w in np.arange(0.0, 1.0001, 0.05)), key=key)


def loo_log_loss(dense: np.ndarray, lex: np.ndarray, ids: list[str], rows: list[dict]) -> float:
    """Leave-one-phrasing-out log loss of the relevance for one lexical mapping.

    The fusion weight is chosen once on all ``rows`` (:func:`best_weight`: a
    discrete choice refitted per fold only adds noise); the Platt sigmoid is
    refitted without the phrasing left out, which is then scored.
    """
    labels = np.array([[rid in r["rules"] for rid in ids] for r in rows])
    w = best_weight(dense, lex, ids, rows)
    fused = R.fuse(dense, lex, w)
    losses = []
    for i in range(len(rows)):
        keep = np.arange(len(rows)) != i
        a, b = R.fit_platt(fused[keep].ravel(), labels[keep].ravel())
        p = np.clip(R.relevance(fused[i], a, b), 1e-9, 1 - 1e-9)
        losses.append(-np.mean(labels[i] * np.log(p) + (1 - labels[i]) * np.log(1 - p)))
    return float(np.mean(losses))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--saturation", action="store_true", help="compare lexical mappings by leave-one-out log loss")
    ap.add_argument("--heldout", action="store_true", help="also score the held-out third (module constants)")
    ap.add_argument("--misses", action="store_true", help="list every phrasing whose answer is not in the top 5")
    args = ap.parse_args(argv)
    kb = load_kb()
    ids = [r.id for r in kb.rules]
    phrases = R.load_phrases(kb)
    index = R.index_for(kb)
    pv = R.phrase_index_for(kb, phrases)
    train = yaml.safe_load((DATA / "symptoms_train.yaml").read_text())
    dense, lex = R.hybrid_scores(kb, index, [r["text"] for r in train], phrases, pv)

    print("training phrasings (tests/data/symptoms_train.yaml)")
    summary("dense (rule text + phrases, max)", dense, ids, train)
    summary("BM25 (rule text + phrases)", lex, ids, train)
    if args.saturation:
        lex_idx = R.lexical_index(kb, phrases)
        raw = np.stack([lex_idx.scores(r["text"])[0] for r in train])
        bound = np.array([sum(lex_idx.idf(t) * (lex_idx.k1 + 1) for t in set(R.lexical_terms(r["text"]))) or 1.0
                          for r in train])
        print(f"lexical mapping, leave-one-phrasing-out log loss: bound-normalised "
              f"{loo_log_loss(dense, raw / bound[:, None], ids, train):.4f}; " + ", ".join(
                  f"K={k:g} {loo_log_loss(dense, raw / (raw + k), ids, train):.4f}" for k in (4, 8, 12, 16, 24, 32)))
    best_w = best_weight(dense, lex, ids, train)
    fused_best = R.fuse(dense, lex, best_w)
    labels = np.array([[rid in r["rules"] for rid in ids] for r in train])
    a, b = R.fit_platt(fused_best.ravel(), labels.ravel())
    print(f"fitted: FUSION_LEXICAL_WEIGHT = {best_w}, PLATT_A = {a:.3f}, PLATT_B = {b:.3f}")
    print(f"module: FUSION_LEXICAL_WEIGHT = {R.FUSION_LEXICAL_WEIGHT}, PLATT_A = {R.PLATT_A}, PLATT_B = {R.PLATT_B}")
    fused = R.fuse(dense, lex)
    summary("hybrid (module constants)", fused, ids, train, misses=args.misses)
    calibration("training calibration (module constants)", fused, ids, train)

    if args.heldout:
        held = yaml.safe_load((DATA / "symptoms_heldout.yaml").read_text())
        hd, hl = R.hybrid_scores(kb, index, [r["text"] for r in held], phrases, pv)
        print("\nheld-out phrasings (tests/data/symptoms_heldout.yaml; nothing fitted on them)")
        summary("dense (rule text + phrases, max)", hd, ids, held)
        summary("BM25 (rule text + phrases)", hl, ids, held)
        hf = R.fuse(hd, hl)
        summary("hybrid (module constants)", hf, ids, held, misses=args.misses)
        calibration("held-out calibration", hf, ids, held)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
