"""Shared machinery of ``parse_config``: raw values, candidates and converters.

Every format parser (Python, JSON, YAML, shell) turns its file into ``Raw``
values under dotted keys; :func:`map_entries` runs them through the synonym
rows of ``fields.SYNONYMS`` and returns ``Found`` candidates, which
``config.parse_config`` ranks, completes with tool defaults and turns into a
ConfigDict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from goblin_assets.config import fields as F
from goblin_assets.contracts import Provenance

Span = tuple[int, int, int, int]


@dataclass(frozen=True)
class Undetermined:
    """A value that exists in the file but cannot be known before run time.

    ``cli`` marks a value left to the command line (an argparse or dataclass
    argument without a default): it is the user's setting, not an object.
    """

    reason: str
    cli: bool = False


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: The key says nothing about the field (a false flag, an empty YAML value).
SKIP = _Marker("skip")
#: DeepSpeed "auto": the value is the trainer's.
DEFER = _Marker("defer")


@dataclass(frozen=True)
class Ratio:
    """A warmup given as a fraction of the total steps."""

    value: float


@dataclass(frozen=True)
class LibraryChoice:
    """An attention implementation the file leaves to transformers (``flash_attn: auto``,
    a model loaded without ``attn_implementation``): decided from the model family
    (``config`` resolves it with fields.SDPA_DEFAULT_FAMILIES)."""

    why: str
    model: str | None = None


@dataclass(frozen=True)
class Weak:
    """A converted value that only says "not this flag" (e.g. ``bf16=False``)."""

    value: Any


@dataclass
class Raw:
    """One value read from a file, before it is mapped to a field."""

    value: Any
    file: str
    line: int | None = None
    span: Span | None = None
    kind: str = "literal"
    detail: str = ""


@dataclass
class Found:
    """A candidate value for one ConfigDict (or auxiliary) field.

    ``conv`` names the converter that read it and ``base_rank`` the rank of
    its table row before a :class:`Weak` value lowered it: the patch stage
    uses both to write a new value back in the key's own vocabulary.
    """

    field: str
    value: Any
    prov: Provenance
    rank: int
    seq: int = 0
    conv: str = ""
    base_rank: int = 0


_SEQ = [0]


def found(field_name: str, value: Any, prov: Provenance, rank: int, conv: str = "",
          base_rank: int | None = None) -> Found:
    """A candidate; ``Undetermined`` values become null with kind ``unset``."""
    _SEQ[0] += 1
    if isinstance(value, Undetermined):
        detail = "; ".join(p for p in (value.reason, prov.detail) if p)
        prov = prov.model_copy(update={"kind": "unset", "detail": detail, "span": None})
        value = None
    return Found(field_name, value, prov, rank, _SEQ[0], conv, rank if base_rank is None else base_rank)


# --------------------------------------------------------------------------- converters

def _number(value: Any, want: type) -> Any:
    if value is None:
        return SKIP
    if isinstance(value, Undetermined):
        return value
    if isinstance(value, bool):
        return Undetermined(f"{value!r} is not a number")
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return DEFER
        try:
            value = float(text) if want is float or any(c in text for c in ".eEn") else int(text)
        except ValueError:
            return Undetermined(f"{value!r} is not a number")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return Undetermined(f"{value!r} is not a finite number")
        if want is int:
            return int(value) if float(value).is_integer() else Undetermined(f"{value!r} is not an integer")
        return float(value)
    return Undetermined(f"{value!r} is not a number")


def _bool(value: Any) -> Any:
    if value is None:
        return SKIP
    if isinstance(value, Undetermined):
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "yes", "on", "1"):
            return True
        if low in ("false", "no", "off", "0", ""):
            return False
        if low == "auto":
            return DEFER
    return Undetermined(f"{value!r} is not a boolean")


def _lookup(table: dict[str, str], value: Any, what: str) -> Any:
    if value is None:
        return SKIP
    if isinstance(value, Undetermined):
        return value
    if isinstance(value, bool):
        value = str(value).lower()
    if not isinstance(value, str):
        return SKIP
    hit = table.get(value.strip().lower())
    if hit == "skip":
        return SKIP
    if hit is None:
        return None if what == "passthrough" else Undetermined(f"{value!r} is not a known {what}")
    return hit


def _positional(value: Any) -> bool:
    """A launch line's bare flag followed by a positional argument (``--fp16 data-bin/x``): the scanner
    paired them, but a path or name is no flag value."""
    return isinstance(value, str) and bool(value.strip()) and ("/" in value or value.startswith(("$", "~", ".")))


def _flag(result: str, false_value: Any = SKIP) -> Callable[[Any, Callable[[str], Any]], Any]:
    def convert(value: Any, sibling: Callable[[str], Any]) -> Any:
        if _positional(value):
            return result
        b = _bool(value)
        if b is True:
            return result
        if b is False:
            return false_value
        return b

    return convert


def _auto_bf16(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return ("bf16", "bf16: auto resolves to bf16 when is_torch_bf16_gpu_available(); "
                        "True on ROCm (target MI300X), so bf16 there")
    return _flag("bf16", Weak("fp32"))(value, sibling)


def _attn(value: Any, sibling: Callable[[str], Any]) -> Any:
    hit = _lookup(F.ATTN_NAMES, value, "passthrough")
    if hit is None:
        return ("unknown", f"attn_implementation {value!r} is none of sdpa/flash/eager")
    return hit


def _attn_other(value: Any, sibling: Callable[[str], Any]) -> Any:
    b = _bool(value)
    if b is True:
        return ("unknown", "an attention kernel outside sdpa/flash/eager is selected")
    return SKIP if b is False else b


def _optim(value: Any, sibling: Callable[[str], Any]) -> Any:
    if value is None:
        return SKIP
    if isinstance(value, Undetermined):
        return value
    return str(value).strip().lower() if isinstance(value, str) else Undetermined(f"{value!r} is not an optimizer")


def optimizer_name(component: str, fused: Any) -> tuple[str, str]:
    """The HF ``optim`` name of an optimizer class path, and a note.

    ``torch.optim.AdamW`` -> ``adamw_torch``; with ``fused=True`` ->
    ``adamw_torch_fused`` (cases README, "Optimizer names").
    """
    cls = component.rsplit(".", 1)[-1]
    name = F.OPTIMIZER_CLASSES.get(cls)
    if name is None:
        return component, f"{component} has no Hugging Face optim name"
    if _bool(fused) is True and name in F.FUSED_OPTIMIZERS:
        return F.FUSED_OPTIMIZERS[name], f"{component} with fused=True"
    return name, f"{component}"


def _optim_component(value: Any, sibling: Callable[[str], Any]) -> Any:
    if not isinstance(value, str):
        return _optim(value, sibling)
    return optimizer_name(value, sibling("fused"))


def _ds_optim(value: Any, sibling: Callable[[str], Any]) -> Any:
    if not isinstance(value, str):
        return _optim(value, sibling)
    return ("deepspeed:" + value.strip().lower(), "the DeepSpeed optimizer block replaces the trainer's optim")


def _titan_optim(value: Any, sibling: Callable[[str], Any]) -> Any:
    """torchtitan ``optimizer.name`` with ``optimizer.implementation`` (default fused)."""
    if not isinstance(value, str):
        return _optim(value, sibling)
    implementation = sibling("implementation") or F.TITAN_IMPLEMENTATION_DEFAULT
    name, note = optimizer_name(value, implementation == "fused")
    return name, f"{note} (torchtitan implementation={implementation!r})"


def _titan_ac(value: Any, sibling: Callable[[str], Any]) -> Any:
    """torchtitan ``activation_checkpoint.mode``: none | selective | full | memory_budget."""
    if not isinstance(value, str):
        return _bool(value)
    return (value.strip().lower() != "none", f"activation checkpointing mode {value!r}")


def _titan_dtype(value: Any, sibling: Callable[[str], Any]) -> Any:
    """torchtitan ``training.dtype``: bfloat16 trains everything in bf16; float32 leaves it to mixed precision."""
    hit = _lookup(F.DTYPE_NAMES, value, "precision")
    return hit if hit == "bf16" else SKIP


def _global_batch(value: Any, sibling: Callable[[str], Any]) -> Any:
    """A global batch size; a negative value (torchtitan -1) means "not set"."""
    out = _number(value, int)
    return SKIP if isinstance(out, int) and out < 1 else out


def _lf_attn(value: Any, sibling: Callable[[str], Any]) -> Any:
    hit = _lookup(F.LF_FLASH_ATTN, value, "LLaMA-Factory flash_attn value")
    if hit == "auto":
        return LibraryChoice("flash_attn: auto leaves the attention to transformers")
    return hit


def _warmup(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
        return Ratio(float(value))
    if isinstance(value, float) and value >= 1:
        return int(value)
    if isinstance(value, str):
        try:
            as_float = float(value)
        except ValueError:
            as_float = None
        if as_float is not None and 0 < as_float < 1:
            return Ratio(as_float)
    return _number(value, int)


def _workers(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return Undetermined("dataloader_num_workers: 'auto' is a run-time heuristic (oumi: at least 1)")
    return _number(value, int)


def _str(value: Any, sibling: Callable[[str], Any]) -> Any:
    if value is None:
        return SKIP
    if isinstance(value, Undetermined):
        return value
    return value if isinstance(value, str) else SKIP


def _str_only(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, Undetermined) and value.cli:
        return value
    return value if isinstance(value, str) else SKIP


def _model_id(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, str) and value.strip().lower() in F.NOT_MODEL_IDS:
        return Undetermined(f"init_from={value!r}: no pretrained model id")
    return _str_only(value, sibling)


def _checkpointing(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("offload", "offload_disk", "unsloth"):
        return (True, f"gradient checkpointing mode {value!r}")
    return _bool(value)


def _not_bool(value: Any, sibling: Callable[[str], Any]) -> Any:
    b = _bool(value)
    return (not b) if isinstance(b, bool) else b


def _tokenizer_padding(value: Any, sibling: Callable[[str], Any]) -> Any:
    """A tokenizer's (or collator's) ``padding=``: transformers PaddingStrategy values."""
    if isinstance(value, Undetermined):
        return value
    if value is None:
        return SKIP
    if isinstance(value, bool):
        return ("longest", "padding=True pads to the longest sequence of each tokenizer call") if value else (
            "dynamic", "padding=False: not padded when tokenised; the collator pads each batch")
    low = str(value).strip().lower().rsplit(".", 1)[-1]
    table = {"max_length": "max_length", "longest": "longest", "do_not_pad": "dynamic"}
    if low in table:
        return table[low]
    return Undetermined(f"padding={value!r} is not a transformers padding strategy")


def _pad_to_length(value: Any, sibling: Callable[[str], Any]) -> Any:
    """axolotl ``pad_to_sequence_len``: true pads every row to sequence_len, false pads per batch."""
    b = _bool(value)
    if b is True:
        return "max_length"
    if b is False:
        return "dynamic"
    return b


def _sampling_strategy(value: Any, sibling: Callable[[str], Any]) -> Any:
    """transformers v5 ``train_sampling_strategy``: only ``group_by_length`` groups by length."""
    if value is None:
        return SKIP
    if isinstance(value, Undetermined):
        return value
    if not isinstance(value, str):
        return Undetermined(f"train_sampling_strategy={value!r} is not a strategy name")
    return value.strip().lower() == "group_by_length"


#: Converter name -> function(value, sibling) returning a value, SKIP, DEFER,
#: Ratio, Weak, Undetermined, or a (value, note) pair.
def _precision_any(value: Any, sibling: Callable[[str], Any]) -> Any:
    """A precision in any spelling: Lightning/LitGPT (``16-mixed``, ``bf16-true``, the integers 16 and 32),
    Composer (``amp_bf16``), torch dtype names; 64 (double) is none of fp16/bf16/fp32."""
    if isinstance(value, int) and not isinstance(value, bool):
        hit = {16: "fp16", 32: "fp32"}.get(value)
        return hit if hit else Undetermined(f"precision {value} is none of fp16/bf16/fp32")
    return _lookup(F.DTYPE_NAMES, value, "precision")


def _composer_micro(value: Any, sibling: Callable[[str], Any]) -> Any:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return Undetermined("device_train_microbatch_size: auto: Composer searches the largest micro-batch that "
                            "fits at run time")
    return _number(value, int)


def _composer_time(value: Any, sibling: Callable[[str], Any]) -> Any:
    """Composer durations: ``250ba`` (batches = optimizer steps) is a step count; ``ep``, ``dur``, ``tok``,
    ``sp`` units depend on the dataset and run length."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text.endswith("ba") and text[:-2].isdigit():
            return int(text[:-2])
        if text:
            return Undetermined(f"t_warmup {value!r} is not in batches: its steps depend on the data and run length")
    return _number(value, int)


