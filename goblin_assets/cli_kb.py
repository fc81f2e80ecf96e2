"""The ``goblin kb`` commands: search and check the knowledge base.

    goblin kb search "symptom text" [--top-k 5] [--json] [--kb PATH]
    goblin kb check [--kb PATH]

``search`` ranks rules by semantic similarity of their symptom and fix to the
text (retrieval only proposes: whether a rule fires on a run is decided by its
``detect`` conditions during an audit).  ``check`` validates the KB file and
prints the rule count per category; a bad file exits with code 2 and the
KBError message, which names the rule and the field.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from rich.table import Table

from goblin_assets.cli_common import console, out
from goblin_assets.contracts import Rule
from goblin_assets.errors import KBError



def rule_json(rule: Rule, score: float | None = None) -> dict[str, Any]:
    """One rule as ``kb search --json`` prints it; ``fix`` is the transform as written in the KB."""
    doc: dict[str, Any] = {"id": rule.id}
    if score is not None:
        doc["score"] = round(score, 4)
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


def cmd_kb_search(args: argparse.Namespace) -> int:
    """``goblin kb search``: the rules closest to a symptom, best first (exit 2 on a bad KB)."""
    from goblin_assets.audit.kb import load_kb
    from goblin_assets.audit.retrieval import query_rocm_kb
    from goblin_assets.cli_common import cached_kb_index

    try:
        kb = load_kb(args.kb)
        hits = query_rocm_kb(args.symptom, top_k=args.top_k, kb=kb, index=cached_kb_index(kb))
    except KBError as exc:
        return _error("search", exc)
    if args.json:
        sys.stdout.write(json.dumps([rule_json(r, s) for r, s in hits], indent=2) + "\n")
        return 0
    t = Table(title=f"goblin kb search: {args.symptom!r}", show_lines=True)
    for col in ("#", "score", "rule", "platforms", "fix"):
        t.add_column(col, overflow="fold")
    for i, (r, s) in enumerate(hits, 1):
        t.add_row(str(i), f"{s:.3f}", r.id, ", ".join(r.platforms), _fix_summary(r))
    out.print(t)
    for i, (r, _) in enumerate(hits, 1):
        out.print(f"[bold]{i}. {r.id}[/bold] ({r.category}): {r.symptom}", highlight=False)
        out.print(f"   [dim]source: {r.citation.title}, § {r.citation.section} <{r.citation.url}>[/dim]",
                  highlight=False)
    out.print("[dim]retrieval proposes; an audit fires a rule only when its detect conditions hold[/dim]")
    return 0


def cmd_kb_check(args: argparse.Namespace) -> int:
    """``goblin kb check``: validate the KB and print the rule count per category (exit 2 on errors)."""
    from goblin_assets.audit.kb import load_kb

    try:
        kb = load_kb(args.kb)
    except KBError as exc:
        return _error("check", exc)
    per_cat = Counter(r.category for r in kb.rules)
    per_platform = {c: Counter(p for r in kb.rules if r.category == c for p in r.platforms) for c in per_cat}
    t = Table(title=f"{kb.path} ({len(kb.rules)} rules, sha256 {kb.sha256[:12]})")
    t.add_column("category")
    t.add_column("rules", justify="right")
    t.add_column("rocm / cuda / cpu", justify="right")
    for cat, n in sorted(per_cat.items()):
        pp = per_platform[cat]
        t.add_row(cat, str(n), f"{pp['rocm']} / {pp['cuda']} / {pp['cpu']}")
    t.add_row("[bold]total[/bold]", f"[bold]{len(kb.rules)}[/bold]", "")
    out.print(t)
    out.print("[green]ok[/green]: every rule has a valid schema, parseable detect conditions over known "
              "fields, and a citation; no rule sets a profiler or debug variable")
    return 0


def add_kb_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``kb search`` and ``kb check`` on the ``goblin`` sub-command parser.

    Each leaf sets ``fn`` (the command function), as the other ``goblin``
    commands do.
    """
    k = subparsers.add_parser("kb", help="search and check the knowledge base of cited tuning rules")
    ks = k.add_subparsers(dest="kb_cmd", required=True)
    s = ks.add_parser("search", help="rank rules by similarity to a symptom described in words")
    s.add_argument("symptom", help='the problem in your words, e.g. "GPU sits idle between steps"')
    s.add_argument("--top-k", type=int, default=5, help="how many rules to show (default 5)")
    s.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    s.add_argument("--kb", default=None, help="KB file (default kb/rocm_rules.yaml)")
    s.set_defaults(fn=cmd_kb_search)
    c = ks.add_parser("check", help="validate the KB file and print the rule count per category")
    c.add_argument("--kb", default=None, help="KB file (default kb/rocm_rules.yaml)")
    c.set_defaults(fn=cmd_kb_check)
    return k
