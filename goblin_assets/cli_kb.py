"""The ``goblin kb`` commands: search and check the knowledge base.

    goblin kb search "symptom text" [--top-k 5] [--json] [--kb PATH] [--phrases PATH]
    goblin kb check [--kb PATH] [--phrases PATH]

``search`` ranks rules by a fusion of semantic similarity (all-MiniLM-L6-v2
over each rule's symptom, fix and the phrases users write for it) and BM25
over the same words, and gives each hit a calibrated relevance in ``[0, 1]``
with a ``weak match`` flag (goblin_assets/kb/retrieval.py).  Retrieval
only proposes: whether a rule fires on a run is decided by its ``detect``
conditions during an audit.  The rule and phrase embeddings are cached in the
warehouse table ``kb_embeddings`` per KB version; a cold search imports
neither sentence-transformers nor transformers.  ``check`` validates the KB
file and the phrases file (every id a rule of the KB) and prints the rule
count per category; a bad file exits with code 2 and the KBError message,
which names the rule and the field.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.table import Table

from goblin_assets.cli_common import console, out
from goblin_assets.contracts import Rule
from goblin_assets.errors import KBError

if TYPE_CHECKING:
    from goblin_assets.kb.retrieval import Hit, KBIndex, PhraseIndex
    from goblin_assets.kb.rules import KnowledgeBase


def rule_json(rule: Rule, score: float | None = None, hit: Hit | None = None) -> dict[str, Any]:
    """One rule as ``kb search --json`` prints it; ``fix`` is the transform as written in the KB.

    With a search ``hit``: ``score`` (dense cosine, ``[-1, 1]``), ``lexical``
    (BM25 saturated into ``[0, 1)``), ``relevance`` (the
    calibrated probability that the rule answers the query, ``[0, 1]``) and
    ``weak_match`` (relevance below
    :data:`~goblin_assets.kb.retrieval.WEAK_MATCH_BELOW`).
    """
    doc: dict[str, Any] = {"id": rule.id}
    if hit is not None:
        score = hit.score
    if score is not None:
        doc["score"] = round(score, 4)
    if hit is not None:
        doc.update({"lexical": round(hit.lexical, 4), "relevance": round(hit.relevance, 4),
                    "weak_match": hit.weak_match})
    doc.update({
        "category": rule.category,
        "platforms": list(rule.platforms),
        "symptom": rule.symptom,
        "detect": list(rule.detect),
        "fix": {k: v for k, v in rule.fix.model_dump().items() if v},
        "targets_bucket": rule.targets_bucket,
        "recovery_fraction": rule.recovery_fraction,
        "expected_impact": rule.expected_impact,
        "rocm_version_min": rule.rocm_version_min,
        "torch_version_min": rule.torch_version_min,
        "citation": rule.citation.model_dump(),
    })
    return doc


def _fix_summary(rule: Rule) -> str:
    parts = [f"{k} = {v[1:] if isinstance(v, str) and v.startswith('=') else v}" for k, v in rule.fix.config.items()]
    parts += [f"${k}={v}" for k, v in rule.fix.env.items()]
    parts += [f"unset ${k}" for k in rule.fix.unset_env]
    return "\n".join(parts)


def _error(cmd: str, exc: Exception) -> int:
    console.print(f"goblin kb {cmd}: error: {exc}", style="bold red", highlight=False, markup=False)
    return 2


def _is_default_kb(kb: "KnowledgeBase") -> bool:
    from goblin_assets.kb.rules import DEFAULT_KB

    return str(kb.path) == str(DEFAULT_KB)


def search_phrases(kb: "KnowledgeBase", path: str | None = None) -> dict[str, list[str]]:
    """The phrases search uses with ``kb``: ``path`` (or the packaged ``kb/phrases.yaml``), checked against ``kb``.

    With a KB of your own and the packaged phrases, phrases of rules it does
    not have are dropped (they belong to the packaged rules); a phrases file
    given explicitly must name only rules of ``kb``.

    Raises
    ------
    KBError
        The phrases file is invalid, or an explicit one names a rule ``kb`` lacks.
    """
    from goblin_assets.kb.retrieval import load_phrases

    if path or _is_default_kb(kb):
        return load_phrases(kb, path)
    return {k: v for k, v in load_phrases().items() if k in kb.by_id}


def cached_search_indexes(kb: "KnowledgeBase",
                          phrases: dict[str, list[str]]) -> tuple["KBIndex", "PhraseIndex"]:
    """The rule and phrase embeddings of ``kb``: read from the warehouse's ``kb_embeddings``, else encoded and written.

    One read of the rows of this KB version (rule vectors under
    ``MODEL_NAME``, phrase vectors under ``phrase_model(phrases)``); whatever
    was missing is encoded now and written back.  A warehouse that cannot be
    read or written right now (another process holds DuckDB's write lock)
    only costs the encoding.
    """
    from goblin_assets.errors import WarehouseError
    from goblin_assets.kb.retrieval import (
        MODEL_NAME,
        embedding_frame,
        index_for,
        phrase_frame,
        phrase_index_for,
        phrase_model,
    )
    from goblin_assets.warehouse.db import query, write

    try:
        cached = query("SELECT * FROM kb_embeddings WHERE kb_sha256 = ? AND model IN (?, ?)",
                       params=[kb.sha256, MODEL_NAME, phrase_model(phrases)])
    except WarehouseError:  # e.g. another process holds the write lock: encode instead
        cached = None
    idx = index_for(kb, cached)
    pidx = phrase_index_for(kb, phrases, cached)
    new = ([embedding_frame(kb, idx)] if not idx.from_cache else []) + \
          ([phrase_frame(pidx)] if not pidx.from_cache and len(pidx.rule_ids) else [])
    if new:
        import pandas as pd

        try:
            write({"kb_embeddings": pd.concat(new, ignore_index=True)})
        except WarehouseError as exc:
            console.print(f"[dim]embedding cache not written: {exc}[/dim]", highlight=False)
    return idx, pidx


def cmd_kb_search(args: argparse.Namespace) -> int:
    """``goblin kb search``: the rules that best answer a symptom, best first, with a calibrated relevance.

    Exit 2 on a bad KB or phrases file.
    """
    from goblin_assets.kb.retrieval import WEAK_MATCH_BELOW, search
    from goblin_assets.kb.rules import load_kb

    try:
        kb = load_kb(args.kb)
        phrases = search_phrases(kb, getattr(args, "phrases", None))
        index, phrase_vectors = cached_search_indexes(kb, phrases)
        hits = search(args.symptom, top_k=args.top_k, kb=kb, index=index, phrases=phrases,
                      phrase_vectors=phrase_vectors)
    except KBError as exc:
        return _error("search", exc)
    if args.json:
        sys.stdout.write(json.dumps([rule_json(h.rule, hit=h) for h in hits], indent=2) + "\n")
        return 0
    t = Table(title=f"goblin kb search: {args.symptom!r}", show_lines=True)
    for col in ("#", "relevance", "rule", "platforms", "fix"):
        t.add_column(col, overflow="fold")
    for i, h in enumerate(hits, 1):
        rel = f"{h.relevance:.2f}" + ("\n[dim]weak match[/dim]" if h.weak_match else "")
        t.add_row(str(i), rel, h.rule.id, ", ".join(h.rule.platforms), _fix_summary(h.rule))
    out.print(t)
    for i, h in enumerate(hits, 1):
        out.print(f"[bold]{i}. {h.rule.id}[/bold] ({h.rule.category}): {h.rule.symptom}", highlight=False)
        out.print(f"   [dim]source: {h.rule.citation.title}, § {h.rule.citation.section} <{h.rule.citation.url}>[/dim]",
                  highlight=False)
    if hits and all(h.weak_match for h in hits):
        out.print(f"[yellow]only weak matches[/yellow]: no rule reaches a relevance of {WEAK_MATCH_BELOW:.1f}; "
                  "the knowledge base may have no rule for this symptom", highlight=False)
    out.print("[dim]relevance: calibrated probability that the rule answers the symptom (dense + BM25, Platt-scaled); "
              "retrieval proposes, an audit fires a rule only when its detect conditions hold[/dim]")
    return 0


def cmd_kb_check(args: argparse.Namespace) -> int:
    """``goblin kb check``: validate the KB and its phrases file, print the rule count per category (exit 2 on errors).

    The phrases file (``--phrases``, default the packaged ``kb/phrases.yaml``)
    must name only rules of the KB; with a KB of your own and the packaged
    phrases, the phrases of rules it lacks are reported, not an error.
    """
    from goblin_assets.kb.retrieval import load_phrases
    from goblin_assets.kb.rules import load_kb

    phrases_arg = getattr(args, "phrases", None)
    try:
        kb = load_kb(args.kb)
        strict = bool(phrases_arg) or _is_default_kb(kb)
        phrases = load_phrases(kb if strict else None, phrases_arg)
    except KBError as exc:
        return _error("check", exc)
    per_cat = Counter(r.category for r in kb.rules)
    per_platform = {c: Counter(p for r in kb.rules if r.category == c for p in r.platforms) for c in per_cat}
    t = Table(title=f"{kb.path} ({len(kb.rules)} rules, sha256 {kb.sha256[:12]})")
    t.add_column("category")
    t.add_column("rules", justify="right")
    t.add_column("rocm / cuda / cpu", justify="right")
    t.add_column("with phrases", justify="right")
    for cat, n in sorted(per_cat.items()):
        pp = per_platform[cat]
        with_ph = sum(1 for r in kb.rules if r.category == cat and phrases.get(r.id))
        t.add_row(cat, str(n), f"{pp['rocm']} / {pp['cuda']} / {pp['cpu']}", str(with_ph))
    t.add_row("[bold]total[/bold]", f"[bold]{len(kb.rules)}[/bold]", "",
              str(sum(1 for r in kb.rules if phrases.get(r.id))))
    out.print(t)
    out.print("[green]ok[/green]: every rule has a valid schema, parseable detect conditions over known "
              "fields, and a citation; no rule sets a profiler or debug variable")
    mine = {k: v for k, v in phrases.items() if k in kb.by_id}
    out.print(f"[green]ok[/green]: {sum(len(v) for v in mine.values())} search phrases for {len(mine)} rules"
              + ("" if strict else f"; {len(phrases) - len(mine)} rules of the packaged phrases are not in this KB "
                                   "(ignored by search)"), highlight=False)
    return 0


def add_kb_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``kb search`` and ``kb check`` on the ``goblin`` sub-command parser.

    Each leaf sets ``fn`` (the command function), as the other ``goblin``
    commands do.
    """
    k = subparsers.add_parser("kb", help="search and check the knowledge base of cited tuning rules")
    ks = k.add_subparsers(dest="kb_cmd", required=True)
    s = ks.add_parser("search", help="rank rules by how well they answer a symptom described in words")
    s.add_argument("symptom", help='the problem in your words, e.g. "GPU sits idle between steps"')
    s.add_argument("--top-k", type=int, default=5, help="how many rules to show (default 5)")
    s.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    s.add_argument("--kb", default=None, help="KB file (default kb/rocm_rules.yaml)")
    s.add_argument("--phrases", default=None, help="search phrases per rule id (default kb/phrases.yaml)")
    s.set_defaults(fn=cmd_kb_search)
    c = ks.add_parser("check", help="validate the KB and phrases files and print the rule count per category")
    c.add_argument("--kb", default=None, help="KB file (default kb/rocm_rules.yaml)")
    c.add_argument("--phrases", default=None, help="search phrases per rule id (default kb/phrases.yaml)")
    c.set_defaults(fn=cmd_kb_check)
    return k
