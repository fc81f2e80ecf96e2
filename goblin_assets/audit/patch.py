"""propose_patch: apply fired rules to the config and to the user's own file.

Deterministic, no LLM.  Each fired rule's ``fix.config`` assignments are
evaluated (``"=expr"`` values over ``cores`` and the config) and applied in
order of predicted uplift; a later rule that assigns a field an earlier rule
already set to a different value is dropped, and the patch says which rule
won and why.

Writing a field into the file (:func:`edit_source`) uses what the parser
knows (``parse_config``'s readers, ``fields.py``):

* every place the file already writes the field (a YAML/JSON key, a keyword
  argument, an argparse default ...) is rewritten in place, in the key's own
  vocabulary (``config_map.render_value``: ``flash`` is
  ``"flash_attention_2"`` for ``attn_implementation``, a ``bf16`` flag
  becomes ``true`` and an ``fp16`` flag ``false``); only the value's source
  span changes, so comments and formatting stay;
* when no existing place states the new value, a key is added: YAML/JSON
  under the tool's own synonym (``fields.SYNONYMS``, skipping deprecated and
  version-gated keys), Python as a keyword of the right call
  (``fields.PY_INSERT``: ``attn_implementation=`` in the model's
  ``from_pretrained``, ``dataloader_num_workers=`` in ``TrainingArguments``)
  or as a statement after the imports (``torch.set_num_threads``);
* a value that needs more code gets it (``fields.PY_VALUE_NEEDS``: dynamic
  padding needs a collator that pads each batch, passed to the Trainer);
* the patched text is read back with the same parser and every changed field
  must read as its new value, else :class:`PatchError`.

The diff is a unified diff with ``a/``/``b/`` prefixes relative to the
workload folder: ``git apply`` and ``patch -p1`` accept it there.

Uplift (DESIGN.md): per rule ``recovery_fraction x T_bucket / T_total``.
Rules on the same bucket are combined as ``1 - prod(1 - recovery_fraction)``
of that bucket (each saves its fraction of what the others leave), so the
recovery never exceeds the bucket's share; predicted speedup
``1 / (1 - recoverable)`` with low = half the recovery, high = all of it.
``rule_consistency`` = (combined / naively summed recovery) x (applied rules
/ applied + conflicting rules); confidence = ``evidence_coverage x
rule_consistency``.
"""
from __future__ import annotations

import ast
import difflib
import json
import re
import shutil
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from goblin_assets.audit import fields as F
from goblin_assets.audit.config_map import (
    INEXPRESSIBLE, Found, deprecated_keys, detect_tool, map_entries, render_value, tool_defaults, tool_rows,
)
from goblin_assets.audit.config_python import analyse_python, dotted
from goblin_assets.audit.config_shell import scan_text
from goblin_assets.audit.config_tree import flatten_json, flatten_yaml
from goblin_assets.audit.kb import KnowledgeBase, check_condition, eval_fix_value, version_at_least
from goblin_assets.audit.waste import evidence_coverage, shares
from goblin_assets.contracts import AppliedRule, ConfigDict, Patch, Rule, RuleMatch, RunMetrics
from goblin_assets.errors import ConfigParseError, PatchError

#: Largest share of a step the model predicts can be recovered (speedup <= 20x).
MAX_RECOVERABLE = 0.95