def _token_batch(value: Any, sibling: Callable[[str], Any]) -> Any:
    if value is None:
        return SKIP
    return Undetermined(f"--max-tokens {value}: batches are sized in tokens, so the samples per batch vary")


CONVERTERS: dict[str, Callable[[Any, Callable[[str], Any]], Any]] = {
    "int": lambda v, s: _number(v, int),
    "float": lambda v, s: _number(v, float),
    "str": _str,
    "str_only": _str_only,
    "model_id": _model_id,
    "bool": lambda v, s: _bool(v),
    "not_bool": _not_bool,
    "checkpointing": _checkpointing,
    "flag_bf16": _flag("bf16", Weak("fp32")),
    "flag_fp16": _flag("fp16", Weak("fp32")),
    "auto_bf16": _auto_bf16,
    "flag_flash": _flag("flash"),
    "flag_sdpa": _flag("sdpa"),
    "flag_eager": _flag("eager"),
    "flag_other": _attn_other,
    "dtype": lambda v, s: _lookup(F.DTYPE_NAMES, v, "precision"),
    # a model's load dtype is a weak hint: when unknown it says nothing
    "load_dtype": lambda v, s: SKIP if isinstance(v, Undetermined) else _lookup(F.DTYPE_NAMES, v, "precision"),
    "attn": _attn,
    "lf_attn": _lf_attn,
    "titan_optim": _titan_optim,
    "titan_ac": _titan_ac,
    "titan_dtype": _titan_dtype,
    "global_batch": _global_batch,
    "optim": _optim,
    "optim_component": _optim_component,
    "ds_optim": _ds_optim,
    "warmup": _warmup,
    "workers": _workers,
    "tokenizer_padding": _tokenizer_padding,
    "pad_to_length": _pad_to_length,
    "flag_packed": _flag("packed"),
    "sampling_strategy": _sampling_strategy,
    "precision_any": _precision_any,
    "composer_micro": _composer_micro,
    "composer_time": _composer_time,
    "token_batch": _token_batch,
}


