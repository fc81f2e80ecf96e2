"""Levers that something else pulls back: calls and assignments in the user's script that set a field again.

Editing ``gradient_checkpointing=False`` in ``TrainingArguments`` changes
nothing when the script also calls ``model.gradient_checkpointing_enable()``
or peft's ``prepare_model_for_kbit_training(model)`` (whose
``use_gradient_checkpointing`` defaults to True): the call wins.  Before a
field is written, the patch looks for such calls (this table, as data); when
one sets the field back to another value, the rule is dropped with the call
and its line named (never a patch that changes nothing).

The same places explain a live audit's disagreements (issue 27): when the run
used a value the file's parsed line does not state, :func:`setting_call` finds
the statement of the script that sets that value at run time (an assignment
``args.batch_size = 8`` or ``cfg["lr"] = 0.01``, a call such as
``torch.set_num_threads(2)`` or ``model.gradient_checkpointing_enable()``).
A literal there can be rewritten in place by the patch writer
(:attr:`Setting.span`); a call that pulls a lever has no value to rewrite.

Sources: transformers ``PreTrainedModel.gradient_checkpointing_enable``;
peft ``prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
...)`` (peft/utils/other.py).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from goblin_assets.config.mapping import Raw, map_by_name
from goblin_assets.config.python_resolve import dotted
from goblin_assets.contracts import CONFIG_FIELDS


@dataclass(frozen=True)
class Override:
    """A call that sets ``field`` to ``value`` whatever the config says, unless ``keyword`` is passed as ``unless``."""

    field: str
    callee: str          # regex over the dotted callee
    value: Any
    keyword: str | None = None
    unless: Any = None


#: The known calls that pull a lever back (field -> calls).
OVERRIDES: tuple[Override, ...] = (
    Override("gradient_checkpointing", r"(^|\.)gradient_checkpointing_enable$", True),
    Override("gradient_checkpointing", r"(^|\.)gradient_checkpointing_disable$", False),
    Override("gradient_checkpointing", r"(^|\.)prepare_model_for_kbit_training$", True,
             keyword="use_gradient_checkpointing", unless=False),
    # peft's name for the same helper before 0.4 (same use_gradient_checkpointing=True default)
    Override("gradient_checkpointing", r"(^|\.)prepare_model_for_int8_training$", True,
             keyword="use_gradient_checkpointing", unless=False),
)


def _passes(call: ast.Call, keyword: str, value: Any) -> bool:
    kw = next((k for k in call.keywords if k.arg == keyword), None)
    if kw is None:
        return False
    try:
        return ast.literal_eval(kw.value) == value
    except ValueError:
        return False  # a variable: it may be anything, so the call may still win


def overriding_call(tree: ast.AST | None, field: str, value: Any) -> str | None:
    """The first call in ``tree`` that sets ``field`` back to a value other than ``value``, described; else None.

    ``tree``: the parsed Python script (None for other formats: nothing to find).
    """
    if tree is None:
        return None
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for o in OVERRIDES:
        if o.field != field or o.value == value:
            continue
        for call in calls:
            name = dotted(call.func)
            if re.search(o.callee, name) and not (o.keyword and _passes(call, o.keyword, o.unless)):
                return f"{name}(...) at line {call.lineno} sets {field} back to {o.value!r}"
    return None


#: Calls that set a field to the value of their first argument (field, callee regex, converter).
SETTING_CALLS: tuple[tuple[str, str, str], ...] = (
    ("intra_op_threads", r"(^|\.)set_num_threads$", "int"),
)


@dataclass(frozen=True)
class Setting:
    """A statement of a script that sets ``field`` to ``value`` at run time.

    ``text`` is the statement as written, ``line`` its line; ``span``
    (1-based lines, 0-based columns) is the literal that states the value
    when the patch writer can rewrite it in place (None for a call that
    pulls a lever: nothing there holds the value); ``conv`` the converter
    that reads that literal.
    """

    field: str
    value: Any
    line: int
    text: str
    span: tuple[int, int, int, int] | None = None
    conv: str = ""


def _target_key(node: ast.AST) -> str | None:
    """``args.batch_size`` -> ``args.batch_size``; ``cfg["lr"]`` -> ``cfg.lr``; ``lr`` -> ``lr``; else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        base = dotted(node.value)
        return f"{base}.{node.slice.value}" if base else node.slice.value
    if isinstance(node, (ast.Attribute, ast.Name)):
        return dotted(node) or None
    return None


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return False, None


def settings(tree: ast.AST | None, name: str = "") -> list[Setting]:
    """Every statement of ``tree`` that sets a ConfigDict field at run time, in source order.

    Assignments of a literal to a name, attribute or string subscript whose
    last part is one of the field's generic names (``fields.PY_NAMES``,
    read by the same converters as the parser), the calls of
    :data:`SETTING_CALLS` with a literal argument, and the calls of
    :data:`OVERRIDES` (no span: a call, not a value).  ``name``: the file's
    name, for the converters' provenance.  Empty for None.
    """
    if tree is None:
        return []
    out: list[Setting] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            ok, value = _literal(node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            keys = [k for k in map(_target_key, targets) if k]
            if not ok or not keys:
                continue
            raws = {k: Raw(value, name, node.lineno, _span(node.value)) for k in keys}
            for f in map_by_name(raws, "").found:
                out.append(Setting(f.field, f.value, node.lineno, ast.unparse(node), _span(node.value), f.conv))
        elif isinstance(node, ast.Call):
            callee = dotted(node.func)
            for fld, pattern, conv in SETTING_CALLS:
                if re.search(pattern, callee) and node.args:
                    ok, value = _literal(node.args[0])
                    if ok:
                        out.append(Setting(fld, value, node.lineno, ast.unparse(node), _span(node.args[0]), conv))
            for o in OVERRIDES:
                if re.search(o.callee, callee) and not (o.keyword and _passes(node, o.keyword, o.unless)):
                    out.append(Setting(o.field, o.value, node.lineno, ast.unparse(node)))
    return sorted(out, key=lambda x: x.line)


def setting_call(tree: ast.AST | None, field: str, same: Callable[[Any], bool], name: str = "") -> Setting | None:
    """The last statement of ``tree`` that sets ``field`` to a value ``same`` accepts (:func:`settings`); else None.

    ``same(value)``: whether a stated value is the one looked for (the run's
    observed value, compared as the audit compares them).  None also when
    ``tree`` is None (not a parsed Python script).
    """
    hits = [x for x in settings(tree, name) if x.field == field and x.field in CONFIG_FIELDS and same(x.value)]
    return hits[-1] if hits else None
