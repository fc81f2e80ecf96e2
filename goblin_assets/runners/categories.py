"""The one table of kernel and op categories: which GPU kernels and CPU ops are GEMM, attention, collectives ...

The table is data (``goblin_assets/runners/categories.yaml``, shipped with
the package and read through :mod:`importlib.resources`); this module loads
it, checks it and classifies names.  Every reader of kernel or op names asks
here: the trace reader (per-step time by category, collective time), the
rocprofv3 parser (kernel kinds), ``profile_run`` (whether a fused attention
kernel ran), the roofline (which ops are GEMMs and where their operands are)
and the KB's ``kernels.<kind>.pct`` conditions (:func:`category_pct`).

Classification: the first rule of the table that matches the name (one of its
regular expressions, ``re.search``, case-insensitive, or one of its exact
names) gives its category; no match is ``other``.  Each category belongs to a coarse group (``attention`` =
attention forward + backward; ``memory`` = DMA copies + copy/transpose
kernels).  Each rule cites where its names come from (library sources and the
recorded traces the patterns were checked against).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from goblin_assets.contracts import RunMetrics
from goblin_assets.errors import GoblinError

#: The table shipped with the package.
TABLE_FILE: Traversable = files("goblin_assets.runners") / "categories.yaml"

#: The category of a name no rule matches (and its group).
OTHER = "other"


class CategoryTableError(GoblinError):
    """The category table cannot be read or is inconsistent (names the file and the entry)."""


class GemmOperands(BaseModel):
    """Where a leaf GEMM op's operands are in its ``Input Dims``/``Input type`` lists (0-based).

    ``lhs`` is ``[.., M, K]``, ``rhs`` ``[.., K, N]``; ``bias`` the added
    input (addmm, baddbmm) or None; ``batched`` when the operands carry a
    leading batch dimension (bmm, baddbmm).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lhs: int = Field(ge=0)
    rhs: int = Field(ge=0)
    bias: int | None = Field(default=None, ge=0)
    batched: bool = False


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    category: str
    patterns: list[str] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    source: str = Field(min_length=1)
    fused: bool = False

    @model_validator(mode="after")
    def _something_to_match(self) -> _Rule:
        if not self.patterns and not self.names:
            raise ValueError("a rule needs patterns or names")
        return self


