"""propose_patch: apply fired rules to the config and to the user's own file.

Deterministic, no LLM.  Each fired rule's ``fix.config`` assignments are
evaluated (``"=expr"`` values over ``cores`` and the config) and applied in
order of predicted uplift; a later rule that assigns a field an earlier rule
already set to a different value is dropped (rule_consistency falls), and the
patch says which rule won and why.

The file edit rewrites exactly the source span the parser recorded for the
value (provenance ``span``), so comments and formatting around it stay; a
field with no value in the file gets an insertion the field knows how to make
(``torch.set_num_threads`` after the imports for ``intra_op_threads``).  The
diff is a unified diff with ``a/``/``b/`` prefixes relative to the workload
folder: ``git apply`` and ``patch -p1`` accept it there.

Uplift (DESIGN.md): per rule ``recovery_fraction x T_bucket / T_total``, capped
per bucket at the bucket's share; predicted speedup ``1 / (1 - recoverable)``
with low = half the recovery, high = all of it; confidence =
``evidence_coverage x rule_consistency``.
"""
from __future__ import annotations

import difflib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from goblin_assets.audit.kb import KnowledgeBase, eval_fix_value
from goblin_assets.audit.waste import evidence_coverage, shares
from goblin_assets.contracts import AppliedRule, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.errors import PatchError


def _render(value: Any, fmt: str, original: str = "") -> str:
    """Source text of ``value`` in the file's language, keeping the original quote style."""
    if fmt == "python":
        if isinstance(value, str):
            q = "'" if original.startswith("'") else '"'
            return q + value.replace("\\", "\\\\").replace(q, "\\" + q) + q
        return repr(value)
    if fmt == "json":
        return json.dumps(value)
    if fmt == "yaml":
        return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    return str(value)


def _offset(lines: list[str], line: int, col: int) -> int:
    return sum(len(s) for s in lines[: line - 1]) + col


_IMPORT = re.compile(r"^(import |from \S+ import )")


def _insert_python(text: str, field: str, value: Any) -> str:
    """Insert a statement that sets ``field`` in a Python script that never sets it."""
    if field != "intra_op_threads":
        raise PatchError(f"no insertion known for field {field!r} in a Python script")
    lines = text.splitlines(keepends=True)
    if not any(re.match(r"^import torch\b", ln) for ln in lines):
        raise PatchError("script does not `import torch` at module level; cannot place torch.set_num_threads")
    last = max(i for i, ln in enumerate(lines) if _IMPORT.match(ln))
    stmt = (f"torch.set_num_threads({int(value)})  # goblin: main-process intra-op threads, "
            "sized together with the data-loader workers\n")
    lines.insert(last + 1, "\n" + stmt)
    return "".join(lines)


def _same_file(recorded: str | None, path: Path) -> bool:
    """Whether a provenance ``file`` (absolute, or relative to the parsed file's folder) is ``path``."""
    if not recorded:
        return False
    rec = Path(recorded)
    return rec.resolve() == path.resolve() if rec.is_absolute() else (path.parent / rec).resolve() == path.resolve()


