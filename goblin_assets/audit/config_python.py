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
    DEFER, SKIP, Found, LibraryChoice, Raw, Undetermined, Weak, class_default, convert, found, map_entries,
    optimizer_name,
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
    ext: Raw | None = None                       # the value is written in another file (a launch line)

    def via(self, kind: str, note: str = "") -> Resolved:
        notes = self.notes + ((note,) if note and note not in self.notes else ())
        return Resolved(self.value, self.node, _stronger(self.kind, kind), notes, self.ext)


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
    scope: ast.AST | None = None                 # the enclosing function (None: module level)
    stmt: ast.AST | None = None                  # the assignment statement (for liveness)


@dataclass
class PythonResult:
    """What the analysis of one script yields."""

    tool: str
    found: list[Found] = field(default_factory=list)
    raws: dict[str, Raw] = field(default_factory=dict)      # trainer-argument keys seen
    warnings: list[str] = field(default_factory=list)
    cls: str | None = None                                  # the library config class built (DPOConfig ...)


class _Collector(ast.NodeVisitor):
    """One pass over the module: assignments, argparse, dataclasses, imports, calls."""

    def __init__(self) -> None:
        self.assigns: dict[str, list[_Assign]] = {}
        self.argparse: dict[str, _ArgDef] = {}
        self.dc_fields: dict[str, ast.AST | None] = {}
        self.ta_classes: list[tuple[str, str, dict[str, ast.AST | None], str]] = []   # (class, tool, fields, base)
        self.imports: dict[str, str] = {}
        self.calls: list[ast.Call] = []
        self.parents: dict[int, ast.AST] = {}
        self.assigned_from: dict[str, str] = {}       # variable -> dotted callee it was assigned from
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[str, dict[str, ast.AST | None]] = {}     # class in the file -> field defaults
        self.click_defaults: dict[tuple[str, str], ast.AST | None] = {}   # (function, parameter) -> default
        self.entry_decorated: set[str] = set()
        self._depth = 0
        self._scopes: list[ast.AST] = []

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
        self.functions[node.name] = node
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            name = dotted(call.func if call else deco)
            if name.endswith(("command", ".main")) or name in ("command", "main"):
                self.entry_decorated.add(node.name)
            if call is not None and name.rsplit(".", 1)[-1] == "option":
                self._click_option(node.name, call)
        self._depth += 1
        self._scopes.append(node)
        self.generic_visit(node)
        self._scopes.pop()
        self._depth -= 1

    def _click_option(self, func: str, call: ast.Call) -> None:
        """``@click.option("--train-batch-size", default=8)``: the default of parameter ``train_batch_size``."""
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        plain = [n for n in names if not n.startswith("-")]
        dashed = [n.split("/")[0] for n in names if n.startswith("-")]
        if not (plain or dashed):
            return
        param = plain[0] if plain else max(dashed, key=len).lstrip("-").replace("-", "_")
        kws = {kw.arg: kw.value for kw in call.keywords if kw.arg}
        default = kws.get("default")
        if default is None and isinstance(kws.get("is_flag"), ast.Constant) and kws["is_flag"].value is True:
            default = ast.Constant(False)
        self.click_defaults[(func, param)] = default

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        fields_: dict[str, ast.AST | None] = {}
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields_[stmt.target.id] = _field_default(stmt.value)
        self.dc_fields.update(fields_)
        self.classes[node.name] = fields_
        for base in node.bases:
            tail = dotted(base).rsplit(".", 1)[-1]
            tool = F.TRAINING_ARGS_CLASSES.get(tail)
            if tool:
                self.ta_classes.append((node.name, tool, fields_, tail))
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

    def _record(self, target: ast.AST, value: ast.AST, line: int, stmt: ast.AST) -> None:
        if isinstance(target, ast.Name):
            scope = self._scopes[-1] if self._scopes else None
            self.assigns.setdefault(target.id, []).append(_Assign(line, value, self._depth == 0, scope, stmt))
            if isinstance(value, ast.Call):
                self.assigned_from[target.id] = dotted(value.func)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._record(target, node.value, node.lineno, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._record(node.target, node.value, node.lineno, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):      # x //= n is x = x // n
            value = ast.BinOp(left=ast.Name(node.target.id, ast.Load()), op=node.op, right=node.value)
            ast.copy_location(value, node)
            ast.fix_missing_locations(value)
            value.end_lineno = value.end_col_offset = None     # no source span: never rewritten in place
            self.parents[id(value)] = node
            self.parents[id(value.left)] = value
            self._record(node.target, value, node.lineno, node)
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
    """A parsed script and the static resolver over it.

    ``cli`` holds the flags a launch line passes to the script (normalised
    dest -> Raw in the launch file): they override argparse defaults,
    dataclass field defaults and the parameters of the entry function.
    """

    def __init__(self, text: str, file: str, cli: dict[str, Raw] | None = None):
        self.file = file
        self.cli = cli or {}
        self.lines = re.split(r"\r\n|\r|\n", text)
        self.tree = ast.parse(text, filename=file)
        self.c = _Collector()
        self.c.visit(self.tree)
        self.c.calls.sort(key=lambda n: (n.lineno, n.col_offset))
        self._memo: dict[tuple[int, int | None], Resolved] = {}
        self._live: dict[int, bool | None] = {}
        self._budget = _RESOLVE_BUDGET
        self.tokenizers = {name for name, callee in self.c.assigned_from.items()
                           if re.search(r"Tokenizer\w*\.from_pretrained$", callee)}
        self.call_sites: dict[str, list[tuple[ast.Call, int]]] = {}     # function -> (call, first bound parameter)
        self.entries: set[str] = set(self.c.entry_decorated)
        for call in self.c.calls:
            func = call.func
            if isinstance(func, ast.Name) and func.id in self.c.functions:
                self.call_sites.setdefault(func.id, []).append((call, 0))
            first = call.args[0] if call.args else None
            if isinstance(first, ast.Name) and first.id in self.c.functions:
                tail = dotted(func).rsplit(".", 1)[-1]
                if tail in F.ENTRY_CALLS:
                    self.entries.add(first.id)
                elif tail in F.FUNCTION_LAUNCHERS:       # fabric.launch(main, a, b): main(fabric, a, b)
                    self.call_sites.setdefault(first.id, []).append((call, -1))

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
        """A Resolved value as a Raw (dicts are flattened by the caller); a value from a launch
        line keeps that file's place."""
        if res.ext is not None:
            notes = "; ".join(res.notes + ((detail,) if detail else ()))
            return Raw(res.value, res.ext.file, res.ext.line, res.ext.span, res.kind, notes)
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

    def scope_of(self, node: ast.AST) -> ast.AST | None:
        """The function that contains ``node`` (None at module level)."""
        for anc in self.ancestors(node):
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return anc
        return None

    def _assignment(self, name: str, line: int | None, scope: ast.AST | None = None) -> _Assign | None:
        """The assignment of ``name`` that a use at ``line`` in ``scope`` sees.

        The latest live one before the use in the same function, else the
        module's (latest before the use, else latest); assignments in code
        that does not run under the default values (:meth:`live`) are skipped.
        """
        cands = [a for a in self.c.assigns.get(name, []) if a.stmt is None or self.live(a.stmt) is not False]
        if not cands:
            return None
        local = [a for a in cands if a.scope is scope and scope is not None]
        if local and line is not None:
            before = [a for a in local if a.line <= line and not (a.line == line and self._is_target(a, line))]
            if before:
                return before[-1]
        if scope is not None and self._param(scope, name) is not None:
            return None                                   # a parameter of the function: see _param_value
        if len(cands) == 1:
            return cands[0]
        if line is not None:
            before = [a for a in cands if a.line < line and (a.scope is None or a.scope is scope)]
            if before:
                return before[-1]
        module = [a for a in cands if a.module_level]
        return (module or cands)[-1]

    @staticmethod
    def _is_target(a: _Assign, line: int) -> bool:
        return isinstance(a.stmt, ast.AugAssign) or (isinstance(a.stmt, ast.Assign) and a.line == line)

    @staticmethod
    def _param(func: ast.AST, name: str) -> tuple[int, ast.AST | None, ast.arg] | None:
        """(position, default node, arg) of parameter ``name`` of ``func``, or None."""
        args = func.args
        positional = args.posonlyargs + args.args
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        for i, (arg, default) in enumerate(zip(positional, defaults)):
            if arg.arg == name:
                return i, default, arg
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if arg.arg == name:
                return -1, default, arg
        return None

    def _param_value(self, func: ast.AST, name: str, depth: int) -> Resolved | None:
        """The value parameter ``name`` of ``func`` has: a launch-line flag (entry functions), the
        argument of the function's only call in the file, or its default (click/typer included)."""
        hit = self._param(func, name)
        if hit is None:
            return None
        entry = func.name in self.entries
        if entry and name in self.cli:
            return self._flag(name, self.cli[name])
        bound = self._param_node(func, name)
        if bound is not None and bound[2] is not None:
            node, line, call = bound
            return self.resolve(node, line, depth).via("variable", f"passed as {name} to {func.name}()")
        default = bound[0] if bound is not None else None
        if default is None:
            if entry:
                return Resolved(Undetermined(f"parameter {name} of {func.name}() has no default: set on the "
                                             "command line", cli=True))
            return _undetermined(f"parameter {name} of {func.name}() is set by its caller at run time")
        where = f"{name}={_short(default)} in {func.name}()"
        note = f"default {where} (the command line may override it)" if entry else f"default {where}"
        return self.resolve(default, getattr(default, "lineno", None), depth).via("default", note)

    def _flag(self, dest: str, raw: Raw) -> Resolved:
        note = f"--{dest} on the launch line in {raw.file} overrides the script's default"
        return Resolved(raw.value, None, "literal", (note,), raw)

    def live(self, node: ast.AST) -> bool | None:
        """Whether ``node`` runs when every setting keeps its default value.

        False when an enclosing ``if`` (or conditional expression) takes the
        other branch under the defaults (``if args.bf16:`` with a
        ``store_true`` flag, ``if lora_args.q_lora:`` with ``q_lora=False``);
        None when a test depends on run time; True otherwise.
        """
        key = id(node)
        if key in self._live:
            return self._live[key]
        self._live[key] = None                       # a cycle through the tests: unknown
        verdict: bool | None = True
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, (ast.If, ast.IfExp, ast.While)) and child is not anc.test:
                in_body = child in anc.body if isinstance(anc.body, list) else child is anc.body
                test = self.resolve(anc.test)
                truth = _truth(test.value)
                if truth is None:
                    verdict = None if verdict else verdict
                elif truth != in_body and not isinstance(anc, ast.While):
                    verdict = False
                    break
                elif isinstance(anc, ast.While) and not truth and in_body:
                    verdict = False
                    break
            child = anc
        self._live[key] = verdict
        return verdict

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
        scope = self.scope_of(node)
        assign = self._assignment(node.id, line, scope)
        outer = scope
        while assign is None and outer is not None:
            param = self._param_value(outer, node.id, depth)
            if param is not None:
                return param
            outer = self.scope_of(outer)               # a closure: the enclosing function's names
            if outer is not None:
                local = [a for a in self.c.assigns.get(node.id, []) if a.scope is outer
                         and (a.stmt is None or self.live(a.stmt) is not False)]
                assign = local[-1] if local else None
        if assign is None:
            if node.id in self.c.imports:
                return Resolved(self.c.imports[node.id], node)
            return _undetermined(f"`{node.id}` has no value in the file (set at run time)")
        return self.resolve(assign.value, assign.line, depth).via("variable")

    def _r_Attribute(self, node: ast.Attribute, line: int | None, depth: int) -> Resolved:
        base = node.value
        if isinstance(base, ast.Name) and base.id not in self.c.imports:
            obj = self._object(base, line, depth)
            if obj is not None and node.attr in obj:
                return obj[node.attr].via("variable")
            if obj is not None and "__class__" in obj:
                hit = class_default(obj["__class__"].value, node.attr)
                if hit is not None:
                    return Resolved(hit[0], None, "default", (hit[1],))
            arg = self.c.argparse.get(node.attr)
            if arg is not None:
                return self._argparse_default(node.attr, arg, line, depth)
            if node.attr in self.c.dc_fields:
                if node.attr in self.cli:
                    return self._flag(node.attr, self.cli[node.attr])
                default = self.c.dc_fields[node.attr]
                if default is None or (isinstance(default, ast.Constant) and default.value is None):
                    return Resolved(Undetermined(f"dataclass field `{node.attr}` has no default: "
                                                 "set on the command line", cli=True))
                return self.resolve(default, None, depth).via(
                    "default", f"dataclass field default of {node.attr} (a CLI flag may override it)")
            if node.attr in self.cli and self.c.ta_classes:
                return self._flag(node.attr, self.cli[node.attr])
            for _, _, _, base_cls in self.c.ta_classes:
                hit = class_default(base_cls, node.attr)
                if hit is not None:
                    return Resolved(hit[0], None, "default", (hit[1] + " (a CLI flag may override it)",))
        full = self.fullname(node)
        if full.split(".")[0] in {v.split(".")[0] for v in self.c.imports.values()}:
            return Resolved(full, node)
        return _undetermined(f"`{_short(node)}` is only known at run time")

    def _object(self, name: ast.Name, line: int | None, depth: int) -> dict[str, Resolved] | None:
        """The fields of the object ``name`` holds when it is built in the file: a dataclass of the
        file (its field defaults under the call's arguments) or a known library config class (the
        call's arguments, plus ``__class__`` for its library defaults)."""
        if depth > _MAX_DEPTH:
            return None
        scope = self.scope_of(name)
        assign = self._assignment(name.id, line, scope)
        if assign is not None:
            value, at = assign.value, assign.line
        elif scope is not None and self._param(scope, name.id) is not None:
            value, at, _ = self._param_node(scope, name.id)
            if value is None:
                return None
        else:
            return None
        if isinstance(value, ast.Name):
            return self._object(value, at, depth + 1)
        return self._call_object(value, at, depth + 1)

    def _param_node(self, func: ast.AST, name: str) -> tuple[ast.AST | None, int | None, ast.Call | None] | None:
        """``(node, line, call)``: the argument parameter ``name`` of ``func`` gets at the function's
        only call in the file (``call`` set), else its default (``call`` None; the node may be None)."""
        hit = self._param(func, name)
        if hit is None:
            return None
        pos, default, _ = hit
        sites = self.call_sites.get(func.name, [])
        if len(sites) == 1:
            call, shift = sites[0]
            node = next((kw.value for kw in call.keywords if kw.arg == name), None)
            usable = pos >= 0 and not (shift < 0 and pos == 0)      # launch(fn, ...): fn's first is the launcher's
            if node is None and usable and pos < len(call.args) and not isinstance(call.args[pos], ast.Starred):
                node = call.args[pos]
            if node is not None:
                return node, call.lineno, call
        click = self.c.click_defaults.get((func.name, name), ...)
        default = _option_default(default if click is ... else click)
        return default, getattr(default, "lineno", None), None

    def origin(self, node: ast.AST, depth: int = 0) -> ast.AST:
        """The expression ``node`` stands for under the default values: through names
        (their live assignment) and conditional expressions (the branch the test takes)."""
        if depth > _MAX_DEPTH:
            return node
        if isinstance(node, ast.Name):
            assign = self._assignment(node.id, node.lineno, self.scope_of(node))
            return self.origin(assign.value, depth + 1) if assign is not None else node
        if isinstance(node, ast.IfExp):
            truth = _truth(self.resolve(node.test).value)
            if truth is not None:
                return self.origin(node.body if truth else node.orelse, depth + 1)
        return node

    def _call_object(self, value: ast.AST, at: int | None, depth: int) -> dict[str, Resolved] | None:
        """Fields of the object a call builds: a dataclass of the file, or a library config class."""
        if not isinstance(value, ast.Call) or depth > _MAX_DEPTH:
            return None
        tail = dotted(value.func).rsplit(".", 1)[-1]
        kwargs = self._kwargs(value, at, depth + 1)
        if tail in self.c.classes:
            fields_ = self.c.classes[tail]
            out = {k: self.resolve(v, v.lineno, depth + 1).via("default", f"field default of {tail}.{k}")
                   for k, v in fields_.items() if v is not None}
            for i, arg in enumerate(value.args[:len(fields_)]):
                out[list(fields_)[i]] = self.resolve(arg, at, depth + 1)
            out.update(kwargs)
            return out
        if tail in F.CLASS_DEFAULTS or tail in F.TRAINING_ARGS_CLASSES:
            kwargs["__class__"] = Resolved(tail if tail in F.CLASS_DEFAULTS else "TrainingArguments")
            return kwargs
        return None

    def _argparse_default(self, dest: str, arg: _ArgDef, line: int | None, depth: int) -> Resolved:
        if dest in self.cli:
            return self._flag(dest, self.cli[dest])
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

    def _r_BoolOp(self, node: ast.BoolOp, line: int | None, depth: int) -> Resolved:
        """``a or b`` / ``a and b`` with Python's short-circuit on values known statically."""
        last = None
        for value in node.values:
            last = self.resolve(value, line, depth)
            truth = _truth(last.value)
            if truth is None:
                return _undetermined(f"`{_short(node)}` depends on a run-time value")
            if truth == isinstance(node.op, ast.Or):
                return last.via("variable")
        return last.via("variable")

    def _r_Compare(self, node: ast.Compare, line: int | None, depth: int) -> Resolved:
        left = self.resolve(node.left, line, depth)
        if isinstance(left.value, Undetermined):
            return left
        ops = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
               ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
               ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
               ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
        a, result, notes = left.value, True, left.notes
        for op, comp in zip(node.ops, node.comparators):
            right = self.resolve(comp, line, depth)
            if isinstance(right.value, Undetermined) or type(op) not in ops or isinstance(a, dict):
                return _undetermined(f"`{_short(node)}` depends on a run-time value")
            result = result and ops[type(op)](a, right.value)
            a, notes = right.value, notes + right.notes
        return Resolved(bool(result), None, "variable", notes)

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
        if tail in F.RUNTIME_TRUE and not node.args:
            return Resolved(True, None, "inferred", (F.RUNTIME_TRUE[tail],))
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