class _Category(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str
    description: str = ""


class _TableDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    groups: dict[str, str]
    categories: dict[str, _Category]
    rules: list[_Rule]
    gemm_operands: dict[str, GemmOperands] = Field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    """How the table classifies one name.

    ``category`` (e.g. ``attention_forward``) and its ``group`` (e.g.
    ``attention``); ``fused`` for a fused attention kernel or the aten op that
    launches one; ``source`` the matching rule's citation (empty for
    ``other``).
    """

    category: str
    group: str
    fused: bool = False
    source: str = ""


class CategoryTable:
    """A validated category table: its groups, categories, ordered rules and leaf-GEMM operand positions.

    Build one with :func:`load_table`; :meth:`classify` caches its answers.
    """

    def __init__(self, doc: _TableDoc, where: str):
        self.where = where
        self.groups: dict[str, str] = dict(doc.groups)
        self.categories: dict[str, str] = {name: c.group for name, c in doc.categories.items()}
        self.descriptions: dict[str, str] = {name: c.description for name, c in doc.categories.items()}
        self._rules: list[tuple[re.Pattern[str], Match]] = []
        for i, rule in enumerate(doc.rules):
            for j, pat in enumerate(rule.patterns):
                try:
                    re.compile(pat)
                except re.error as exc:
                    raise CategoryTableError(f"{where}: rules[{i}].patterns[{j}]: invalid regular expression "
                                             f"{pat!r} ({exc})") from None
            if rule.category not in self.categories:
                raise CategoryTableError(f"{where}: rules[{i}].category: unknown category {rule.category!r} "
                                         f"(categories: {', '.join(self.categories)})")
            alternatives = [f"(?:{p})" for p in rule.patterns] + [f"^{re.escape(n)}$" for n in rule.names]
            combined = re.compile("|".join(alternatives), re.IGNORECASE)
            self._rules.append((combined, Match(rule.category, self.categories[rule.category], rule.fused,
                                                " ".join(rule.source.split()))))
        self._other = Match(OTHER, self.categories[OTHER])
        self._cache: dict[str, Match] = {}
        self.gemm_operands: dict[str, GemmOperands] = dict(doc.gemm_operands)
        for op in self.gemm_operands:
            if self.classify(op).group != "gemm":
                raise CategoryTableError(f"{where}: gemm_operands.{op}: the rules classify it as "
                                         f"{self.classify(op).category!r}, not a gemm")

    def classify(self, name: str) -> Match:
        """The first matching rule's category for a kernel or op ``name`` (``other`` when none matches)."""
        hit = self._cache.get(name)
        if hit is None:
            hit = next((m for rx, m in self._rules if rx.search(name)), self._other)
            self._cache[name] = hit
        return hit


def load_table(path: str | Path | Traversable | None = None) -> CategoryTable:
    """Read and check a category table (default: the packaged :data:`TABLE_FILE`).

    Checks: the YAML schema; every category's group is declared, ``other``
    exists, every rule names a known category and compiles; every
    ``gemm_operands`` op classifies as a gemm.

    Raises
    ------
    CategoryTableError
        Unreadable file, invalid YAML, or a failed check; the message names
        the file and the entry (``rules[3].patterns[1]``).
    """
    src = TABLE_FILE if path is None else path
    where = str(src)
    try:
        data = yaml.safe_load(src.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CategoryTableError(f"{where}: cannot read the category table: {exc}") from None
    try:
        doc = _TableDoc.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CategoryTableError(f"{where}: {'.'.join(str(x) for x in first['loc']) or '(top level)'}: "
                                 f"{first['msg']}") from None
    for name, cat in doc.categories.items():
        if cat.group not in doc.groups:
            raise CategoryTableError(f"{where}: categories.{name}.group: unknown group {cat.group!r} "
                                     f"(groups: {', '.join(doc.groups)})")
    if OTHER not in doc.categories:
        raise CategoryTableError(f"{where}: categories: no {OTHER!r} category for names no rule matches")
    return CategoryTable(doc, where)


@lru_cache(maxsize=1)
def default_table() -> CategoryTable:
    """The packaged table, loaded once per process.

    Raises
    ------
    CategoryTableError
        As :func:`load_table`.
    """
    return load_table()


def classify(name: str) -> Match:
    """Category, group, fused flag and source of a kernel or op name in the packaged table."""
    return default_table().classify(name)


def groups() -> tuple[str, ...]:
    """The coarse groups in table order (``gemm``, ``attention``, ``conv``, ``collective`` ...)."""
    return tuple(default_table().groups)


def is_fused_attention(name: str) -> bool:
    """Whether ``name`` is a fused attention kernel (AOTriton, CK, FlashAttention, cuDNN, memory-efficient)
    or the aten op that launches one; composite/math SDPA is not."""
    m = classify(name)
    return m.group == "attention" and m.fused


def gemm_operands(op: str) -> GemmOperands | None:
    """Operand positions of a leaf GEMM op (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm`` ...), else None."""
    return default_table().gemm_operands.get(op)


def group_pct(shares: Iterable[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """Sum ``(name, percent)`` pairs per group: ``{group: {"pct": x}}`` with every group present (0.0 when absent).

    Units: the input's (percent of profiled time, 0..100).
    """
    out = dict.fromkeys(groups(), 0.0)
    for name, pct in shares:
        out[classify(name).group] += pct
    return {g: {"pct": v} for g, v in out.items()}


def category_pct(metrics: RunMetrics) -> dict[str, dict[str, float]]:
    """Percent of profiled time per group over a run's top kernels, for the KB's ``kernels.<kind>.pct``.

    ``{group: {"pct": x}}`` for every group of the table (``attention``
    counts forward and backward); empty when the run recorded no top
    kernels, so a condition then says "not available" instead of seeing 0 %.

    Units: percent (0..100) of profiled time, the top kernels' ``pct_time``.
    """
    if not metrics.top_kernels:
        return {}
    return group_pct((k.name, k.pct_time) for k in metrics.top_kernels)
