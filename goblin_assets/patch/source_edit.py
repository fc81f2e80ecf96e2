"""Step 2 of patching, the shared part: one file as text, its edits, and the writer interface.

A :class:`Document` is the user's file being patched: its text with
line/column <-> offset conversion (:class:`SourceText`), what the config
parser reads in it (:class:`Reading`: format, tool, every candidate value
with its source span) and the replacements made so far (:class:`Edits`,
applied together at the end, so spans never shift under a later edit).

A :class:`SourceWriter` writes ConfigDict fields into one format.  Every
writer first rewrites the places the file already writes a field
(:meth:`TextWriter.rewrite`: only the value's span changes, in the key's own
vocabulary, ``config_map.render_value``); a field no place states is then
inserted by the format's own writer (``write_python``, ``write_mapping``).
:class:`TextWriter` is the writer of shell scripts and launch lines (and of
Python that does not parse): it rewrites in place and inserts nothing.

:meth:`Document.patched` applies the edits and reads the text back with the
same parser: every changed field must read as its new value.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import yaml

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import INEXPRESSIBLE, Found, detect_tool, map_entries, render_value, tool_defaults
from goblin_assets.config.python_script import analyse_python
from goblin_assets.config.shell import scan_text
from goblin_assets.config.tree import flatten_json, flatten_toml, flatten_yaml
from goblin_assets.contracts import KeywordEdit
from goblin_assets.errors import ConfigParseError, PatchError
from goblin_assets.kb.rules import version_at_least
from goblin_assets.patch.changeset import CompanionEdit

#: File suffix -> format; anything else is "text" (shell scripts, launch lines).
FORMATS = {".py": "python", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}


# --------------------------------------------------------------------------- text positions

class SourceText:
    """A file's text with (1-based line, 0-based char column) <-> offset conversion."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def line_text(self, line: int) -> str:
        end = self.starts[line] if line < len(self.starts) else len(self.text)
        return self.text[self.starts[line - 1]:end].rstrip("\r\n")

    def node_offsets(self, node: ast.AST) -> tuple[int, int]:
        """Char offsets of an ast node (ast columns are UTF-8 byte offsets)."""
        def char(line: int, byte_col: int) -> int:
            return self.offset(line, len(self.line_text(line).encode("utf-8")[:byte_col].decode("utf-8", "replace")))
        return char(node.lineno, node.col_offset), char(node.end_lineno, node.end_col_offset)

    def indent_of(self, line: int) -> str:
        t = self.line_text(line)
        return t[: len(t) - len(t.lstrip())]


@dataclass
class Edits:
    """Replacements on the original text, applied together (later offsets first)."""

    text: SourceText
    items: list[tuple[int, int, int, str]] = field(default_factory=list)

    def add(self, start: int, end: int, new: str) -> None:
        for s, e, _, _ in self.items:
            if start < e and s < end:
                raise PatchError("two changes touch the same text")
        self.items.append((start, end, len(self.items), new))

    def apply(self) -> str:
        out = self.text.text
        # descending offset; at one offset, the change added last goes in first so it ends up last
        for start, end, _, new in sorted(self.items, key=lambda x: (x[0], x[1], x[2]), reverse=True):
            out = out[:start] + new + out[end:]
        return out


# --------------------------------------------------------------------------- reading the file back

@dataclass
class Reading:
    """What the parser sees in one file: its format, tool and every candidate value."""

    fmt: str
    tool: str
    cands: list[Found]
    tree: ast.Module | None = None


def read_source(text: str, name: str, fmt: str) -> Reading:
    """What ``parse_config``'s readers see in ``text`` (file ``name`` in format ``fmt``).

    A Python script that does not parse, and any "text" file, is read as a
    shell script / launch line.  Raises PatchError when the file cannot be
    read (malformed JSON/YAML, a script too complex to analyse).
    """
    try:
        if fmt == "python":
            try:
                tree = ast.parse(text)
            except SyntaxError:
                tree = None
            if tree is not None:
                try:
                    res = analyse_python(text, name)
                except (RecursionError, ValueError, MemoryError) as exc:
                    raise PatchError(f"{name}: too complex to patch statically ({type(exc).__name__})") from None
                return Reading(fmt, res.tool, res.found, tree)
            raws = scan_text(text, name)
            return Reading(fmt, "shell", map_entries("shell", raws).found)
        if fmt in ("json", "yaml", "toml"):
            raws = {"json": flatten_json, "yaml": flatten_yaml, "toml": flatten_toml}[fmt](text, name)
            tool = detect_tool(raws)
            return Reading(fmt, tool, map_entries(tool, raws).found)
    except ConfigParseError as exc:
        raise PatchError(f"{name}: cannot read the file to patch it ({exc.problem})") from None
    raws = scan_text(text, name)
    return Reading(fmt, "shell", map_entries("shell", raws).found)


