"""Python training scripts, read with ``ast`` (never executed).

Values are resolved statically through literals, module constants, simple
arithmetic, ``os.environ.get`` defaults, argparse ``add_argument(default=)``,
dataclass field defaults (the HfArgumentParser pattern), ``dict(...)`` /
``{...}`` unpacked with ``**`` and dict look-ups.  Each resolved value keeps
the node of the source text that holds it, so its span can be patched.

What the script's calls mean is data (``fields.CALL_FIELDS``,
``fields.TRAINING_ARGS_CLASSES``, ``fields.OPTIMIZER_CLASSES`` ...); the code
here only resolves values and finds the calls.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from goblin_assets.audit import fields as F
from goblin_assets.audit.config_map import (
    DEFER, SKIP, Found, Raw, Undetermined, Weak, convert, found, map_entries, optimizer_name,
)
from goblin_assets.contracts import Provenance

_KIND_ORDER = ("literal", "variable", "default", "env", "inferred")
_MAX_DEPTH = 60
_NUMBER_LIMIT = 10 ** 18
#: Resolution steps per script (results are memoised; this bounds pathological files).
_RESOLVE_BUDGET = 100_000


def _stronger(a: str, b: str) -> str:
    return a if _KIND_ORDER.index(a) >= _KIND_ORDER.index(b) else b


@dataclass
class Resolved:
    """A statically resolved value and the node holding its source text."""

    value: Any                                   # plain value, dict[str, Resolved] or Undetermined
    node: ast.AST | None = None
    kind: str = "literal"
    notes: tuple[str, ...] = ()

    def via(self, kind: str, note: str = "") -> Resolved:
        notes = self.notes + ((note,) if note and note not in self.notes else ())
        return Resolved(self.value, self.node, _stronger(self.kind, kind), notes)


def _undetermined(reason: str) -> Resolved:
    return Resolved(Undetermined(reason), None, "literal")


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain; ``?.c`` when the base is not a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return ".".join(reversed(parts))


@dataclass
class _ArgDef:
    default: ast.AST | None
    implicit: Any = None          # store_true / store_false default
    required: bool = False


@dataclass
class _Assign:
    line: int
    value: ast.AST
    module_level: bool


@dataclass
class PythonResult:
    """What the analysis of one script yields."""

    tool: str
    found: list[Found] = field(default_factory=list)
    raws: dict[str, Raw] = field(default_factory=dict)      # trainer-argument keys seen
    warnings: list[str] = field(default_factory=list)


class _Collector(ast.NodeVisitor):
    """One pass over the module: assignments, argparse, dataclasses, imports, calls."""

    def __init__(self) -> None:
        self.assigns: dict[str, list[_Assign]] = {}
        self.argparse: dict[str, _ArgDef] = {}
        self.dc_fields: dict[str, ast.AST | None] = {}
        self.ta_classes: list[tuple[str, str, dict[str, ast.AST | None]]] = []
        self.imports: dict[str, str] = {}
        self.calls: list[ast.Call] = []
        self.parents: dict[int, ast.AST] = {}
        self.assigned_from: dict[str, str] = {}       # variable -> dotted callee it was assigned from
        self._depth = 0

    def generic_visit(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.parents[id(child)] = node
            if not isinstance(child, (ast.Constant, ast.Name, ast.expr_context)):
                self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            head = alias.name.split(".")[0]
            self.imports[alias.asname or head] = alias.name if alias.asname else head
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.imports[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}".lstrip(".")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        fields_: dict[str, ast.AST | None] = {}
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields_[stmt.target.id] = _field_default(stmt.value)
        self.dc_fields.update(fields_)
        for base in node.bases:
            tool = F.TRAINING_ARGS_CLASSES.get(dotted(base).rsplit(".", 1)[-1])
            if tool:
                self.ta_classes.append((node.name, tool, fields_))
                break
        self._depth += 1
        for child in ast.iter_child_nodes(node):
            self.parents[id(child)] = node
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign):
                if stmt.value is not None:
                    self.visit(stmt.value)
            else:
                self.visit(stmt)
        self._depth -= 1

    def _record(self, target: ast.AST, value: ast.AST, line: int) -> None:
        if isinstance(target, ast.Name):
            self.assigns.setdefault(target.id, []).append(_Assign(line, value, self._depth == 0))
            if isinstance(value, ast.Call):
                self.assigned_from[target.id] = dotted(value.func)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._record(target, node.value, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._record(node.target, node.value, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.calls.append(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            self._add_argument(node)
        elif isinstance(func, ast.Attribute) and func.attr == "set_defaults":
            for kw in node.keywords:
                if kw.arg:
                    self.argparse[kw.arg] = _ArgDef(kw.value)
        self.generic_visit(node)

    def _add_argument(self, node: ast.Call) -> None:
        kws = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        dest = None
        if isinstance(kws.get("dest"), ast.Constant):
            dest = kws["dest"].value
        else:
            longs = [n for n in names if n.startswith("--")] or names
            if longs:
                dest = longs[0].lstrip("-").replace("-", "_")
        if not dest:
            return
        action = kws.get("action")
        action = action.value if isinstance(action, ast.Constant) else None
        implicit = {"store_true": False, "store_false": True}.get(action)
        required = isinstance(kws.get("required"), ast.Constant) and kws["required"].value is True
        self.argparse[dest] = _ArgDef(kws.get("default"), implicit, required)


def _field_default(value: ast.AST | None) -> ast.AST | None:
    """The default of ``x: T = v`` or ``x: T = field(default=v)``."""
    if isinstance(value, ast.Call) and dotted(value.func).rsplit(".", 1)[-1] == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return kw.value
        return None
    return value


class _Script:
    """A parsed script and the static resolver over it."""

    def __init__(self, text: str, file: str):
        self.file = file
        self.lines = re.split(r"\r\n|\r|\n", text)
        self.tree = ast.parse(text, filename=file)
        self.c = _Collector()
        self.c.visit(self.tree)
        self.c.calls.sort(key=lambda n: (n.lineno, n.col_offset))
        self._memo: dict[tuple[int, int | None], Resolved] = {}
        self._budget = _RESOLVE_BUDGET
        self.tokenizers = {name for name, callee in self.c.assigned_from.items()
                           if re.search(r"Tokenizer\w*\.from_pretrained$", callee)}

    # ------------------------------------------------------------------ positions

    def _char_col(self, line: int, byte_col: int) -> int:
        if not 0 < line <= len(self.lines):
            return byte_col
        return len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def span(self, node: ast.AST | None) -> tuple[int, int, int, int] | None:
        if node is None or getattr(node, "end_lineno", None) is None:
            return None
        return (node.lineno, self._char_col(node.lineno, node.col_offset),
                node.end_lineno, self._char_col(node.end_lineno, node.end_col_offset))

    def raw(self, res: Resolved, at: ast.AST, detail: str = "") -> Raw:
        """A Resolved value as a Raw (dicts are flattened by the caller)."""
        node = res.node if res.node is not None else None
        line = node.lineno if node is not None else getattr(at, "lineno", None)
        notes = "; ".join(res.notes + ((detail,) if detail else ()))
        value = res.value
        if isinstance(value, dict):
            value = {k: v.value for k, v in value.items()}
        return Raw(value, self.file, line, self.span(node) if not isinstance(value, Undetermined) else None,
                   res.kind, notes)

    # ------------------------------------------------------------------ resolution

    def fullname(self, node: ast.AST) -> str:
        """Dotted name with the first part expanded through the imports."""
        name = dotted(node)
        head, _, rest = name.partition(".")
        full = self.c.imports.get(head)
        return f"{full}.{rest}".rstrip(".") if full else name

    def _assignment(self, name: str, line: int | None) -> _Assign | None:
        cands = self.c.assigns.get(name, [])
        if len(cands) <= 1:
            return cands[0] if cands else None
        if line is not None:
            before = [a for a in cands if a.line < line]
            if before:
                return before[-1]
        module = [a for a in cands if a.module_level]
        return (module or cands)[-1]

    def resolve(self, node: ast.AST | None, line: int | None = None, depth: int = 0) -> Resolved:
        """Resolve ``node`` to a value without running anything."""
        if node is None:
            return _undetermined("no value")
        if depth > _MAX_DEPTH:
            return _undetermined("too many indirections to resolve")
        line = getattr(node, "lineno", line) if line is None else line
        key = (id(node), line)
        if key in self._memo:
            return self._memo[key]
        self._budget -= 1
        if self._budget < 0:
            return _undetermined("too complex to resolve statically")
        method = getattr(self, "_r_" + type(node).__name__, None)
        if method is None:
            return _undetermined(f"`{_short(node)}` is computed at run time")
        try:
            result = method(node, line, depth + 1)
        except (ArithmeticError, ValueError, TypeError, OverflowError, MemoryError):
            result = _undetermined(f"`{_short(node)}` could not be evaluated statically")
        self._memo[key] = result
        return result

    def _r_Constant(self, node: ast.Constant, line: int | None, depth: int) -> Resolved:
        return Resolved(node.value, node)

    def _r_Name(self, node: ast.Name, line: int | None, depth: int) -> Resolved:
        assign = self._assignment(node.id, line)
        if assign is None:
            if node.id in self.c.imports:
                return Resolved(self.c.imports[node.id], node)
            return _undetermined(f"`{node.id}` has no value in the file (set at run time)")
        return self.resolve(assign.value, assign.line, depth).via("variable")

    def _r_Attribute(self, node: ast.Attribute, line: int | None, depth: int) -> Resolved:
        base = node.value
        if isinstance(base, ast.Name) and base.id not in self.c.imports:
            arg = self.c.argparse.get(node.attr)
            if arg is not None:
                return self._argparse_default(node.attr, arg, line, depth)
            if node.attr in self.c.dc_fields:
                default = self.c.dc_fields[node.attr]
                if default is None or (isinstance(default, ast.Constant) and default.value is None):
                    return Resolved(Undetermined(f"dataclass field `{node.attr}` has no default: "
                                                 "set on the command line", cli=True))
                return self.resolve(default, None, depth).via(
                    "default", f"dataclass field default of {node.attr} (a CLI flag may override it)")
        full = self.fullname(node)
        if full.split(".")[0] in {v.split(".")[0] for v in self.c.imports.values()}:
            return Resolved(full, node)
        return _undetermined(f"`{_short(node)}` is only known at run time")

    def _argparse_default(self, dest: str, arg: _ArgDef, line: int | None, depth: int) -> Resolved:
        note = f"argparse default of --{dest.replace('_', '-')} (a command-line flag may override it)"
        none = isinstance(arg.default, ast.Constant) and arg.default.value is None
        if arg.default is not None and not none:
            return self.resolve(arg.default, None, depth).via("default", note)
        if arg.implicit is not None:
            return Resolved(arg.implicit, None, "default", (note,))
        if arg.required:
            return Resolved(Undetermined(f"--{dest} is a required command-line argument", cli=True))
        return Resolved(Undetermined(f"--{dest} has no default (None unless passed on the command line)", cli=True))

    def _r_UnaryOp(self, node: ast.UnaryOp, line: int | None, depth: int) -> Resolved:
        inner = self.resolve(node.operand, line, depth)
        if isinstance(inner.value, Undetermined):
            return inner
        ops = {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Not: lambda v: not v}
        op = ops.get(type(node.op))
        if op is None or isinstance(inner.value, (dict, list)):
            return _undetermined(f"`{_short(node)}` is computed at run time")
        return Resolved(op(inner.value), node, inner.kind, inner.notes)

    def _r_BinOp(self, node: ast.BinOp, line: int | None, depth: int) -> Resolved:
        left, right = self.resolve(node.left, line, depth), self.resolve(node.right, line, depth)
        for side in (left, right):
            if isinstance(side.value, Undetermined):
                return side
        a, b = left.value, right.value
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if not numeric and not (isinstance(a, str) and isinstance(b, str) and isinstance(node.op, ast.Add)):
            return _undetermined(f"`{_short(node)}` is computed at run time")
        if isinstance(node.op, ast.Pow) and (abs(b) > 128 or abs(a) > 2 ** 20):
            return _undetermined(f"`{_short(node)}` is too large to evaluate")
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
               ast.Div: lambda x, y: x / y, ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y,
               ast.Pow: lambda x, y: x ** y}
        op = ops.get(type(node.op))
        if op is None:
            return _undetermined(f"`{_short(node)}` is computed at run time")
        value = op(a, b)
        if isinstance(value, (int, float)) and abs(value) > _NUMBER_LIMIT:
            return _undetermined(f"`{_short(node)}` is out of range")
        kind = _stronger(_stronger(left.kind, right.kind), "variable" if left.kind != "literal"
                         or right.kind != "literal" else "literal")
        return Resolved(value, node, kind, left.notes + right.notes)

    def _r_Call(self, node: ast.Call, line: int | None, depth: int) -> Resolved:
        name = dotted(node.func)
        tail = name.rsplit(".", 1)[-1]
        if tail in ("float", "int", "str", "bool") and name == tail and len(node.args) == 1:
            inner = self.resolve(node.args[0], line, depth)
            if isinstance(inner.value, Undetermined) or isinstance(inner.value, (dict, list)):
                return inner
            cast = {"float": float, "int": int, "str": str, "bool": bool}[tail]
            return Resolved(cast(inner.value), inner.node, inner.kind, inner.notes)
        if name.endswith("environ.get") or tail == "getenv":
            return self._env(node, line, depth)
        if name == "dict":
            return Resolved(self._kwargs(node, line, depth), node, "variable")
        if name in ("max", "min") and node.args:
            vals = [self.resolve(a, line, depth) for a in node.args]
            bad = next((v for v in vals if isinstance(v.value, Undetermined)), None)
            if bad:
                return bad
            pick = (max if name == "max" else min)(v.value for v in vals)
            return Resolved(pick, node, "variable", tuple(n for v in vals for n in v.notes))
        return _undetermined(f"`{_short(node)}` is computed by a call at run time")

    def _env(self, node: ast.Call, line: int | None, depth: int) -> Resolved:
        key_node = node.args[0] if node.args else None
        key = key_node.value if isinstance(key_node, ast.Constant) else "?"
        default = node.args[1] if len(node.args) > 1 else next(
            (kw.value for kw in node.keywords if kw.arg == "default"), None)
        if default is None:
            return _undetermined(f"read from ${key} at run time (no default)")
        return self.resolve(default, line, depth).via("env", f"os.environ.get({key!r}) default; ${key} overrides it")

    def _r_Dict(self, node: ast.Dict, line: int | None, depth: int) -> Resolved:
        out: dict[str, Resolved] = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                inner = self.resolve(v, line, depth)
                if isinstance(inner.value, dict):
                    out.update({kk: vv.via(inner.kind) for kk, vv in inner.value.items()})
                continue
            key = self.resolve(k, line, depth)
            if isinstance(key.value, (str, int, float, bool)):
                out[str(key.value)] = self.resolve(v, line, depth)
        return Resolved(out, node, "literal")

    def _r_List(self, node: ast.List | ast.Tuple, line: int | None, depth: int) -> Resolved:
        if len(node.elts) > 1000:
            return _undetermined("list too long")
        items = [self.resolve(e, line, depth) for e in node.elts]
        if any(isinstance(i.value, (Undetermined, dict)) for i in items):
            return _undetermined(f"`{_short(node)}` is computed at run time")
        return Resolved([i.value for i in items], node)

    _r_Tuple = _r_List

    def _r_IfExp(self, node: ast.IfExp, line: int | None, depth: int) -> Resolved:
        notes = [F.RUNTIME_TRUE[tail] for call in ast.walk(node.test) if isinstance(call, ast.Call)
                 and (tail := dotted(call.func).rsplit(".", 1)[-1]) in F.RUNTIME_TRUE]
        if notes and not isinstance(node.test, ast.UnaryOp):
            return self.resolve(node.body, line, depth).via("inferred", "; ".join(notes))
        test = self.resolve(node.test, line, depth)
        if isinstance(test.value, Undetermined):
            return _undetermined(f"`{_short(node)}` depends on a run-time condition")
        branch = node.body if test.value else node.orelse
        return self.resolve(branch, line, depth).via(_stronger(test.kind, "variable"))

    def _r_Subscript(self, node: ast.Subscript, line: int | None, depth: int) -> Resolved:
        base = dotted(node.value)
        key = self.resolve(node.slice, line, depth)
        if base.endswith("environ"):
            return _undetermined(f"read from ${key.value if isinstance(key.value, str) else '?'} at run time")
        if base.endswith("argv"):
            return _undetermined("read from the command line (sys.argv)")
        container = self.resolve(node.value, line, depth)
        if isinstance(key.value, Undetermined):
            return key
        if isinstance(container.value, dict) and str(key.value) in container.value:
            hit = container.value[str(key.value)]
            return hit.via(_stronger(container.kind, key.kind)).via(key.kind, "; ".join(key.notes))
        items = container.value
        if isinstance(items, list) and isinstance(key.value, int) and -len(items) <= key.value < len(items):
            return Resolved(container.value[key.value], None, _stronger(container.kind, "variable"))
        return _undetermined(f"`{_short(node)}` is computed at run time")

    def _r_JoinedStr(self, node: ast.JoinedStr, line: int | None, depth: int) -> Resolved:
        return _undetermined("built by an f-string at run time")

    def _kwargs(self, call: ast.Call, line: int | None, depth: int = 0) -> dict[str, Resolved]:
        """Keyword arguments of ``call`` with ``**mapping`` expanded where it resolves."""
        out: dict[str, Resolved] = {}
        for kw in call.keywords:
            if kw.arg is not None:
                out[kw.arg] = self.resolve(kw.value, line, depth)
                continue
            inner = self.resolve(kw.value, line, depth)
            if isinstance(inner.value, dict):
                out.update({k: v.via(_stronger(inner.kind, "variable"), f"unpacked from **{_short(kw.value)}")
                            for k, v in inner.value.items()})
            else:
                out[f"**{_short(kw.value)}"] = inner
        return out

    def flat_raws(self, values: dict[str, Resolved], at: ast.AST, prefix: str = "", detail: str = "") -> dict[str, Raw]:
        out: dict[str, Raw] = {}
        for key, res in values.items():
            if isinstance(res.value, dict):
                out.update(self.flat_raws(res.value, at, f"{prefix}{key}.", detail))
            else:
                out[prefix + key] = self.raw(res, at, detail)
        return out

    def argument(self, call: ast.Call, name: str) -> ast.AST | None:
        if name.startswith("#"):
            i = int(name[1:])
            return call.args[i] if i < len(call.args) and not isinstance(call.args[i], ast.Starred) else None
        return next((kw.value for kw in call.keywords if kw.arg == name), None)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while id(node) in self.c.parents:
            node = self.c.parents[id(node)]
            yield node


def _short(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- analysis

class _Analysis:
    def __init__(self, script: _Script):
        self.s = script
        self.file = script.file
        self.out: list[Found] = []
        self.raws: dict[str, Raw] = {}
        self.warnings: list[str] = []
        self.tool: str | None = None
        self.optimizer_vars: set[str] = set()
        self.training = False

    def add(self, field_name: str, res: Resolved, conv: str, rank: int, at: ast.AST, detail: str,
            key: str | None = None) -> None:
        """A candidate read from source text: ``key`` is the keyword (or ``#i``) it was written under."""
        base_rank = rank
        raw = self.s.raw(res, at)
        value, note = convert(conv, raw.value)
        if value is SKIP:
            return
        if value is DEFER:
            value = Undetermined("'auto' is resolved at run time")
        if isinstance(value, Weak):
            value, rank = value.value, min(rank, F.R_WEAK)
        text = "; ".join(p for p in (detail, raw.detail, note) if p)
        prov = Provenance(file=self.file, line=raw.line, kind=raw.kind, detail=text, span=raw.span, key=key)
        self.out.append(found(field_name, value, prov, rank, conv, base_rank))

    def infer(self, field_name: str, value: Any, rank: int, at: ast.AST, detail: str) -> None:
        prov = Provenance(file=self.file, line=getattr(at, "lineno", None), kind="inferred", detail=detail)
        self.out.append(found(field_name, value, prov, rank))

    def run(self) -> PythonResult:
        for name, tool, fields_ in self.s.c.ta_classes:
            self.tool = self.tool or tool
            values = {k: (self.s.resolve(v).via("default", f"dataclass field default in class {name} "
                                                           "(a CLI flag may override it)")
                          if v is not None else _undetermined(f"dataclass field {k} has no default"))
                      for k, v in fields_.items()}
            self._trainer_args(values, self.s.tree, f"class {name}")
        for call in self.s.c.calls:
            self._call(call)
        self._names()
        self._grad_accum()
        self._imports()
        imported = [F.TRAINING_ARGS_CLASSES[full.rsplit(".", 1)[-1]] for full in self.s.c.imports.values()
                    if full.rsplit(".", 1)[-1] in F.TRAINING_ARGS_CLASSES]
        if self.tool is None and imported:   # HfArgumentParser((..., TrainingArguments)): defaults + CLI
            self.tool = imported[0]
            self.warnings.append(f"{self.file}: trainer arguments are parsed from the command line; "
                                 "values not in the file are the library defaults")
        tool = self.tool or ("torch" if self.training else "text")
        if tool == "torch":
            self._raw_loop_defaults()
        if tool == "text":
            self.warnings.append(f"{self.file}: no trainer arguments, optimizer or DataLoader found; "
                                 "values come only from variable names")
        return PythonResult(tool, self.out, self.raws, self.warnings)

    def _trainer_args(self, values: dict[str, Resolved], at: ast.AST, origin: str) -> None:
        raws = self.s.flat_raws(values, at)
        for key in raws:
            if key.startswith("**"):
                self.warnings.append(f"{self.file}: {origin} unpacks {key} which could not be resolved; "
                                     "settings inside it are missing")
        self.raws.update(raws)
        self.out.extend(map_entries(self.tool or "hf", raws, origin).found)

    def _call(self, call: ast.Call) -> None:
        s = self.s
        name = dotted(call.func)
        tail = name.rsplit(".", 1)[-1]
        full = s.fullname(call.func)
        line = call.lineno
        if tail in F.TRAINING_ARGS_CLASSES:
            self.tool = self.tool or F.TRAINING_ARGS_CLASSES[tail]
            self.training = True
            self._trainer_args(s._kwargs(call, line), call, f"{tail}(...) line {line}")
            return
        if tail in ("HfArgumentParser", "TrlParser") or tail in ("parse_yaml_file", "parse_json_file"):
            if tail.startswith("parse_"):
                self.warnings.append(f"{self.file}: arguments are read from a file at run time ({tail}); "
                                     "parse that file too")
            return
        callee = "<tokenizer>" if isinstance(call.func, ast.Name) and call.func.id in s.tokenizers else name
        for pattern, args, rank in F.CALL_FIELDS:
            if not re.search(pattern, callee):
                continue
            for arg, (field_name, conv) in args.items():
                node = s.argument(call, arg)
                if node is not None:
                    label = f"argument {arg[1:]}" if arg.startswith("#") else arg
                    self.add(field_name, s.resolve(node, line), conv, rank, call, f"{label} of {name}(...)", key=arg)
            if "attn_implementation" in args:
                for arg in F.LOAD_DTYPE_ARGS:
                    node = s.argument(call, arg)
                    if node is not None:
                        self.add("precision", s.resolve(node, line), "load_dtype", F.R_WEAK, call,
                                 f"{arg} of {name}(...): the model's load dtype", key=arg)
            self._call_defaults(call, callee, name)
            break
        if re.search(F.TRAINER_CALL, name) and s.argument(call, "data_collator") is None and any(
                s.argument(call, k) is not None for k in F.TRAINER_TOKENIZER_KWARGS):
            self.infer("padding", "dynamic", F.R_PATTERN - 1, call,
                       f"{name}(...) gets a tokenizer and no data_collator: it pads each batch with "
                       "DataCollatorWithPadding")
        if tail == "autocast":
            self._autocast(call, name)
        if tail == "DataLoader":
            self.training = True
        is_optimizer = "optim" in full.split(".")[:-1] or full.startswith(("bnb.", "bitsandbytes."))
        if tail in F.OPTIMIZER_CLASSES and is_optimizer:
            self._optimizer(call, full)
        elif tail in F.CHECKPOINTING_CALLS or (tail == "checkpoint" and full.startswith(F.CHECKPOINT_MODULE)):
            off = s.argument(call, "use_gradient_checkpointing")
            if off is None or s.resolve(off).value is not False:
                self.infer("gradient_checkpointing", True, F.R_PATTERN, call,
                           F.CHECKPOINTING_CALLS.get(tail, f"{name}(...) from {F.CHECKPOINT_MODULE}"))
        elif tail in F.PADDING_COLLATORS:
            self._collator(call, name, tail)
        elif tail in F.ATTENTION_CALLS:
            self.infer("attention_impl", F.ATTENTION_CALLS[tail], F.R_PATTERN, call, f"{name}(...) in the code")
        elif tail in F.PRECISION_METHODS and isinstance(call.func, ast.Attribute) and not call.args:
            self.infer("precision", F.PRECISION_METHODS[tail], F.R_PATTERN, call, f".{tail}() cast")
        elif tail == "to" and isinstance(call.func, ast.Attribute):
            node = s.argument(call, "dtype") or next(iter(call.args), None)
            value = s.resolve(node, line).value if node is not None else None
            hit = F.DTYPE_NAMES.get(value.lower()) if isinstance(value, str) else None
            if hit in ("bf16", "fp16"):
                self.infer("precision", hit, F.R_PATTERN, call, f".to({_short(node)}) cast")
        elif tail == F.GRAD_SCALER:
            self.infer("precision", "fp16", F.R_PATTERN - 1, call, "GradScaler is used (fp16 loss scaling)")
        elif tail == "backward":
            self.training = True

    def _collator(self, call: ast.Call, name: str, tail: str) -> None:
        """A padding collator (fields.PADDING_COLLATORS): batches padded per batch unless it says max_length."""
        node = self.s.argument(call, "padding")
        value = self.s.resolve(node, call.lineno).value if node is not None else None
        if isinstance(value, str) and value.strip().lower().rsplit(".", 1)[-1] == "max_length":
            self.add("padding", self.s.resolve(node, call.lineno), "tokenizer_padding", F.R_PATTERN, call,
                     f"padding of {name}(...)", key="padding")
            return
        strategy = F.PADDING_COLLATORS[tail]
        self.infer("padding", strategy, F.R_PATTERN, call,
                   f"{name}(...) " + ("packs sequences into rows" if strategy == "packed"
                                      else "pads each batch to its longest sequence"))

    def _call_defaults(self, call: ast.Call, callee: str, name: str) -> None:
        for pattern, defaults in F.CALL_DEFAULTS:
            if not re.search(pattern, callee):
                continue
            present = {f for f, _ in self._arg_fields(pattern) if self._has_field_arg(call, pattern, f)}
            for field_name, (value, detail) in defaults.items():
                if field_name not in present:
                    prov = Provenance(file=self.file, line=call.lineno, kind="default",
                                      detail=f"{detail} ({name}(...) line {call.lineno} does not set it)")
                    self.out.append(found(field_name, value, prov, F.R_CALL))

    @staticmethod
    def _arg_fields(pattern: str) -> list[tuple[str, str]]:
        for p, args, _ in F.CALL_FIELDS:
            if p == pattern:
                return [(f, a) for a, (f, _) in args.items()]
        return []

    def _has_field_arg(self, call: ast.Call, pattern: str, field_name: str) -> bool:
        return any(self.s.argument(call, a) is not None for f, a in self._arg_fields(pattern) if f == field_name)

    def _autocast(self, call: ast.Call, name: str) -> None:
        if self.s.argument(call, "dtype") is not None or len(call.args) > 1:
            return
        device = self.s.argument(call, "device_type") or next(iter(call.args), None)
        value = self.s.resolve(device).value if device is not None else None
        if value is None and name.startswith(("torch.cuda", "cuda")):
            value = "cuda"
        hit = F.AUTOCAST_DEFAULT_DTYPE.get(value) if isinstance(value, str) else None
        if hit:
            self.infer("precision", hit, F.R_PATTERN, call, f"{name}(device_type={value!r}) without dtype: "
                                                             f"autocast's default for {value} is {hit}")
        else:
            self.out.append(found("precision", Undetermined(f"{name}(...) on a device chosen at run time"),
                                  Provenance(file=self.file, line=call.lineno), F.R_PATTERN))

    def _optimizer(self, call: ast.Call, full: str) -> None:
        self.training = True
        fused = self.s.argument(call, "fused")
        fused_value = self.s.resolve(fused).value if fused is not None else None
        name, note = optimizer_name(full, fused_value)
        self.infer("optimizer", name, F.R_CALL, call, f"{note} constructor")
        lr = self.s.argument(call, "lr")
        if lr is None and len(call.args) > 1:
            lr = call.args[1]
        if lr is not None:
            self.add("lr", self.s.resolve(lr, call.lineno), "float", F.R_CALL, call, f"lr of {full}(...)",
                     key="lr" if self.s.argument(call, "lr") is not None else "#1")
        else:
            default = F.OPTIMIZER_CLASSES[full.rsplit(".", 1)[-1]][1]
            prov = Provenance(file=self.file, line=call.lineno, kind="default",
                              detail=f"{full} default lr (torch.optim docs)")
            self.out.append(found("lr", default if default is not None else
                                  Undetermined(f"{full} has no fixed default lr"), prov, F.R_CALL))
        parent = self.s.c.parents.get(id(call))
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            for target in getattr(parent, "targets", [getattr(parent, "target", None)]):
                if isinstance(target, ast.Name):
                    self.optimizer_vars.add(target.id)

    def _names(self) -> None:
        """Argparse dests and module-level variables named like a field (fields.PY_NAMES)."""
        s = self.s
        module_names = {name.lower(): name for name, assigns in s.c.assigns.items()
                        if any(a.module_level for a in assigns)}
        dests = {d.lower(): d for d in s.c.argparse}
        for field_name, names in F.PY_NAMES.items():
            for low in names:
                if low in dests:
                    dest = dests[low]
                    res = s._argparse_default(dest, s.c.argparse[dest], None, 0)
                    where = ""   # the resolved note names the argparse flag
                elif low in module_names:
                    name = module_names[low]
                    assign = next(a for a in reversed(s.c.assigns[name]) if a.module_level)
                    res = s.resolve(assign.value, assign.line).via("variable")
                    where = f"module variable {name}"
                else:
                    continue
                if isinstance(res.value, Undetermined):
                    continue
                gate = _name_gate(s, low)
                if gate is not None:
                    res = gate
                self.add(field_name, res, F.PY_NAME_CONVERTERS[field_name], F.R_NAME, s.tree, where)
                break

    def _grad_accum(self) -> None:
        """``optimizer.step()`` under ``if ... % N == 0`` -> N; unguarded in a loop -> 1."""
        s = self.s
        for call in s.c.calls:
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr == "step"):
                continue
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            arg = call.args[0].id if call.args and isinstance(call.args[0], ast.Name) else ""
            is_opt = owner in self.optimizer_vars or (not call.args and re.search(r"^opt", owner or "-")) \
                or arg in self.optimizer_vars
            if not is_opt:
                continue
            in_loop = False
            for anc in s.ancestors(call):
                if isinstance(anc, ast.If):
                    mod = next((n for n in ast.walk(anc.test)
                                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)), None)
                    if mod is not None:
                        self.add("grad_accum_steps", s.resolve(mod.right, call.lineno), "int", F.R_PATTERN, call,
                                 f"{owner or arg}.step() runs when `{_short(anc.test)}`")
                        return
                if isinstance(anc, (ast.For, ast.While, ast.AsyncFor)):
                    in_loop = True
                if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    break
            if in_loop:
                self.infer("grad_accum_steps", 1, F.R_PATTERN, call,
                           f"{owner or arg}.step() runs on every iteration: no gradient accumulation")
                return

    def _imports(self) -> None:
        for alias, full in self.s.c.imports.items():
            hit = F.ATTENTION_IMPORTS.get(full.split(".")[0])
            if hit:
                self.infer("attention_impl", hit, F.R_PATTERN - 1, self.s.tree, f"imports {full}")

    def _raw_loop_defaults(self) -> None:
        source = "\n".join(self.s.lines)
        if not re.search(r"lr_scheduler|[Ss]chedul|param_groups", source):
            self.infer("warmup_steps", 0, F.R_DEFAULT, self.s.tree,
                       "no learning-rate scheduler or param_groups update in the file: constant lr, no warmup")


def _name_gate(s: _Script, name: str) -> Resolved | None:
    """nanoGPT: warmup_iters only counts when decay_lr (config_formats.md hazard 7)."""
    if name != "warmup_iters" or "decay_lr" not in s.c.assigns:
        return None
    decay = s.resolve(s.c.assigns["decay_lr"][-1].value)
    if decay.value is False:
        return Resolved(0, None, "inferred", ("decay_lr=False: warmup_iters is ignored (constant lr)",))
    return None


def analyse_python(text: str, file: str) -> PythonResult:
    """Statically analyse a Python training script.

    Returns
    -------
    PythonResult
        The tool it uses (``hf``, ``trl_sft``, ``trl``, ``torch`` for a raw
        loop, ``text`` when nothing is recognised), the candidates found, the
        trainer-argument keys seen and warnings.

    Raises
    ------
    SyntaxError, RecursionError, ValueError, MemoryError
        From ``ast.parse``; ``parse_config`` falls back to the regex scanner.
    """
    script = _Script(text, file)
    return _Analysis(script).run()