def edit_source(config: ConfigDict, changes: dict[str, Any], source: Path | None = None) -> str:
    """The user's file (``source``, default ``config.source_file``) with ``changes`` applied.

    Raises
    ------
    PatchError
        A field has no recorded span and no known insertion for this format.
    """
    path = Path(source or config.source_file)
    text = path.read_text(encoding="utf-8")
    fmt = {".py": "python", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(path.suffix.lower(), "text")
    # Apply span replacements from the end of the file backwards so earlier spans stay valid.
    spans = []
    inserts = []
    for fld, val in changes.items():
        prov = config.provenance.get(fld)
        if prov is not None and prov.span is not None and _same_file(prov.file, path):
            spans.append((tuple(prov.span), fld, val))
        else:
            inserts.append((fld, val))
    for span, fld, val in sorted(spans, reverse=True):
        lines = text.splitlines(keepends=True)
        a, b = _offset(lines, span[0], span[1]), _offset(lines, span[2], span[3])
        text = text[:a] + _render(val, fmt, text[a:b]) + text[b:]
    for fld, val in inserts:
        if fmt != "python":
            raise PatchError(f"{path}: {fld} is not written in the file and no insertion is known for {fmt}")
        text = _insert_python(text, fld, val)
    return text


def unified_diff(original: str, patched: str, relpath: str) -> str:
    """A ``git apply``/``patch -p1`` compatible unified diff of one file."""
    return "".join(difflib.unified_diff(
        original.splitlines(keepends=True), patched.splitlines(keepends=True),
        fromfile=f"a/{relpath}", tofile=f"b/{relpath}"))


def propose_patch(config: ConfigDict, kb: KnowledgeBase, matches: list[RuleMatch], metrics: RunMetrics,
                  cores: int, workload_root: Path | None = None, out_dir: Path | None = None,
                  source: Path | None = None) -> Patch:
    """Apply the fired rules' transforms; return the Patch with its diff and predicted uplift.

    ``source``: the parsed file (default ``config.source_file``, which the parser
    may store relative or redacted).  ``out_dir``: when given, a copy of the workload folder with the patched
    file is written there (``Patch.patched_file``) so the patched run can use it
    without touching the user's folder.

    Raises
    ------
    PatchError
        The file cannot be edited for any fired rule (nothing to benchmark).
    """
    src = Path(source or config.source_file)
    sh = shares(metrics.waste_budget)
    fired = [kb.by_id[m.rule_id] for m in matches if m.fired and m.rule_id in kb.by_id]
    fired.sort(key=lambda r: -(r.recovery_fraction * sh.get(r.targets_bucket, 0.0)))
    values = config.values()
    changes: dict[str, Any] = {}
    owner: dict[str, str] = {}
    env: dict[str, str] = {}
    unset_env: list[str] = []
    applied: list[AppliedRule] = []
    dropped: list[str] = []
    for rule in fired:
        names = {"cores": cores, **values, **changes}
        try:
            proposal: dict[str, Any] = {}
            for fld, raw in rule.fix.config.items():
                proposal[fld] = eval_fix_value(raw, {**names, **proposal})
        except Exception as exc:  # KBError: an unknown name; the rule cannot apply here
            dropped.append(f"{rule.id}: transform not applicable ({exc})")
            continue
        clash = [f for f, v in proposal.items() if f in changes and changes[f] != v]
        if clash:
            dropped.append(f"{rule.id}: conflicts with {owner[clash[0]]} on {clash[0]} "
                           f"({proposal[clash[0]]!r} vs {changes[clash[0]]!r}); "
                           f"{owner[clash[0]]} wins with the larger predicted uplift")
            continue
        proposal = {f: v for f, v in proposal.items() if values.get(f) != v}
        if not proposal and not rule.fix.env and not rule.fix.unset_env:
            dropped.append(f"{rule.id}: the config already has the values this rule sets")
            continue
        try:
            edit_source(config, {**changes, **proposal}, src)
        except PatchError as exc:
            dropped.append(f"{rule.id}: cannot edit the file ({exc})")
            continue
        changes.update(proposal)
        owner.update({f: rule.id for f in proposal})
        env.update(rule.fix.env)
        unset_env.extend(v for v in rule.fix.unset_env if v not in unset_env)
        applied.append(AppliedRule(
            rule_id=rule.id, category=rule.category, targets_bucket=rule.targets_bucket,
            citation=rule.citation, rationale=rule.expected_impact.strip(),
            changes={**{f: {"from": values.get(f), "to": v} for f, v in proposal.items()},
                     **{f"env.{k}": {"to": v} for k, v in rule.fix.env.items()},
                     **{f"env.{k}": {"to": None} for k in rule.fix.unset_env}},
        ))
    original = src.read_text(encoding="utf-8")
    patched = edit_source(config, changes, src) if changes else original
    root = workload_root or src.parent
    rel = src.resolve().relative_to(root.resolve()).as_posix()
    diff = unified_diff(original, patched, rel)
    # uplift, capped per bucket
    per_bucket: dict[str, float] = {}
    for a in applied:
        r = kb.by_id[a.rule_id]
        per_bucket[r.targets_bucket] = per_bucket.get(r.targets_bucket, 0.0) + r.recovery_fraction * sh.get(
            r.targets_bucket, 0.0)
    recoverable = min(0.95, sum(min(v, sh.get(b, 0.0)) for b, v in per_bucket.items()))
    consistency = len(applied) / (len(applied) + len([d for d in dropped if "conflicts" in d])) if applied else 1.0
    coverage = evidence_coverage(metrics.waste_budget)
    patch = Patch(
        new_config={**values, **changes}, diff=diff, target_file=str(src), applied=applied, dropped=dropped,
        env=env, unset_env=unset_env, expected_speedup_low=1.0 / (1.0 - recoverable / 2), expected_speedup_high=1.0 / (1.0 - recoverable),
        confidence=coverage * consistency, evidence_coverage=coverage, rule_consistency=consistency,
    )
    if out_dir is not None:
        copy = Path(out_dir) / "workload"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        (copy / rel).write_text(patched, encoding="utf-8")
        patch.patched_file = str(copy / rel)
    return patch
