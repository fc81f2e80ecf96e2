"""The YAML and JSON writers: a field the file does not state is added under the tool's own key."""
from __future__ import annotations

import json
from typing import Any

import yaml

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import INEXPRESSIBLE, deprecated_keys, render_value, tool_rows
from goblin_assets.config.tree import flatten_json
from goblin_assets.errors import PatchError
from goblin_assets.patch.source_edit import SourceText, TextWriter, packages_ok, render_literal


def _yaml_last_line(node: yaml.Node) -> int:
    """0-based last line holding the node's text."""
    if isinstance(node, yaml.MappingNode) and node.value:
        return max(max(_yaml_last_line(k), _yaml_last_line(v)) for k, v in node.value)
    if isinstance(node, yaml.SequenceNode) and node.value:
        return max(_yaml_last_line(v) for v in node.value)
    m = node.end_mark
    return m.line - 1 if m.column == 0 and m.line > node.start_mark.line else m.line


def _yaml_insert(text: SourceText, key: str, literal: str) -> tuple[int, str]:
    """Where and what to insert so that the dotted ``key`` holds ``literal`` (block style kept)."""
    root = yaml.compose(text.text)
    if not isinstance(root, yaml.MappingNode):
        raise PatchError("the YAML top level is not a mapping")
    parts = key.split(".")
    node, depth = root, 0
    for part in parts[:-1]:
        child = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if not isinstance(child, yaml.MappingNode):
            if child is not None:
                raise PatchError(f"YAML key {part!r} is not a mapping")
            break
        node, depth = child, depth + 1
    if node.flow_style:
        raise PatchError(f"YAML mapping for {key!r} is written inline ({{...}}); not edited")
    step = 2
    nested = [v for _, v in root.value if isinstance(v, yaml.MappingNode) and v.value and not v.flow_style]
    if nested:
        step = max(1, nested[0].value[0][0].start_mark.column - root.value[0][0].start_mark.column) or 2
    col = node.value[0][0].start_mark.column if node.value else 0
    last = _yaml_last_line(node) + 1 if node.value else 0
    lines = []
    for i, part in enumerate(parts[depth:]):
        pad = " " * (col + i * step)
        lines.append(f"{pad}{part}:" + (f" {literal}" if i == len(parts) - depth - 1 else ""))
    at = text.starts[last] if last < len(text.starts) else len(text.text)
    prefix = "\n" if at == len(text.text) and text.text and not text.text.endswith("\n") else ""
    return at, prefix + "\n".join(lines) + "\n"


def _json_close(text: str, start: int, depth: int) -> int:
    """Offset of the ``}`` that closes the object ``depth`` levels up from ``start`` (strings skipped)."""
    level, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "{[":
            level += 1
        elif c in "}]":
            level -= 1
            if level == -depth:
                return i
        i += 1
    raise PatchError("unbalanced JSON object")


def _json_insert(text: SourceText, key: str, value: Any, name: str) -> tuple[int, str]:
    """Where and what to insert so that the dotted ``key`` holds ``value`` in a JSON object."""
    raws = flatten_json(text.text, name)
    parts = key.split(".")
    depth = 0
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i]) + "."
        if any(k.startswith(prefix) for k in raws):
            depth = i
            break
    prefix = ".".join(parts[:depth]) + "." if depth else ""
    inside = [(k, r) for k, r in raws.items() if k.startswith(prefix) and r.span]
    for part in reversed(parts[depth + 1:]):
        value = {part: value}
    new_key = parts[depth]
    if inside:
        k, last = max(inside, key=lambda kr: (kr[1].span[2], kr[1].span[3]))
        end = text.offset(last.span[2], last.span[3])
        close = _json_close(text.text, end, k.count(".") - prefix.count(".") + 1)
        direct = [r for kk, r in inside if "." not in kk[len(prefix):]] or [last]
        indent = text.indent_of(direct[0].span[0])
    else:
        close = text.text.rstrip().rfind("}")
        indent = "  "
    pos = len(text.text[:close].rstrip())
    sep = "" if text.text[pos - 1] == "{" else ","
    body = f"{json.dumps(new_key)}: {json.dumps(value)}"
    if text.line_of(pos) == text.line_of(close):       # the object closes on its last value's line
        return pos, f"{sep} {body}"
    return pos, f"{sep}\n{indent}{body}"




def _mapping_key(tool: str, fld: str, value: Any, present: set[str], packages: dict[str, str | None]):
    """The tool's synonym to add for ``fld`` (fields.SYNONYMS), with the value in its vocabulary."""
    old = deprecated_keys(tool)
    for f, key, conv, rank in tool_rows(tool):
        if f != fld or key in present or key in old or rank < F.R_CALL:
            continue
        gate = next((F.VERSIONED_KEYS[(t, key)] for t in (tool, "hf") if (t, key) in F.VERSIONED_KEYS), None)
        if not packages_ok(gate, packages):
            continue
        out, states = render_value(conv, value)
        if out is not INEXPRESSIBLE and states:
            return key, out
    raise PatchError(f"no {F.TOOL_NAMES.get(tool, tool)} key can state {fld}={value!r}")


class MappingWriter(TextWriter):
    """A key/value config file: a field no key states is added under the tool's own synonym.

    The synonym is the first of ``fields.SYNONYMS`` for the detected tool
    that the file does not have yet, skipping deprecated keys and keys the
    installed library version does not accept (``fields.VERSIONED_KEYS``).
    """

    def insert(self, fld: str, value: Any) -> None:
        doc = self.doc
        present = {c.prov.key for c in doc.read.cands if c.prov.key}
        key, out = _mapping_key(doc.read.tool, fld, value, present, doc.packages)
        at, new = self.place(key, out)
        doc.edits.add(at, at, new)

    def place(self, key: str, value: Any) -> tuple[int, str]:
        """(offset, text) to insert so that the dotted ``key`` holds ``value``."""
        raise NotImplementedError


class YamlWriter(MappingWriter):
    """YAML: the key goes at the end of its block, block style and indentation kept."""

    def place(self, key: str, value: Any) -> tuple[int, str]:
        return _yaml_insert(self.doc.text, key, render_literal(value, "yaml"))


class JsonWriter(MappingWriter):
    """JSON: the key goes last in its object (nested objects created), in the file's layout."""

    def place(self, key: str, value: Any) -> tuple[int, str]:
        return _json_insert(self.doc.text, key, value, self.doc.name)
