"""Levers that something else pulls back: calls in the user's script that set a field again after the config.

Editing ``gradient_checkpointing=False`` in ``TrainingArguments`` changes
nothing when the script also calls ``model.gradient_checkpointing_enable()``
or peft's ``prepare_model_for_kbit_training(model)`` (whose
``use_gradient_checkpointing`` defaults to True): the call wins.  Before a
field is written, the patch looks for such calls (this table, as data); when
one sets the field back to another value, the rule is dropped with the call
and its line named (never a patch that changes nothing).

Sources: transformers ``PreTrainedModel.gradient_checkpointing_enable``;
peft ``prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
...)`` (peft/utils/other.py).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from goblin_assets.config.python_resolve import dotted


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
