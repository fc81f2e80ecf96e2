"""The static resolver of Python training scripts, read with ``ast`` (never executed).

Values are resolved statically through literals, module constants, simple
arithmetic, ``os.environ.get`` defaults, argparse ``add_argument(default=)``,
dataclass field defaults (the HfArgumentParser pattern), ``dict(...)`` /
``{...}`` unpacked with ``**`` and dict look-ups.  Each resolved value keeps
the node of the source text that holds it, so its span can be patched.

:class:`Script` is the parsed script and its resolver; what the script's calls
mean for a training setup is read by :mod:`goblin_assets.config.python_script`.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import Found, Raw, Undetermined, class_default

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


def undetermined(reason: str) -> Resolved:
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


class Script:
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
            return undetermined(f"parameter {name} of {func.name}() is set by its caller at run time")
        where = f"{name}={short_source(default)} in {func.name}()"
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
                truth = static_truth(test.value)
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
            return undetermined("no value")
        if depth > _MAX_DEPTH:
            return undetermined("too many indirections to resolve")
        line = getattr(node, "lineno", line) if line is None else line
        key = (id(node), line)
        if key in self._memo:
            return self._memo[key]
        self._budget -= 1
        if self._budget < 0:
            return undetermined("too complex to resolve statically")
        method = getattr(self, "_r_" + type(node).__name__, None)
        if method is None:
            return undetermined(f"`{short_source(node)}` is computed at run time")
        try:
            result = method(node, line, depth + 1)
        except (ArithmeticError, ValueError, TypeError, OverflowError, MemoryError):
            result = undetermined(f"`{short_source(node)}` could not be evaluated statically")
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
            return undetermined(f"`{node.id}` has no value in the file (set at run time)")
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
        return undetermined(f"`{short_source(node)}` is only known at run time")

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
            truth = static_truth(self.resolve(node.test).value)
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
            return undetermined(f"`{short_source(node)}` is computed at run time")
        return Resolved(op(inner.value), node, inner.kind, inner.notes)

    def _r_BinOp(self, node: ast.BinOp, line: int | None, depth: int) -> Resolved:
        left, right = self.resolve(node.left, line, depth), self.resolve(node.right, line, depth)
        for side in (left, right):
            if isinstance(side.value, Undetermined):
                return side
        a, b = left.value, right.value
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if not numeric and not (isinstance(a, str) and isinstance(b, str) and isinstance(node.op, ast.Add)):
            return undetermined(f"`{short_source(node)}` is computed at run time")
        if isinstance(node.op, ast.Pow) and (abs(b) > 128 or abs(a) > 2 ** 20):
            return undetermined(f"`{short_source(node)}` is too large to evaluate")
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
               ast.Div: lambda x, y: x / y, ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y,
               ast.Pow: lambda x, y: x ** y}
        op = ops.get(type(node.op))
        if op is None:
            return undetermined(f"`{short_source(node)}` is computed at run time")
        value = op(a, b)
        if isinstance(value, (int, float)) and abs(value) > _NUMBER_LIMIT:
            return undetermined(f"`{short_source(node)}` is out of range")
        kind = _stronger(_stronger(left.kind, right.kind), "variable" if left.kind != "literal"
                         or right.kind != "literal" else "literal")
        return Resolved(value, node, kind, left.notes + right.notes)

    def _r_BoolOp(self, node: ast.BoolOp, line: int | None, depth: int) -> Resolved:
        """``a or b`` / ``a and b`` with Python's short-circuit on values known statically."""
        last = None
        for value in node.values:
            last = self.resolve(value, line, depth)
            truth = static_truth(last.value)
            if truth is None:
                return undetermined(f"`{short_source(node)}` depends on a run-time value")
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
                return undetermined(f"`{short_source(node)}` depends on a run-time value")
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
        return undetermined(f"`{short_source(node)}` is computed by a call at run time")

    def _env(self, node: ast.Call, line: int | None, depth: int) -> Resolved:
        key_node = node.args[0] if node.args else None
        key = key_node.value if isinstance(key_node, ast.Constant) else "?"
        default = node.args[1] if len(node.args) > 1 else next(
            (kw.value for kw in node.keywords if kw.arg == "default"), None)
        if default is None:
            return undetermined(f"read from ${key} at run time (no default)")
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
            return undetermined("list too long")
        items = [self.resolve(e, line, depth) for e in node.elts]
        if any(isinstance(i.value, (Undetermined, dict)) for i in items):
            return undetermined(f"`{short_source(node)}` is computed at run time")
        return Resolved([i.value for i in items], node)

    _r_Tuple = _r_List

    def _r_IfExp(self, node: ast.IfExp, line: int | None, depth: int) -> Resolved:
        notes = [F.RUNTIME_TRUE[tail] for call in ast.walk(node.test) if isinstance(call, ast.Call)
                 and (tail := dotted(call.func).rsplit(".", 1)[-1]) in F.RUNTIME_TRUE]
        if notes and not isinstance(node.test, ast.UnaryOp):
            return self.resolve(node.body, line, depth).via("inferred", "; ".join(notes))
        test = self.resolve(node.test, line, depth)
        if isinstance(test.value, Undetermined):
            return undetermined(f"`{short_source(node)}` depends on a run-time condition")
        branch = node.body if test.value else node.orelse
        return self.resolve(branch, line, depth).via(_stronger(test.kind, "variable"))

    def _r_Subscript(self, node: ast.Subscript, line: int | None, depth: int) -> Resolved:
        base = dotted(node.value)
        key = self.resolve(node.slice, line, depth)
        if base.endswith("environ"):
            return undetermined(f"read from ${key.value if isinstance(key.value, str) else '?'} at run time")
        if base.endswith("argv"):
            return undetermined("read from the command line (sys.argv)")
        container = self.resolve(node.value, line, depth)
        if isinstance(key.value, Undetermined):
            return key
        if isinstance(container.value, dict) and str(key.value) in container.value:
            hit = container.value[str(key.value)]
            return hit.via(_stronger(container.kind, key.kind)).via(key.kind, "; ".join(key.notes))
        items = container.value
        if isinstance(items, list) and isinstance(key.value, int) and -len(items) <= key.value < len(items):
            return Resolved(container.value[key.value], None, _stronger(container.kind, "variable"))
        return undetermined(f"`{short_source(node)}` is computed at run time")

    def _r_JoinedStr(self, node: ast.JoinedStr, line: int | None, depth: int) -> Resolved:
        return undetermined("built by an f-string at run time")

    def _kwargs(self, call: ast.Call, line: int | None, depth: int = 0) -> dict[str, Resolved]:
        """Keyword arguments of ``call`` with ``**mapping`` expanded where it resolves."""
        out: dict[str, Resolved] = {}
        for kw in call.keywords:
            if kw.arg is not None:
                out[kw.arg] = self.resolve(kw.value, line, depth)
                continue
            inner = self.resolve(kw.value, line, depth)
            if isinstance(inner.value, dict):
                out.update({k: v.via(_stronger(inner.kind, "variable"), f"unpacked from **{short_source(kw.value)}")
                            for k, v in inner.value.items()})
            else:
                out[f"**{short_source(kw.value)}"] = inner
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


def static_truth(value: Any) -> bool | None:
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


def short_source(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."