def _best(cands: list[Found], field_name: str) -> Found | None:
    pool = [c for c in cands if c.field == field_name]
    return max(pool, key=lambda c: (c.rank, -c.seq)) if pool else None


def reads_as(read: Reading, field_name: str) -> Any:
    """The value ``field_name`` reads as: the best-ranked candidate, else the tool's default (None if unknown)."""
    best = _best(read.cands, field_name)
    if best is not None:
        return best.value
    default = tool_defaults(read.tool).get(field_name)
    return default[0] if default and default[0] != F.UNDETERMINED else None


# --------------------------------------------------------------------------- literals

def render_literal(value: Any, fmt: str, original: str = "") -> str:
    """Source text of ``value`` in the file's language, keeping the original quote style."""
    if fmt == "python":
        if isinstance(value, str):
            q = "'" if original.startswith("'") else '"'
            return q + value.replace("\\", "\\\\").replace(q, "\\" + q) + q
        return repr(value)
    if fmt in ("json", "toml"):           # TOML strings, numbers and booleans are written as in JSON
        return json.dumps(value)
    if fmt == "yaml":
        if isinstance(value, str):
            if original[:1] in ("'", '"'):
                return json.dumps(value) if original[0] == '"' else "'" + value.replace("'", "''") + "'"
            plain = yaml.safe_load(value) == value if re.fullmatch(r"[\w./+-]+", value) else False
            return value if plain else json.dumps(value)
        return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    return str(value)


def packages_ok(requires: tuple[str, str | None, str | None] | None, packages: dict[str, str | None]) -> bool:
    """Whether the installed distribution is within ``(dist, min, max)`` (max exclusive)."""
    if requires is None:
        return True
    dist, lo, hi = requires
    version = packages.get(dist)
    if version is None:
        return lo is None       # unknown version: only keys with no minimum
    if lo is not None and version_at_least(version, lo) is False:
        return False
    return not (hi is not None and version_at_least(version, hi) is True)


def installed_packages(names: tuple[str, ...] = ("transformers", "torch", "peft", "trl")) -> dict[str, str | None]:
    """Installed versions of the libraries whose keys are version-gated (null when absent)."""
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


# --------------------------------------------------------------------------- the file being written

@dataclass
class Document:
    """One file being patched: its text, what the parser reads in it, the edits so far.

    ``packages`` (distribution -> installed version, None when absent) choose
    version-gated keys; ``touched`` holds the source spans already rewritten.
    """

    name: str
    fmt: str
    text: SourceText
    read: Reading
    packages: dict[str, str | None]
    edits: Edits
    touched: set[tuple] = field(default_factory=set)

    @classmethod
    def open(cls, path: Path, packages: dict[str, str | None]) -> Document:
        """Read and parse ``path`` (UTF-8).  Raises PatchError when the parser cannot read it."""
        text = SourceText(path.read_text(encoding="utf-8"))
        fmt = FORMATS.get(path.suffix.lower(), "text")
        return cls(path.name, fmt, text, read_source(text.text, path.name, fmt), packages, Edits(text))

    @property
    def kind(self) -> str:
        """The writer this file needs: ``python`` (parsed script), ``json``, ``yaml`` or ``text``."""
        if self.read.tree is not None:
            return "python"
        return self.fmt if self.fmt in ("json", "yaml") else "text"

    def patched(self, changes: dict[str, Any]) -> str:
        """The text with the edits applied; raises PatchError unless every change reads back as written."""
        patched = self.edits.apply()
        if patched != self.text.text:
            back = read_source(patched, self.name, self.fmt)
            wrong = {f: reads_as(back, f) for f, v in changes.items() if reads_as(back, f) != v}
            if wrong:
                raise PatchError(f"{self.name}: after the edit " + ", ".join(
                    f"{f} reads {got!r}, not {changes[f]!r}" for f, got in wrong.items()))
        return patched