_FORMATS = {".py": "python", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


# --------------------------------------------------------------------------- text positions

class _Text:
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
class _Edits:
    """Replacements on the original text, applied together (later offsets first)."""

    text: _Text
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
class _Read:
    """What the parser sees in one file: its format, tool and every candidate value."""

    fmt: str
    tool: str
    cands: list[Found]
    tree: ast.Module | None = None


def _read(text: str, name: str, fmt: str) -> _Read:
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
                return _Read(fmt, res.tool, res.found, tree)
            raws = scan_text(text, name)
            return _Read(fmt, "shell", map_entries("shell", raws).found)
        if fmt in ("json", "yaml"):
            raws = flatten_json(text, name) if fmt == "json" else flatten_yaml(text, name)
            tool = detect_tool(raws)
            return _Read(fmt, tool, map_entries(tool, raws).found)
    except ConfigParseError as exc:
        raise PatchError(f"{name}: cannot read the file to patch it ({exc.problem})") from None
    raws = scan_text(text, name)
    return _Read(fmt, "shell", map_entries("shell", raws).found)


def _best(cands: list[Found], field_name: str) -> Found | None:
    pool = [c for c in cands if c.field == field_name]
    return max(pool, key=lambda c: (c.rank, -c.seq)) if pool else None


def _reads_as(read: _Read, field_name: str) -> Any:
    best = _best(read.cands, field_name)
    if best is not None:
        return best.value
    default = tool_defaults(read.tool).get(field_name)
    return default[0] if default and default[0] != F.UNDETERMINED else None


# --------------------------------------------------------------------------- literals

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
        if isinstance(value, str):
            if original[:1] in ("'", '"'):
                return json.dumps(value) if original[0] == '"' else "'" + value.replace("'", "''") + "'"
            plain = yaml.safe_load(value) == value if re.fullmatch(r"[\w./+-]+", value) else False
            return value if plain else json.dumps(value)
        return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    return str(value)


def _packages_ok(requires: tuple[str, str | None, str | None] | None, packages: dict[str, str | None]) -> bool:
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


# --------------------------------------------------------------------------- Python edits

_IMPORT_NODES = (ast.Import, ast.ImportFrom)


class _PyWriter:
    """Keyword and statement insertions into one Python script (ast-positioned text edits)."""

    def __init__(self, text: _Text, tree: ast.Module, edits: _Edits):
        self.t = text
        self.tree = tree
        self.edits = edits
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        self.calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)),
                            key=lambda n: (n.lineno, n.col_offset))
        self.tokenizers = self._tokenizer_vars()
        self.pending: dict[int, tuple[ast.Call, list[tuple[str, str]]]] = {}
        self.imports: list[str] = []
        self.statements: list[str] = []

    def _tokenizer_vars(self) -> dict[str, list[ast.Assign]]:
        out: dict[str, list[ast.Assign]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and re.search(
                    r"Tokenizer\w*\.from_pretrained$", dotted(node.value.func)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out.setdefault(target.id, []).append(node)
        return out

    def scope(self, node: ast.AST) -> ast.AST:
        while id(node) in self.parents:
            node = self.parents[id(node)]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return self.tree

    def find_calls(self, pattern: str) -> list[ast.Call]:
        if pattern == "<args>":
            return [c for c in self.calls if dotted(c.func).rsplit(".", 1)[-1] in F.TRAINING_ARGS_CLASSES]
        if pattern == "<tokenizer>":
            return [c for c in self.calls if isinstance(c.func, ast.Name) and c.func.id in self.tokenizers]
        return [c for c in self.calls if re.search(pattern, dotted(c.func))]

    def callee_of(self, node: ast.AST) -> str:
        """The callee that built ``node``: ``f(...)`` -> ``f``; a variable -> the call assigned to it."""
        if isinstance(node, ast.Call):
            return dotted(node.func)
        if isinstance(node, ast.Name):
            for a in ast.walk(self.tree):
                if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
                        isinstance(t, ast.Name) and t.id == node.id for t in a.targets):
                    return dotted(a.value.func)
        return dotted(node)

    @staticmethod
    def keyword(call: ast.Call, name: str) -> ast.keyword | None:
        return next((kw for kw in call.keywords if kw.arg == name), None)

    def add_keyword(self, call: ast.Call, name: str, source: str) -> None:
        self.pending.setdefault(id(call), (call, []))[1].append((name, source))

    def imported(self, name: str) -> bool:
        for node in ast.walk(self.tree):
            if isinstance(node, _IMPORT_NODES) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        return False

    def tokenizer_for(self, call: ast.Call) -> str | None:
        """A tokenizer variable assigned in the call's own function (or at module level)."""
        where = self.scope(call)
        for name, assigns in self.tokenizers.items():
            if any(self.scope(a) in (where, self.tree) and a.lineno < call.lineno for a in assigns):
                return name
        return None

    # -- rendering the pending insertions as text edits ------------------------------------------
    def flush(self) -> None:
        for call, kws in self.pending.values():
            self._insert_keywords(call, kws)
        if self.imports or self.statements:
            self._insert_after_imports()

    def _insert_keywords(self, call: ast.Call, kws: list[tuple[str, str]]) -> None:
        t = self.t
        start, end = t.node_offsets(call)
        close = end - 1                       # the call's ')'
        args = [*call.args, *call.keywords]
        if not args:
            self.edits.add(close, close, ", ".join(f"{k}={v}" for k, v in kws))
            return
        last = max(args, key=lambda a: (a.end_lineno, a.end_col_offset))
        last_end = t.node_offsets(last)[1]
        between = t.text[last_end:close]
        has_comma = re.match(r"\s*,", between) is not None
        if last.end_lineno == call.end_lineno:             # ')' right after the last argument
            if last.lineno == call.lineno:                  # a one-line call
                self.edits.add(last_end, last_end, "".join(f", {k}={v}" for k, v in kws))
                return
            first = min(args, key=lambda a: (a.lineno, a.col_offset))
            indent = t.indent_of(first.lineno if first.lineno != call.lineno else last.lineno)
            self.edits.add(last_end, last_end, "".join(f",\n{indent}{k}={v}" for k, v in kws))
            return
        close_line = t.line_of(close)
        indent = t.indent_of(last.lineno)
        if t.text[t.starts[close_line - 1]:close].strip():  # ')' after other text on its line
            self.edits.add(last_end, last_end, "".join(f",\n{indent}{k}={v}" for k, v in kws))
            return
        if not has_comma:
            self.edits.add(last_end, last_end, ",")
        lines = [f"{indent}{k}={v}," if has_comma or i < len(kws) - 1 else f"{indent}{k}={v}"
                 for i, (k, v) in enumerate(kws)]
        self.edits.add(t.starts[close_line - 1], t.starts[close_line - 1], "\n".join(lines) + "\n")

    def _insert_after_imports(self) -> None:
        imports = [n for n in self.tree.body if isinstance(n, _IMPORT_NODES)]
        if not imports:
            raise PatchError("the script has no module-level imports to place new statements after")
        line = max(n.end_lineno for n in imports)
        at = self.t.starts[line] if line < len(self.t.starts) else len(self.t.text)
        prefix = "" if at == len(self.t.text) and self.t.text.endswith("\n") or at < len(self.t.text) else "\n"
        new = "".join(f"{imp}\n" for imp in self.imports)
        if self.statements:
            new += "\n" + "".join(f"{s}\n" for s in self.statements)
        self.edits.add(at, at, prefix + new)


# --------------------------------------------------------------------------- YAML / JSON insertions

def _yaml_last_line(node: yaml.Node) -> int:
    """0-based last line holding the node's text."""
    if isinstance(node, yaml.MappingNode) and node.value:
        return max(max(_yaml_last_line(k), _yaml_last_line(v)) for k, v in node.value)
    if isinstance(node, yaml.SequenceNode) and node.value:
        return max(_yaml_last_line(v) for v in node.value)
    m = node.end_mark
    return m.line - 1 if m.column == 0 and m.line > node.start_mark.line else m.line


def _yaml_insert(text: _Text, key: str, literal: str) -> tuple[int, str]:
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


def _json_insert(text: _Text, key: str, value: Any, name: str) -> tuple[int, str]:
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


# --------------------------------------------------------------------------- writing fields

def _site_text(t: _Text, span: tuple[int, int, int, int]) -> tuple[int, int, str]:
    a, b = t.offset(span[0], span[1]), t.offset(span[2], span[3])
    return a, b, t.text[a:b]


def _write_sites(t: _Text, read: _Read, edits: _Edits, fld: str, value: Any, touched: set[tuple]) -> set[str]:
    """Rewrite every place the file writes ``fld``; return the keys that now state ``value``."""
    stating: set[str] = set()
    seen: set[tuple] = set()
    for c in read.cands:
        if c.field != fld or c.prov.span is None or not c.conv or c.base_rank <= F.R_WEAK:
            continue
        span = tuple(c.prov.span)
        if span in seen or span in touched:
            continue
        seen.add(span)
        a, b, old = _site_text(t, span)
        original = _original_value(old, read.fmt)
        out, states = render_value(c.conv, value, original)
        if out is INEXPRESSIBLE:
            continue
        if states and c.prov.key:
            stating.add(c.prov.key)
        elif states:
            stating.add(f"@{span}")
        new = _render(out, read.fmt, old.strip())
        if new != old.strip():
            if not old.strip() and read.fmt == "yaml":
                new = " " + new
            edits.add(a, b, new)
        touched.add(span)
    return stating


def _original_value(text: str, fmt: str) -> Any:
    src = text.strip()
    try:
        if fmt == "python":
            return ast.literal_eval(src)
        if fmt in ("json", "yaml"):
            return yaml.safe_load(src) if src else None
    except (ValueError, SyntaxError, yaml.YAMLError):
        pass
    return src.strip("\"'")


def _insert_python(w: _PyWriter, read: _Read, fld: str, value: Any, packages: dict[str, str | None]) -> None:
    """Add ``fld = value`` to a script that never writes it (fields.PY_INSERT / PY_STATEMENTS)."""
    tried = []
    for pattern, kw, conv, requires in F.PY_INSERT.get(fld, []):
        if not _packages_ok(requires, packages):
            tried.append(f"{kw}= needs {requires[0]} in its version range")
            continue
        out, states = render_value(conv, value)
        if out is INEXPRESSIBLE or not states:
            continue
        calls = w.find_calls(pattern)
        if not calls:
            tried.append(f"no {pattern.strip('<>') if pattern.startswith('<') else pattern} call for {kw}=")
            continue
        default = F.PY_KEYWORD_DEFAULTS.get((pattern, kw), INEXPRESSIBLE)
        for call in calls if pattern == "<tokenizer>" else calls[:1]:
            if w.keyword(call, kw) is None and out != default:
                w.add_keyword(call, kw, _render(out, "python"))
        return
    if fld in F.PY_STATEMENTS:
        template, module, comment = F.PY_STATEMENTS[fld]
        if not w.imported(module):
            raise PatchError(f"script does not import {module} at module level; cannot place "
                             f"{template.format(value=value)}")
        w.statements.append(f"{template.format(value=value)}  # goblin: {comment}")
        return
    why = "; ".join(tried) or "no known place for it"
    raise PatchError(f"no place to write {fld} in this Python script ({why})")


def _meet_needs(w: _PyWriter, fld: str, value: Any) -> None:
    """Add what a value needs besides its keyword (fields.PY_VALUE_NEEDS), e.g. a padding collator."""
    need = F.PY_VALUE_NEEDS.get((fld, value))
    if need is None:
        return
    consumers, template, import_line, met_by = need
    for pattern, kw in consumers:
        calls = w.find_calls(pattern)
        if not calls:
            continue
        call = calls[0]
        given = w.keyword(call, kw)
        if given is not None:
            name = w.callee_of(given.value)
            if name.rsplit(".", 1)[-1] in met_by:
                return
            raise PatchError(f"{dotted(call.func)}(...) line {call.lineno} already has {kw}="
                             f"{ast.unparse(given.value)}, not known to pad each batch")
        if pattern == F.TRAINER_CALL and any(w.keyword(call, k) for k in F.TRAINER_TOKENIZER_KWARGS):
            return      # the Trainer builds DataCollatorWithPadding from its tokenizer itself
        tok = w.tokenizer_for(call)
        if tok is None:
            raise PatchError(f"no tokenizer variable in scope of {dotted(call.func)}(...) line {call.lineno} "
                             f"to build {template.split('(')[0]} from")
        w.add_keyword(call, kw, template.format(tokenizer=tok))
        name = import_line.rsplit(" ", 1)[-1]
        if not w.imported(name) and import_line not in w.imports:
            w.imports.append(import_line)
        return
    raise PatchError(f"{fld}={value!r} needs {template.split('(')[0]} and there is no "
                     f"{' or '.join(p for p, _ in consumers)} call to pass it to")


def _mapping_key(tool: str, fld: str, value: Any, present: set[str], packages: dict[str, str | None]):
    """The tool's synonym to add for ``fld`` (fields.SYNONYMS), with its converter."""
    old = deprecated_keys(tool)
    for f, key, conv, rank in tool_rows(tool):
        if f != fld or key in present or key in old or rank < F.R_CALL:
            continue
        gate = next((F.VERSIONED_KEYS[(t, key)] for t in (tool, "hf") if (t, key) in F.VERSIONED_KEYS), None)
        if not _packages_ok(gate, packages):
            continue
        out, states = render_value(conv, value)
        if out is not INEXPRESSIBLE and states:
            return key, out
    raise PatchError(f"no {F.TOOL_NAMES.get(tool, tool)} key can state {fld}={value!r}")


def edit_source(config: ConfigDict, changes: dict[str, Any], source: Path | None = None,
                packages: dict[str, str | None] | None = None) -> str:
    """The user's file (``source``, default ``config.source_file``) with ``changes`` applied.

    Parameters
    ----------
    config : ConfigDict
        The parsed config (its provenance says which file each value came from).
    changes : dict
        ConfigDict field -> new value.
    source : Path, optional
        The parsed file (``config.source_file`` may be relative or redacted).
    packages : dict, optional
        Installed versions of version-gated libraries (default: this
        environment), to choose keys such as ``train_sampling_strategy``.

    Returns
    -------
    str
        The patched text; untouched lines, comments and formatting unchanged.

    Raises
    ------
    PatchError
        A field cannot be written in this file (no key, call or statement
        can carry it), its value lives in a companion file, or the patched
        text does not read back as the new values.
    """
    path = Path(source or config.source_file)
    text = _Text(path.read_text(encoding="utf-8"))
    fmt = _FORMATS.get(path.suffix.lower(), "text")
    packages = installed_packages() if packages is None else packages
    read = _read(text.text, path.name, fmt)
    edits = _Edits(text)
    writer = _PyWriter(text, read.tree, edits) if read.tree is not None else None
    touched: set[tuple] = set()
    for fld, value in changes.items():
        prov = config.provenance.get(fld)
        if prov is not None and prov.file and prov.kind != "unset" and Path(prov.file).name != path.name:
            raise PatchError(f"{fld} is set in {prov.file}, not in {path.name}; edit that file")
        stating = _write_sites(text, read, edits, fld, value, touched)
        if not stating:
            if writer is not None:
                _insert_python(writer, read, fld, value, packages)
            elif fmt in ("json", "yaml"):
                present = {c.prov.key for c in read.cands if c.prov.key}
                key, out = _mapping_key(read.tool, fld, value, present, packages)
                at, new = (_json_insert(text, key, out, path.name) if fmt == "json"
                           else _yaml_insert(text, key, _render(out, "yaml")))
                edits.add(at, at, new)
            else:
                raise PatchError(f"{path.name}: {fld} is not written in the file and nothing can be "
                                 f"inserted into a {fmt} file")
        if writer is not None:
            _meet_needs(writer, fld, value)
    if writer is not None:
        writer.flush()
    patched = edits.apply()
    if patched != text.text:
        back = _read(patched, path.name, fmt)
        wrong = {f: _reads_as(back, f) for f, v in changes.items() if _reads_as(back, f) != v}
        if wrong:
            raise PatchError(f"{path.name}: after the edit " + ", ".join(
                f"{f} reads {got!r}, not {changes[f]!r}" for f, got in wrong.items()))
    return patched


def unified_diff(original: str, patched: str, relpath: str) -> str:
    """A ``git apply``/``patch -p1`` compatible unified diff of one file."""
    out = "".join(difflib.unified_diff(
        original.splitlines(keepends=True), patched.splitlines(keepends=True),
        fromfile=f"a/{relpath}", tofile=f"b/{relpath}"))
    if out and not out.endswith("\n"):   # a last line without newline
        out += "\n\\ No newline at end of file\n"
    return out


# --------------------------------------------------------------------------- uplift

def _uplift(applied: list[AppliedRule], kb: KnowledgeBase, sh: dict[str, float],
            conflicted: int) -> tuple[float, float, list[str]]:
    """(recoverable share of the step, rule_consistency, notes on rules sharing a bucket)."""
    by_bucket: dict[str, list[Rule]] = {}
    for a in applied:
        r = kb.by_id[a.rule_id]
        by_bucket.setdefault(r.targets_bucket, []).append(r)
    combined = naive = 0.0
    notes = []
    for bucket, rules in by_bucket.items():
        share = sh.get(bucket, 0.0)
        keep = 1.0
        for r in rules:
            keep *= 1.0 - r.recovery_fraction
        frac = 1.0 - keep
        combined += frac * share
        naive += min(1.0, sum(r.recovery_fraction for r in rules)) * share
        if len(rules) > 1:
            ids = " and ".join(r.id for r in rules)
            terms = "".join(f"(1 - {r.recovery_fraction:g})" for r in rules)
            notes.append(
                f"{ids} both target `{bucket}` ({share:.0%} of the step): their savings overlap, so they are "
                f"combined as 1 - {terms} = {frac:.2f} of the bucket, not the sum "
                f"{min(1.0, sum(r.recovery_fraction for r in rules)):.2f}")
    overlap = combined / naive if naive > 0 else 1.0
    agree = len(applied) / (len(applied) + conflicted) if applied else 1.0
    if conflicted:
        notes.append(f"{conflicted} fired rule(s) conflicted with an applied one and were dropped "
                     f"(consistency x{agree:.2f})")
    return min(MAX_RECOVERABLE, combined), overlap * agree, notes


# --------------------------------------------------------------------------- propose_patch

def _superseded(rule: Rule, values: dict[str, Any], changes: dict[str, Any], cores: int) -> tuple[str, str] | None:
    """A ``config.*`` condition of ``rule`` that held on the original config but not after ``changes``.

    E.g. a TF32-for-fp32 rule once a higher-uplift rule has switched the run
    to bf16.  Returns ``(condition, field)`` or None.
    """
    if not changes:
        return None
    ctx = {"config": {**values, **changes}, "cores": cores}
    for cond in rule.detect:
        path = cond.split()[0] if cond.split() else ""
        fld = path.removeprefix("config.")
        if not path.startswith("config.") or fld not in changes:
            continue
        holds, why = check_condition(cond, ctx)
        if not holds and "not available" not in why:
            return cond, fld
    return None


def propose_patch(config: ConfigDict, kb: KnowledgeBase, matches: list[RuleMatch], metrics: RunMetrics,
                  cores: int, workload_root: Path | None = None, out_dir: Path | None = None,
                  source: Path | None = None, packages: dict[str, str | None] | None = None) -> Patch:
    """Apply the fired rules' transforms; return the Patch with its diff and predicted uplift.

    Parameters
    ----------
    config, kb, matches, metrics
        The parsed config, the knowledge base, the rules checked on this run,
        and the profiled run (its waste budget weighs each rule).
    cores : int
        CPU cores of the job (the ``cores`` name in fix expressions).
    workload_root : Path, optional
        The folder the diff's paths are relative to (default: the file's).
    out_dir : Path, optional
        When given, a copy of the workload folder with the patched file is
        written to ``out_dir/workload`` (``Patch.patched_file``), so the
        patched run never touches the user's folder.
    source : Path, optional
        The parsed file (default ``config.source_file``, which the parser may
        store relative or redacted).
    packages : dict, optional
        Installed library versions for version-gated keys (default: this
        environment's).

    Returns
    -------
    Patch
        ``applied`` in order of predicted uplift, ``dropped`` with the reason
        per rule (a conflict names the winner and why), the diff against the
        user's file, ``expected_speedup_low/high`` and ``confidence``.

    Units
    -----
    ``AppliedRule.predicted_recovery`` is a share of the step time (0..1);
    speedups are ratios of throughput.

    Raises
    ------
    PatchError
        The source file cannot be read.
    """
    src = Path(source or config.source_file)
    packages = installed_packages() if packages is None else packages
    sh = shares(metrics.waste_budget)
    fired = [kb.by_id[m.rule_id] for m in matches if m.fired and m.rule_id in kb.by_id]

    def uplift(r: Rule) -> float:
        return r.recovery_fraction * sh.get(r.targets_bucket, 0.0)

    fired.sort(key=lambda r: (-uplift(r), r.id))
    values = config.values()
    changes: dict[str, Any] = {}
    owner: dict[str, str] = {}
    env: dict[str, str] = {}
    unset_env: list[str] = []
    applied: list[AppliedRule] = []
    dropped: list[str] = []
    conflicted = 0
    for rule in fired:
        names = {"cores": cores, **values, **changes}
        try:
            proposal: dict[str, Any] = {}
            for fld, raw in rule.fix.config.items():
                proposal[fld] = eval_fix_value(raw, {**names, **proposal})
        except Exception as exc:  # KBError: an unknown name; the rule cannot apply here
            dropped.append(f"{rule.id}: transform not applicable ({exc})")
            continue
        gone = _superseded(rule, values, changes, cores)
        if gone is not None:
            conflicted += 1
            cond, fld = gone
            dropped.append(f"{rule.id}: superseded by {owner[fld]}: after its change ({fld} "
                           f"{values.get(fld)!r} -> {changes[fld]!r}) `{cond}` no longer holds; {owner[fld]} wins "
                           f"with the larger predicted uplift ({uplift(kb.by_id[owner[fld]]):.1%} vs "
                           f"{uplift(rule):.1%} of the step)")
            continue
        clash = [f for f, v in proposal.items() if f in changes and changes[f] != v]
        clash += [f"env.{k}" for k, v in rule.fix.env.items() if (k in env and env[k] != v) or k in unset_env]
        clash += [f"env.{k}" for k in rule.fix.unset_env if k in env]
        if clash:
            conflicted += 1
            what = clash[0]
            winner = owner[what]
            if what.startswith("env."):
                var = what[4:]
                mine, theirs = rule.fix.env.get(var, "unset"), env.get(var, "unset")
            else:
                mine, theirs = proposal[what], changes[what]
            dropped.append(f"{rule.id}: conflicts with {winner} on {what} ({mine!r} vs {theirs!r}); {winner} wins "
                           f"with the larger predicted uplift ({uplift(kb.by_id[winner]):.1%} vs "
                           f"{uplift(rule):.1%} of the step)")
            continue
        proposal = {f: v for f, v in proposal.items() if values.get(f) != v}
        if not proposal and not rule.fix.env and not rule.fix.unset_env:
            dropped.append(f"{rule.id}: the config already has the values this rule sets")
            continue
        if proposal:
            try:
                edit_source(config, {**changes, **proposal}, src, packages)
            except PatchError as exc:
                dropped.append(f"{rule.id}: cannot edit the file ({exc})")
                continue
        changes.update(proposal)
        owner.update({f: rule.id for f in proposal})
        owner.update({f"env.{k}": rule.id for k in [*rule.fix.env, *rule.fix.unset_env]})
        env.update(rule.fix.env)
        unset_env.extend(v for v in rule.fix.unset_env if v not in unset_env)
        applied.append(AppliedRule(
            rule_id=rule.id, category=rule.category, targets_bucket=rule.targets_bucket,
            citation=rule.citation, rationale=rule.expected_impact.strip(), predicted_recovery=uplift(rule),
            changes={**{f: {"from": values.get(f), "to": v} for f, v in proposal.items()},
                     **{f"env.{k}": {"to": v} for k, v in rule.fix.env.items()},
                     **{f"env.{k}": {"to": None} for k in rule.fix.unset_env}},
        ))
    original = src.read_text(encoding="utf-8")
    patched = edit_source(config, changes, src, packages) if changes else original
    root = workload_root or src.parent
    rel = src.resolve().relative_to(root.resolve()).as_posix()
    diff = unified_diff(original, patched, rel)
    recoverable, consistency, notes = _uplift(applied, kb, sh, conflicted)
    coverage = evidence_coverage(metrics.waste_budget)
    patch = Patch(
        new_config={**values, **changes}, diff=diff, target_file=str(src), applied=applied, dropped=dropped,
        env=env, unset_env=unset_env, expected_speedup_low=1.0 / (1.0 - recoverable / 2),
        expected_speedup_high=1.0 / (1.0 - recoverable), confidence=coverage * consistency,
        evidence_coverage=coverage, rule_consistency=consistency, consistency_notes=notes,
    )
    if out_dir is not None:
        copy = Path(out_dir) / "workload"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        (copy / rel).write_text(patched, encoding="utf-8")
        patch.patched_file = str(copy / rel)
    return patch
