"""JSON and YAML files as flat ``dotted.key -> Raw`` tables with source spans.

Both readers keep the exact span of every scalar (1-based lines, 0-based
character columns, as ``ast``), because the patch stage rewrites exactly
that text.  Both are bounded: nesting depth, node count (YAML alias bombs)
and the caller's file-size cap keep every file under a couple of seconds.
"""
from __future__ import annotations

import bisect
import json
import re
from typing import Any

import numpy as np
import yaml

from goblin_assets.config.mapping import Raw
from goblin_assets.errors import ConfigParseError

#: Deeper nesting than this is refused (no real config nests past ~6).
MAX_DEPTH = 64
#: Mapping entries re-visited through aliases while flattening (an alias bomb
#: re-visits its targets exponentially often; real configs re-use a few blocks).
MAX_ALIAS_VISITS = 10_000
#: Lists longer than this are not kept as values (no field is a long list).
MAX_LIST = 1_000

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


def bracket_depth(text: str) -> int:
    """Upper bound of ``[``/``{`` nesting (ignores quoting), computed in C speed."""
    only = re.sub(r"[^\[\]{}]+", "", text)
    if not only:
        return 0
    codes = np.frombuffer(only.encode("ascii"), dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


class _Lines:
    """Character offset -> (1-based line, 0-based column)."""

    def __init__(self, text: str):
        self.starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]

    def at(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i + 1, offset - self.starts[i]

    def span(self, start: int, end: int) -> tuple[int, int, int, int]:
        return (*self.at(start), *self.at(end))


class _JsonError(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


class _Json:
    """A small JSON reader that keeps each value's (start, end) offsets.

    Values are ``(python_value, start, end)``; objects hold ``dict[str, node]``
    and arrays ``list[node]``.  Strings are decoded by the standard library's
    own scanner, so escapes behave exactly as in ``json.loads``.
    """

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def ws(self) -> None:
        self.i = _WS.match(self.s, self.i).end()

    def parse(self) -> tuple[Any, int, int]:
        node = self.value(0)
        self.ws()
        if self.i != len(self.s):
            raise _JsonError("extra data after the top-level value", self.i)
        return node

    def value(self, depth: int) -> tuple[Any, int, int]:
        if depth > MAX_DEPTH:
            raise _JsonError(f"nested deeper than {MAX_DEPTH} levels", self.i)
        self.ws()
        s, start = self.s, self.i
        if start >= len(s):
            raise _JsonError("unexpected end of file", start)
        c = s[start]
        if c == "{":
            return self.container(depth, "}", start)
        if c == "[":
            return self.container(depth, "]", start)
        if c == '"':
            try:
                text, end = json.decoder.scanstring(s, start + 1)
            except json.JSONDecodeError as exc:
                raise _JsonError(exc.msg, exc.pos) from None
            self.i = end
            return text, start, end
        m = _NUMBER.match(s, start)
        if m and m.end() > start:
            self.i = m.end()
            tok = m.group(0)
            num = float(tok) if any(ch in tok for ch in ".eE") else int(tok)
            return num, start, m.end()
        for word, val in _LITERALS.items():
            if s.startswith(word, start):
                self.i = start + len(word)
                return val, start, self.i
        raise _JsonError(f"unexpected character {c!r}", start)

    def container(self, depth: int, close: str, start: int) -> tuple[Any, int, int]:
        s = self.s
        self.i += 1
        items: dict[str, Any] | list[Any] = {} if close == "}" else []
        self.ws()
        if self.i < len(s) and s[self.i] == close:
            self.i += 1
            return items, start, self.i
        while True:
            if close == "}":
                self.ws()
                if self.i >= len(s) or s[self.i] != '"':
                    raise _JsonError("expected a string key", self.i)
                key = self.value(depth + 1)[0]
                self.ws()
                if self.i >= len(s) or s[self.i] != ":":
                    raise _JsonError("expected ':'", self.i)
                self.i += 1
                items[key] = self.value(depth + 1)  # type: ignore[index]
            else:
                items.append(self.value(depth + 1))  # type: ignore[union-attr]
            self.ws()
            if self.i < len(s) and s[self.i] == ",":
                self.i += 1
                continue
            if self.i < len(s) and s[self.i] == close:
                self.i += 1
                return items, start, self.i
            raise _JsonError(f"expected ',' or {close!r}", self.i)


def _plain(node: tuple[Any, int, int]) -> Any:
    value = node[0]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def flatten_json(text: str, file: str) -> dict[str, Raw]:
    """A JSON file as ``dotted.key -> Raw`` (objects flattened, arrays kept as values).

    Raises
    ------
    ConfigParseError
        Invalid JSON (with line and column), or nesting deeper than MAX_DEPTH.
    """
    lines = _Lines(text)
    try:
        root = _Json(text).parse()
    except _JsonError as exc:
        line, col = lines.at(exc.pos)
        raise ConfigParseError(file, f"invalid JSON at line {line}, column {col + 1}: {exc}") from None
    if not isinstance(root[0], dict):
        raise ConfigParseError(file, "the JSON top level is not an object of settings")
    out: dict[str, Raw] = {}

    def walk(obj: dict[str, Any], prefix: str) -> None:
        for key, node in obj.items():
            dotted = prefix + str(key)
            value, start, end = node
            if isinstance(value, dict):
                walk(value, dotted + ".")
                continue
            if isinstance(value, list):
                value = _plain(node) if len(value) <= MAX_LIST else None
            span = lines.span(start, end)
            out[dotted] = Raw(value, file, span[0], span)

    walk(root[0], "")
    return out


# --------------------------------------------------------------------------- YAML

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    try:
        return loader.construct_object(node)
    except Exception:  # an invalid timestamp or similar: keep the text
        return node.value


def flatten_yaml(text: str, file: str, warnings: list[str] | None = None) -> dict[str, Raw]:
    """A YAML file as ``dotted.key -> Raw``, with merge keys (``<<``) applied.

    Scalars keep their YAML type (PyYAML ``safe_load`` rules: ``3e-4`` stays a
    string; the converters coerce it).  Lists of scalars are kept as values;
    lists of mappings are skipped.

    Raises
    ------
    ConfigParseError
        Invalid YAML (with line), nesting deeper than MAX_DEPTH, or more than
        MAX_ALIAS_VISITS entries re-visited through aliases (an alias bomb).
    """
    if bracket_depth(text) > MAX_DEPTH:
        raise ConfigParseError(file, f"YAML nested deeper than {MAX_DEPTH} levels")
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigParseError(file, f"invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigParseError(file, "YAML nested too deeply") from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigParseError(file, "the YAML top level is not a mapping of settings")
    out: dict[str, Raw] = {}
    loader = yaml.SafeLoader("")
    seen: set[int] = set()
    budget = [MAX_ALIAS_VISITS]

    def walk(node: yaml.MappingNode, prefix: str, into: dict[str, Raw], depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ConfigParseError(file, f"YAML nested deeper than {MAX_DEPTH} levels")
        if id(node) in seen:
            budget[0] -= len(node.value)
            if budget[0] < 0:
                raise ConfigParseError(file, f"YAML aliases expand to more than {MAX_ALIAS_VISITS} "
                                             "re-used entries (an alias bomb?)")
        seen.add(id(node))
        merged: dict[str, Raw] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            if key_node.tag.endswith(":merge") or key_node.value == "<<":
                targets = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for target in targets:
                    if isinstance(target, yaml.MappingNode):
                        walk(target, prefix, merged, depth + 1)
                continue
            dotted = prefix + str(key_node.value)
            if isinstance(value_node, yaml.MappingNode):
                walk(value_node, dotted + ".", into, depth + 1)
                continue
            if isinstance(value_node, yaml.ScalarNode):
                value = _scalar(loader, value_node)
            else:
                items = value_node.value
                scalars = len(items) <= MAX_LIST and all(isinstance(i, yaml.ScalarNode) for i in items)
                value = [_scalar(loader, i) for i in items] if scalars else None
            start, end = value_node.start_mark, value_node.end_mark
            span = (start.line + 1, start.column, end.line + 1, end.column)
            into[dotted] = Raw(value, file, start.line + 1, span)
        for key, raw in merged.items():
            into.setdefault(key, raw)

    walk(root, "", out, 0)
    return out


# --------------------------------------------------------------------------- TOML

_TOML_TABLE = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"']+)\s*=\s*")


def _toml_value_end(line: str, start: int) -> int:
    """End of the value that starts at ``start`` (before a trailing comment)."""
    quote = None
    for i in range(start, len(line)):
        c = line[i]
        if quote:
            if c == quote and line[i - 1] != "\\":
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#":
            return len(line[:i].rstrip())
    return len(line.rstrip())


def flatten_toml(text: str, file: str) -> dict[str, Raw]:
    """A TOML file as ``dotted.key -> Raw`` (tables flattened, arrays kept as values).

    Values come from the standard library's ``tomllib``; each one-line
    ``key = value`` keeps the span of its value text so it can be patched.

    Raises
    ------
    ConfigParseError
        Invalid TOML (with line), or nesting deeper than MAX_DEPTH.
    """
    import tomllib

    if bracket_depth(text) > MAX_DEPTH:
        raise ConfigParseError(file, f"TOML nested deeper than {MAX_DEPTH} levels")
    try:
        root = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigParseError(file, f"invalid TOML: {exc}") from None
    spans: dict[str, tuple[int, int, int, int]] = {}
    table = ""
    for n, line in enumerate(text.splitlines(), start=1):
        m = _TOML_TABLE.match(line)
        if m:
            table = ".".join(p.strip().strip("\"'") for p in m.group(1).split(".")) + "."
            continue
        m = _TOML_KEY.match(line)
        if m:
            key = ".".join(p.strip().strip("\"'") for p in m.group(1).split("."))
            end = _toml_value_end(line, m.end())
            if end > m.end():
                spans[table + key] = (n, m.end(), n, end)
    out: dict[str, Raw] = {}

    def walk(obj: dict[str, Any], prefix: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ConfigParseError(file, f"TOML nested deeper than {MAX_DEPTH} levels")
        for key, value in obj.items():
            dotted = prefix + str(key)
            if isinstance(value, dict):
                walk(value, dotted + ".", depth + 1)
                continue
            if isinstance(value, list) and len(value) > MAX_LIST:
                value = None
            span = spans.get(dotted)
            out[dotted] = Raw(value, file, span[0] if span else None, span)

    walk(root, "", 0)
    return out