class SourceWriter(Protocol):
    """Writes ConfigDict fields into one :class:`Document` (one writer per format).

    Built as ``Writer(doc)``; every method raises PatchError when the file
    cannot carry the change.  The driver (``patch.edit_source``) calls, per
    field, :meth:`rewrite`, then :meth:`insert` when nothing states the value
    yet, then :meth:`companion` for the field's companion edits; finally
    :meth:`finish` once.
    """

    def rewrite(self, fld: str, value: Any) -> bool:
        """Rewrite every place the file writes ``fld``; True when one of them now states ``value``."""

    def rewrite_site(self, conv: str, span: tuple[int, int, int, int], value: Any) -> None:
        """Rewrite the literal at ``span`` (read by converter ``conv``) to state ``value``: a statement that sets a
        field at run time besides the line the parser reads (``config.overrides.setting_call``)."""

    def insert(self, fld: str, value: Any) -> None:
        """Add a place that states ``fld = value`` (the file writes it nowhere yet)."""

    def companion(self, edit: CompanionEdit) -> None:
        """Add the code ``edit`` says a value needs (e.g. a padding collator)."""

    def keyword_edit(self, edit: KeywordEdit, signatures: Callable[[str], list[str] | None]) -> None:
        """Set ``edit``'s keyword in the calls it names, under the first of its names the library accepts.

        ``signatures(edit.signature)`` is the keyword list of that callable in
        the user's interpreter (None: it could not be read), asked only when
        the file makes such a call.  Raises PatchError when a call to edit
        exists and no accepted name can state the value.
        """

    def finish(self) -> None:
        """Turn what was collected into edits of ``doc.edits``."""


def _site_text(t: SourceText, span: tuple[int, int, int, int]) -> tuple[int, int, str]:
    a, b = t.offset(span[0], span[1]), t.offset(span[2], span[3])
    return a, b, t.text[a:b]


class TextWriter:
    """Shell scripts, launch lines, and Python that does not parse: values are rewritten in place only.

    Also the base of the other writers: :meth:`rewrite` is the same for all.
    """

    def __init__(self, doc: Document):
        self.doc = doc

    def rewrite(self, fld: str, value: Any) -> bool:
        doc, read = self.doc, self.doc.read
        stating = False
        seen: set[tuple] = set()
        for c in read.cands:
            if c.field != fld or c.prov.span is None or not c.conv or c.base_rank <= F.R_WEAK:
                continue
            span = tuple(c.prov.span)
            if span in seen or span in doc.touched:
                continue
            seen.add(span)
            a, b, old = _site_text(doc.text, span)
            out, states = render_value(c.conv, value, _original_value(old, read.fmt))
            if out is INEXPRESSIBLE:
                continue
            stating = stating or bool(states)
            new = render_literal(out, read.fmt, old.strip())
            if new != old.strip():
                if not old.strip() and read.fmt == "yaml":
                    new = " " + new
                doc.edits.add(a, b, new)
            doc.touched.add(span)
        return stating

    def rewrite_site(self, conv: str, span: tuple[int, int, int, int], value: Any) -> None:
        """Rewrite the literal at ``span`` (read by converter ``conv``) to state ``value``; PatchError when the
        value cannot be written in that literal's form."""
        doc = self.doc
        a, b, old = _site_text(doc.text, span)
        out, _ = render_value(conv, value, _original_value(old, doc.read.fmt))
        if out is INEXPRESSIBLE:
            raise PatchError(f"{doc.name}: {value!r} cannot be written at line {span[0]} ({old.strip()})")
        new = render_literal(out, doc.read.fmt, old.strip())
        if new != old.strip():
            doc.edits.add(a, b, new)
        doc.touched.add(tuple(span))

    def insert(self, fld: str, value: Any) -> None:
        raise PatchError(f"{self.doc.name}: {fld} is not written in the file and nothing can be "
                         f"inserted into a {self.doc.fmt} file")

    def companion(self, edit: CompanionEdit) -> None:
        """Companion edits are Python code; other formats leave them to the tool."""

    def keyword_edit(self, edit: KeywordEdit, signatures: Callable[[str], list[str] | None]) -> None:
        """Keyword edits are arguments of Python calls; other formats have none."""

    def finish(self) -> None:
        pass


def _original_value(text: str, fmt: str) -> Any:
    src = text.strip()
    try:
        if fmt == "python":
            return ast.literal_eval(src)
        if fmt in ("json", "yaml", "toml"):
            return yaml.safe_load(src) if src else None
    except (ValueError, SyntaxError, yaml.YAMLError):
        pass
    return src.strip("\"'")