#: A ConfigDict value that a key cannot state (``render_value``).
INEXPRESSIBLE = _Marker("inexpressible")

_FLAG_MEANING = {"flag_bf16": "bf16", "flag_fp16": "fp16", "flag_flash": "flash", "flag_sdpa": "sdpa",
                 "flag_eager": "eager", "flag_packed": "packed", "auto_bf16": "bf16"}
_IDENTITY = ("int", "float", "str", "str_only", "model_id", "optim", "workers", "warmup", "global_batch")
#: Preferred spelling of an attention value per converter (the HF names; LLaMA-Factory's own).
_ATTN_OUT = {"attn": {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"},
             "lf_attn": {"sdpa": "sdpa", "eager": "disabled", "flash": "fa2"}}
_DTYPE_STYLES = (("torch.", ("torch.bfloat16", "torch.float16", "torch.float32")),
                 ("long", ("bfloat16", "float16", "float32")),
                 ("short", ("bf16", "fp16", "fp32")))


def _render_dtype(value: str, original: Any) -> Any:
    text = str(original).strip().lower() if original is not None else ""
    if text == "no" and value == "fp32":
        return "no"
    style = ("torch." if text.startswith("torch.") else
             "long" if text in ("bfloat16", "float16", "float32", "float", "half") else "short")
    names = dict(_DTYPE_STYLES)[style]
    return next((n for n in names if F.DTYPE_NAMES.get(n) == value), INEXPRESSIBLE)


def render_value(conv: str, value: Any, original: Any = None) -> tuple[Any, bool]:
    """The value to write under a key read by converter ``conv`` so that it means ``value``.

    The inverse of the converters: ``attn`` writes ``flash`` as
    ``"flash_attention_2"``; a flag (``flag_bf16``, ``flag_sdpa`` ...) can
    only say whether its own meaning holds, so it is ``True`` for that value
    and ``False`` for any other; ``dtype`` keeps the original's spelling
    style (``torch.bfloat16`` / ``bfloat16`` / ``bf16``).

    Parameters
    ----------
    conv : str
        A key of :data:`CONVERTERS`.
    value : Any
        The ConfigDict value to state.
    original : Any
        The value the key holds now (its spelling style is kept).

    Returns
    -------
    tuple
        ``(file_value, states_it)``: ``states_it`` is True when reading
        ``file_value`` back through ``conv`` gives ``value`` (False for a flag
        set to ``False``, which only says "not this").  ``file_value`` is
        :data:`INEXPRESSIBLE` when the key cannot carry the value at all.
    """
    if conv in _FLAG_MEANING:
        out: Any = value == _FLAG_MEANING[conv]
    elif conv in _IDENTITY:
        out = value
    elif conv in ("bool", "checkpointing"):
        out = bool(value) if isinstance(value, bool) else INEXPRESSIBLE
    elif conv == "not_bool":
        out = (not value) if isinstance(value, bool) else INEXPRESSIBLE
    elif conv in ("dtype", "load_dtype"):
        out = _render_dtype(value, original) if isinstance(value, str) else INEXPRESSIBLE
    elif conv in _ATTN_OUT:
        table = F.ATTN_NAMES if conv == "attn" else F.LF_FLASH_ATTN
        keep = isinstance(original, str) and table.get(original.strip().lower()) == value and value != "auto"
        out = original if keep else _ATTN_OUT[conv].get(value, INEXPRESSIBLE)
    elif conv == "tokenizer_padding":
        out = {"max_length": "max_length", "dynamic": False,
               "longest": True if isinstance(original, bool) else "longest"}.get(value, INEXPRESSIBLE)
    elif conv == "pad_to_length":
        out = {"max_length": True, "dynamic": False}.get(value, INEXPRESSIBLE)
    elif conv == "titan_ac":
        keep = isinstance(original, str) and original.strip().lower() != "none"
        out = (original if keep else "selective") if value is True else "none" if value is False else INEXPRESSIBLE
    elif conv == "sampling_strategy":
        out = ("group_by_length" if value else "random") if isinstance(value, bool) else INEXPRESSIBLE
    else:
        out = INEXPRESSIBLE
    if out is INEXPRESSIBLE:
        return out, False
    back, _ = convert(conv, out)
    return out, back == value and not isinstance(back, (Weak, _Marker))


def convert(name: str, value: Any, sibling: Callable[[str], Any] = lambda k: None) -> tuple[Any, str]:
    """Run converter ``name``; returns ``(value, note)``."""
    out = CONVERTERS[name](value, sibling)
    if isinstance(out, tuple):
        return out
    return out, ""


# --------------------------------------------------------------------------- tool tables

def tool_chain(tool: str) -> list[str]:
    """``tool`` followed by its bases (fields.TOOL_BASE)."""
    chain = [tool]
    while chain[-1] in F.TOOL_BASE:
        chain.append(F.TOOL_BASE[chain[-1]])
    return chain


def tool_rows(tool: str) -> list[tuple[str, str, str, int]]:
    """Synonym rows of ``tool`` then of its bases (a (field, key) pair only once)."""
    rows: dict[tuple[str, str], tuple[str, str, str, int]] = {}
    for t in tool_chain(tool):
        for row in F.SYNONYMS.get(t, []):
            rows.setdefault((row[0], row[1]), row)
    return list(rows.values())


def class_chain(cls: str) -> list[str]:
    """``cls`` followed by its bases in fields.CLASS_DEFAULTS (unknown classes: empty)."""
    chain: list[str] = []
    while cls in F.CLASS_DEFAULTS and cls not in chain:
        chain.append(cls)
        cls = F.CLASS_DEFAULTS[cls][3] or ""
    return chain


def class_default(cls: str, key: str) -> tuple[Any, str] | None:
    """One key's default for library class ``cls`` (its bases included) and a cited detail, or None.

    Source: fields.CLASS_DEFAULTS (each set names its library, version and file).
    """
    for c in class_chain(cls):
        library, versions, source, _, values = F.CLASS_DEFAULTS[c]
        if key in values:
            name = c.rsplit(".", 1)[-1]
            return values[key], f"{key}={values[key]!r}: {library} {name} default ({versions}; {source})"
    return None


def class_defaults(tool: str, classes: list[str]) -> dict[str, tuple[object, str, str]]:
    """Field defaults of library classes (fields.CLASS_DEFAULTS), each with its bases, read through
    ``tool``'s synonym rows: field -> ``(value, kind, detail)``, the detail naming the library, the
    class, the version and the file.  Later classes win."""
    ordered: list[str] = []
    for c in classes:
        ordered += [b for b in reversed(class_chain(c)) if b not in ordered]
    merged: dict[str, Any] = {}
    for c in ordered:
        merged.update(F.CLASS_DEFAULTS[c][4])
    rows = tool_rows(tool)
    out: dict[str, tuple[object, str, str]] = {}
    for c in ordered:
        library, versions, source, _, values = F.CLASS_DEFAULTS[c]
        cite = f"{library} {c.rsplit('.', 1)[-1]} default ({versions}; {source})"
        for key, value in values.items():
            if key.startswith("="):
                v, why = value
                out[key[1:]] = ((None, "unset", f"{why}: {cite}") if v == F.UNDETERMINED
                                else (v, "default", f"{why}: {cite}"))
                continue
            parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
            for field_name, row_key, conv, _ in rows:
                if row_key != key:
                    continue
                got, note = convert(conv, value, lambda k, p=parent: merged.get(p + k))
                if isinstance(got, Weak):
                    got = got.value
                if got is SKIP or got is DEFER or isinstance(got, (Undetermined, Ratio, LibraryChoice)):
                    continue
                out[field_name] = (got, "default", f"{key}={value!r}: {cite}")
    return out


def tool_defaults(tool: str, cls: str | None = None) -> dict[str, tuple[object, str, str]]:
    """Defaults of ``tool``: the common ones, then for each tool of its chain (base first) its
    library class's (fields.TOOL_CLASS, :func:`class_defaults`) and its own (fields.TOOL_DEFAULTS),
    then those of ``cls``, the class a script builds (e.g. ``GRPOConfig``), which win."""
    out = dict(F.COMMON_DEFAULTS)
    applied: list[str] = []
    for t in reversed(tool_chain(tool)):
        if t in F.TOOL_CLASS:
            applied.append(F.TOOL_CLASS[t])
            out.update(class_defaults(tool, applied))
        out.update(F.TOOL_DEFAULTS.get(t, {}))
    if cls and cls in F.CLASS_DEFAULTS:
        done = {b for c in applied for b in class_chain(c)}
        fresh = [b for b in reversed(class_chain(cls)) if b not in done]
        out.update(class_defaults(tool, fresh))
    return out


def deprecated_keys(tool: str) -> dict[str, str]:
    """Deprecated/renamed keys of ``tool`` and its bases."""
    out: dict[str, str] = {}
    for t in reversed(tool_chain(tool)):
        out.update(F.DEPRECATED_KEYS.get(t, {}))
    return out


def detect_tool(keys: set[str] | dict[str, Any]) -> str:
    """Which tool wrote a flattened mapping, or ``"unknown"``.

    The first tool of fields.TOOL_SIGNATURES with one of its keys; else the
    Trainer's arguments (``hf``) when enough top-level keys are
    TrainingArguments keys (fields.HF_MIN_KEYS / HF_MIN_SHARE); else
    ``unknown``: a format Goblin does not know, read without defaults.
    """
    return detect_tool_confidence(keys)[0]


def detect_tool_confidence(keys: set[str] | dict[str, Any]) -> tuple[str, float]:
    """:func:`detect_tool` with a confidence in [0, 1] (a signature key: 1.0; HF by its keys: their share)."""
    for tool, signature in F.TOOL_SIGNATURES:
        for sig in signature:
            if sig.startswith("*"):
                if any(k.endswith(sig[1:]) for k in keys):
                    return tool, 1.0
            elif sig in keys or any(k.startswith(sig + ".") for k in keys):
                return tool, 1.0
    top = {k for k in keys if "." not in k}
    known = top & F.HF_ARG_KEYS
    share = len(known) / len(top) if top else 0.0
    if len(known) >= F.HF_MIN_KEYS or (known and share >= F.HF_MIN_SHARE):
        return "hf", round(max(share, F.FORMAT_CONFIDENCE["fallback_hf"]), 2)
    return "unknown", 0.0


def detect_tool_reason(keys: set[str] | dict[str, Any]) -> str:
    """Why :func:`detect_tool_confidence` decided as it did, in one sentence (the key or share that decided)."""
    for tool, signature in F.TOOL_SIGNATURES:
        for sig in signature:
            hit = next((k for k in keys if (k.endswith(sig[1:]) if sig.startswith("*")
                                             else k == sig or k.startswith(sig + "."))), None)
            if hit is not None:
                return f"key {hit!r} is a signature of {F.TOOL_NAMES.get(tool, tool)}"
    top = {k for k in keys if "." not in k}
    known = sorted(top & F.HF_ARG_KEYS)
    if len(known) >= F.HF_MIN_KEYS or (known and len(known) / max(len(top), 1) >= F.HF_MIN_SHARE):
        return (f"{len(known)} of {len(top)} top-level keys are TrainingArguments fields "
                f"({', '.join(known[:5])}{', ...' if len(known) > 5 else ''})")
    return (f"no key is a signature of a tool Goblin knows, and {len(known)} of {len(top)} top-level keys are "
            "TrainingArguments fields: too few to call it one")


@dataclass
class Mapped:
    """Result of mapping a flat key table through a tool's synonym rows."""

    found: list[Found] = field(default_factory=list)
    deferred: dict[str, str] = field(default_factory=dict)   # field -> key whose value was "auto"


def map_entries(tool: str, raws: dict[str, Raw], origin: str = "") -> Mapped:
    """Map flat ``raws`` to candidates through ``tool``'s synonym rows.

    Parameters
    ----------
    tool : str
        A key of ``fields.SYNONYMS``.
    raws : dict
        Dotted key -> Raw value.
    origin : str
        Appended to each provenance detail (e.g. ``"TrainingArguments(...)"``).

    Returns
    -------
    Mapped
        Candidates (``Found``) in row order, and the fields whose key was
        ``"auto"`` (deferred to the trainer).
    """
    return _map_rows(tool_rows(tool), raws, origin)


def map_by_name(raws: dict[str, Raw], why: str) -> Mapped:
    """Candidates of a file in a format Goblin does not know: each key's last
    part looked up in the generic names (fields.PY_NAMES), rank R_NAME, with
    ``why`` in the provenance.  No defaults are implied."""
    rows: list[tuple[str, str, str, int]] = []
    for key in raws:
        leaf = key.rsplit(".", 1)[-1].lower().replace("-", "_")
        for field_name, names in F.PY_NAMES.items():
            if leaf in names:
                rows.append((field_name, key, F.PY_NAME_CONVERTERS[field_name], F.R_NAME))
                break
    return _map_rows(rows, raws, why)


def _map_rows(rows: list[tuple[str, str, str, int]], raws: dict[str, Raw], origin: str) -> Mapped:
    out = Mapped()
    for field_name, key, conv, row_rank in rows:
        rank = row_rank
        raw = raws.get(key)
        if raw is None:
            continue
        parent = key.rsplit(".", 1)[0] + "." if "." in key else ""

        def sibling(name: str, parent: str = parent) -> Any:
            hit = raws.get(parent + name)
            return hit.value if hit is not None else None

        value, note = convert(conv, raw.value, sibling)
        if value is SKIP:
            continue
        if value is DEFER:
            out.deferred.setdefault(field_name, key)
            continue
        if isinstance(value, Weak):
            value, rank = value.value, min(rank, F.R_WEAK)
        where = f"{key}" + (f" in {origin}" if origin else "")
        detail = "; ".join(p for p in (where, raw.detail, note) if p)
        prov = Provenance(file=raw.file, line=raw.line, kind=raw.kind, detail=detail, span=raw.span, key=key)
        out.found.append(found(field_name, value, prov, rank, conv, row_rank))
    return out