def _truth(value: Any) -> bool | None:
    """Python truthiness of a statically known value (None when it is not known)."""
    if isinstance(value, Undetermined):
        return None
    try:
        return bool(value)
    except Exception:
        return None


def _option_default(node: ast.AST | None) -> ast.AST | None:
    """The default inside ``typer.Option(12, ...)`` / ``typer.Argument(default=...)``; else ``node``."""
    if isinstance(node, ast.Call) and dotted(node.func).rsplit(".", 1)[-1] in ("Option", "Argument"):
        kw = next((k.value for k in node.keywords if k.arg == "default"), None)
        first = node.args[0] if node.args else None
        pick = kw if kw is not None else first
        if isinstance(pick, ast.Constant) and pick.value is Ellipsis:
            return None
        return pick
    return node


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
        self.cls: str | None = None
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
        prov = Provenance(file=raw.file, line=raw.line, kind=raw.kind, detail=text, span=raw.span, key=key)
        self.out.append(found(field_name, value, prov, rank, conv, base_rank))

    def infer(self, field_name: str, value: Any, rank: int, at: ast.AST, detail: str) -> None:
        prov = Provenance(file=self.file, line=getattr(at, "lineno", None), kind="inferred", detail=detail)
        self.out.append(found(field_name, value, prov, rank))

    def run(self) -> PythonResult:
        for name, tool, fields_, base in self.s.c.ta_classes:
            self.tool = self.tool or tool
            self.cls = self.cls or base
            values = {k: (self.s._flag(k, self.s.cli[k]) if k in self.s.cli else
                          self.s.resolve(v).via("default", f"dataclass field default in class {name} "
                                                           "(a CLI flag may override it)")
                          if v is not None else _undetermined(f"dataclass field {k} has no default"))
                      for k, v in fields_.items()}
            self._trainer_args(values, self.s.tree, f"class {name}")
        for call in self.s.c.calls:
            if self.s.live(call) is not False:
                self._call(call)
        self._names()
        self._grad_accum()
        self._imports()
        self._quantization()
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
        return PythonResult(tool, self.out, self.raws, self.warnings, self.cls)

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
            self.cls = self.cls or tail
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
            for arg, (field_name, conv, *own_rank) in args.items():
                node = s.argument(call, arg)
                if node is not None:
                    label = f"argument {arg[1:]}" if arg.startswith("#") else arg
                    self.add(field_name, s.resolve(node, line), conv, own_rank[0] if own_rank else rank, call,
                             f"{label} of {name}(...)", key=arg)
            if re.search(F.MODEL_FROM_PRETRAINED, callee):
                self._library_attention(call, name)
            if "attn_implementation" in args:
                for arg in F.LOAD_DTYPE_ARGS:
                    node = s.argument(call, arg)
                    if node is not None:
                        self.add("precision", s.resolve(node, line), "load_dtype", F.R_WEAK, call,
                                 f"{arg} of {name}(...): the model's load dtype", key=arg)
            self._call_defaults(call, callee, name)
            break
        if tail.endswith("Trainer") and tail != "Trainer":
            self._trainer_model_attention(call, name)
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
            # a value passed through (training_args.gradient_checkpointing) only turns it on when it is on
            if off is None or convert("checkpointing", s.resolve(off).value)[0] is True:
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
            hit = class_default(full.rsplit(".", 1)[-1], "lr")
            prov = Provenance(file=self.file, line=call.lineno, kind="default",
                              detail=f"{full}(...) sets no lr; " + (hit[1] if hit else "no default in our table"))
            self.out.append(found("lr", hit[0] if hit else Undetermined(f"{full} has no fixed default lr"),
                                  prov, F.R_CALL))
        parent = self.s.c.parents.get(id(call))
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            for target in getattr(parent, "targets", [getattr(parent, "target", None)]):
                if isinstance(target, ast.Name):
                    self.optimizer_vars.add(target.id)

    def _names(self) -> None:
        """Argparse dests, entry-function parameters (and the fields of objects they default to) and
        module-level variables named like a field (fields.PY_NAMES), in that order."""
        s = self.s
        sources: dict[str, Any] = {}
        for name, assigns in s.c.assigns.items():
            if any(a.module_level for a in assigns):
                sources.setdefault(name.lower(), ("module", name))
        for fname in sorted(s.entries):
            func = s.c.functions[fname]
            for arg in func.args.args + func.args.kwonlyargs:
                node = s._param_node(func, arg.arg)
                obj = s._call_object(node[0], node[1], 0) if node and isinstance(node[0], ast.Call) else None
                for key in (obj or {}):
                    if not key.startswith("__"):
                        sources[key.lower()] = ("object", obj[key], f"{arg.arg}.{key} of {fname}()")
                sources[arg.arg.lower()] = ("param", func, arg.arg)
        for dest in s.c.argparse:
            sources[dest.lower()] = ("argparse", dest)
        for field_name, names in F.PY_NAMES.items():
            for low in names:
                hit = sources.get(low)
                if hit is None:
                    continue
                where = ""   # the resolved note names the flag, parameter or variable
                if hit[0] == "argparse":
                    res = s._argparse_default(hit[1], s.c.argparse[hit[1]], None, 0)
                elif hit[0] == "param":
                    res = s._param_value(hit[1], hit[2], 0)
                elif hit[0] == "object":
                    res, where = hit[1], hit[2]
                else:
                    assign = next(a for a in reversed(s.c.assigns[hit[1]]) if a.module_level)
                    res, where = s.resolve(assign.value, assign.line).via("variable"), f"module variable {hit[1]}"
                if res is None or isinstance(res.value, (Undetermined, dict)):
                    continue
                gate = _name_gate(s, low)
                if gate is not None:
                    res = gate
                self.add(field_name, res, F.PY_NAME_CONVERTERS[field_name], F.R_NAME, s.tree, where)
                break

    def _grad_accum(self) -> None:
        """How often ``optimizer.step()`` runs: under ``if ... % N`` (directly or through a variable
        such as ``is_accumulating``) -> N; inside ``accelerator.accumulate()`` -> the Accelerator's
        gradient_accumulation_steps; under any other run-time test -> unknown; on every iteration
        of a loop -> 1."""
        s = self.s
        for call in s.c.calls:
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr == "step") or s.live(call) is False:
                continue
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            arg = call.args[0].id if call.args and isinstance(call.args[0], ast.Name) else ""
            is_opt = owner in self.optimizer_vars or (not call.args and re.search(r"^opt", owner or "-")) \
                or arg in self.optimizer_vars
            if not is_opt:
                continue
            who = owner or arg
            in_loop, guard, accumulate, child = False, None, None, call
            for anc in s.ancestors(call):
                if isinstance(anc, (ast.For, ast.While, ast.AsyncFor)):
                    in_loop = True
                    break
                if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    break
                if isinstance(anc, ast.With) and any(
                        isinstance(i.context_expr, ast.Call) and dotted(i.context_expr.func).endswith(".accumulate")
                        for i in anc.items):
                    accumulate = accumulate or anc
                if isinstance(anc, ast.If) and child is not anc.test and _truth(s.resolve(anc.test).value) is None:
                    mod = self._modulo(anc.test, call.lineno)
                    if mod is not None:
                        node, line = mod
                        self.add("grad_accum_steps", s.resolve(node, line), "int", F.R_PATTERN, call,
                                 f"{who}.step() runs when `{_short(anc.test)}`")
                        return
                    guard = guard or anc
                child = anc
            if accumulate is not None:
                self._accumulate_steps(call, who)
                return
            if guard is not None:
                self.out.append(found("grad_accum_steps", Undetermined(
                    f"{who}.step() runs only when `{_short(guard.test)}`: how many micro-batches it accumulates "
                    "is decided at run time"), Provenance(file=self.file, line=guard.lineno), F.R_PATTERN))
                return
            if in_loop:
                self.infer("grad_accum_steps", 1, F.R_PATTERN, call,
                           f"{who}.step() runs on every iteration: no gradient accumulation")
                return

    def _modulo(self, test: ast.AST, line: int) -> tuple[ast.AST, int] | None:
        """The divisor of a ``% N`` in ``test``, or in the assignment of a name it reads (one level)."""
        for node in ast.walk(test):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
                return node.right, line
        scope = self.s.scope_of(test)
        for name in (n for n in ast.walk(test) if isinstance(n, ast.Name)):
            assign = self.s._assignment(name.id, line, scope)
            if assign is None:
                continue
            for node in ast.walk(assign.value):
                if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
                    return node.right, assign.line
        return None

    def _accumulate_steps(self, call: ast.Call, who: str) -> None:
        """The step inside ``with accelerator.accumulate(model)``: the Accelerator's accumulation."""
        pool = [f for f in self.out if f.field == "_accelerate_ga"]
        best = max(pool, key=lambda f: (f.rank, -f.seq)) if pool else None
        why = (f"{who}.step() inside accelerator.accumulate(): accelerate skips it until "
               "gradient_accumulation_steps micro-batches have run")
        if best is None:
            self.out.append(found("grad_accum_steps", Undetermined(why + "; no Accelerator(...) in the file"),
                                  Provenance(file=self.file, line=call.lineno), F.R_PATTERN))
            return
        prov = best.prov.model_copy(update={"detail": f"{why}; {best.prov.detail}"})
        self.out.append(Found("grad_accum_steps", best.value, prov, F.R_PATTERN, best.seq, best.conv, F.R_PATTERN))

    def _library_attention(self, call: ast.Call, name: str) -> None:
        """A model loaded without ``attn_implementation``: transformers decides (config resolves the
        family's default).  A model id left to the command line keeps the attention unknown."""
        s = self.s
        if any(s.argument(call, a) is not None for a in ("attn_implementation", "use_flash_attention_2")):
            return
        node = s.argument(call, "#0") or s.argument(call, "pretrained_model_name_or_path")
        res = s.resolve(node, call.lineno) if node is not None else None
        if res is None or not isinstance(res.value, str) or res.kind == "default":
            return
        prov = Provenance(file=self.file, line=call.lineno, kind="default",
                          detail=f"{name}(...) does not set attn_implementation")
        self.out.append(found("attention_impl", LibraryChoice(f"{name}(...) does not set attn_implementation",
                                                              res.value), prov, F.R_ACCELERATE))

    def _trainer_model_attention(self, call: ast.Call, name: str) -> None:
        """A TRL trainer given a model id loads it itself, without attn_implementation unless
        ``model_init_kwargs`` sets one (that explicit key outranks this)."""
        node = self.s.argument(call, "model")
        res = self.s.resolve(node, call.lineno) if node is not None else None
        if res is not None and isinstance(res.value, str) and res.kind != "default":
            why = f"{name}(model={res.value!r}) loads the model itself without attn_implementation"
            self.out.append(found("attention_impl", LibraryChoice(why, res.value), Provenance(
                file=self.file, line=call.lineno, kind="default", detail=why), F.R_ACCELERATE))

    def _quantization(self) -> None:
        """bitsandbytes warnings for the k-bit loads that run: ``load_in_4bit=True`` in a call, or a
        ``BitsAndBytesConfig(load_in_4bit=True)`` that reaches ``quantization_config=``."""
        s = self.s
        for call in s.c.calls:
            if s.live(call) is False or dotted(call.func).endswith("BitsAndBytesConfig"):
                continue          # a BitsAndBytesConfig counts where it reaches quantization_config=
            for kw in call.keywords:
                target = call
                if kw.arg == "quantization_config":
                    target = s.origin(kw.value)
                    if not (isinstance(target, ast.Call) and dotted(target.func).endswith("BitsAndBytesConfig")):
                        continue
                elif kw.arg not in F.BNB_KEYS:
                    continue
                for inner in target.keywords:
                    if inner.arg in F.BNB_KEYS and _truth(s.resolve(inner.value, call.lineno).value):
                        self.warnings.append(f"{inner.arg} quantizes with bitsandbytes: on ROCm it needs the ROCm "
                                             "build of bitsandbytes")

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


def analyse_python(text: str, file: str, cli: dict[str, Raw] | None = None) -> PythonResult:
    """Statically analyse a Python training script.

    ``cli``: the flags a launch line passes to the script (dest -> Raw in the
    launch file); they override the script's defaults, and their provenance
    points at the launch file.

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
    script = _Script(text, file, cli)
    return _Analysis(script).run()
