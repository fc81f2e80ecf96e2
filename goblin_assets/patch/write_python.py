"""The Python writer: ast-positioned keyword and statement insertions into the user's script."""
from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import INEXPRESSIBLE, render_value
from goblin_assets.config.python_resolve import dotted
from goblin_assets.contracts import KeywordEdit
from goblin_assets.errors import PatchError
from goblin_assets.patch.changeset import CompanionEdit
from goblin_assets.patch.source_edit import Document, TextWriter, packages_ok, render_literal

_IMPORT_NODES = (ast.Import, ast.ImportFrom)


class PythonWriter(TextWriter):
    """Keyword and statement insertions into one Python script (ast-positioned text edits).

    A field no keyword states yet goes in as a keyword of the right call
    (``fields.PY_INSERT``) or as a statement after the imports
    (``fields.PY_STATEMENTS``); companion edits add a keyword built from a
    variable in scope plus its import.  Insertions are collected per call and
    rendered by :meth:`finish`.
    """

    def __init__(self, doc: Document):
        super().__init__(doc)
        self.t = doc.text
        self.tree = tree = doc.read.tree
        self.edits = doc.edits
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
    def finish(self) -> None:
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

    # -- the SourceWriter methods ------------------------------------------------------------------
    def rewrite(self, fld: str, value: Any) -> bool:
        """:meth:`TextWriter.rewrite`, and for ``optimizer`` the script's own optimizer constructors too."""
        stating = super().rewrite(fld, value)
        if fld == "optimizer":
            stating = self._rewrite_optimizer(value) or stating
        return stating

    def optimizer_calls(self) -> list[ast.Call]:
        """The optimizer constructors the script calls (the parser's test: a class of ``fields.OPTIMIZER_CLASSES``
        under an ``optim`` module or bitsandbytes)."""
        out = []
        for c in self.calls:
            full = dotted(c.func)
            tail = full.rsplit(".", 1)[-1]
            if tail in F.OPTIMIZER_CLASSES and ("optim" in full.split(".")[:-1] or full.startswith(
                    ("bnb.", "bitsandbytes.")) or self._imported_from_optim(tail)):
                out.append(c)
        return out

    def _imported_from_optim(self, name: str) -> bool:
        return any(isinstance(n, ast.ImportFrom) and n.module and "optim" in n.module.split(".")
                   and any((a.asname or a.name) == name for a in n.names) for n in ast.walk(self.tree))

    def _rewrite_optimizer(self, value: Any) -> bool:
        """Replace each optimizer constructor by the class of ``value`` (``fields.OPTIMIZER_CONSTRUCTORS``).

        The callee becomes the new class's full path (its top module imported
        when the script does not); keywords the new class does not take in the
        same sense are removed; a ``weight_decay`` the old class applied by
        default is stated when the new class's default differs.  False when
        the script constructs no optimizer.  Raises PatchError for a name no
        class is known for, a class the installed packages lack, and a call
        passing more than the parameters and lr by position or ``**kwargs``.
        """
        calls = self.optimizer_calls()
        if not calls:
            return False
        target = F.OPTIMIZER_CONSTRUCTORS.get(str(value))
        if target is None:
            raise PatchError(f"{self.doc.name}: no optimizer class is known to construct optim={value!r} in a "
                             f"Python script (known: {', '.join(F.OPTIMIZER_CONSTRUCTORS)})")
        path, requires, keeps = target
        if not packages_ok(requires, self.doc.packages) or (
                requires and requires[0] in self.doc.packages and self.doc.packages[requires[0]] is None):
            dist, lo, _ = requires
            raise PatchError(f"{path} needs {dist}" + (f" >= {lo}" if lo else "") + ", and the installed "
                             f"version is {self.doc.packages.get(dist) or 'none'}")
        new_tail = path.rsplit(".", 1)[-1]
        for call in calls:
            old = dotted(call.func)
            if len(call.args) > 2 or any(kw.arg is None for kw in call.keywords):
                raise PatchError(f"{old}(...) line {call.lineno} passes more than the parameters and lr by "
                                 f"position, or **kwargs: they cannot be carried over to {path}")
            a, b = self.t.node_offsets(call.func)
            self.edits.add(a, b, path)
            args = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
            for i, kw in enumerate(args):
                if isinstance(kw, ast.keyword) and kw.arg not in keeps:
                    if i == 0:
                        raise PatchError(f"{old}(...) line {call.lineno} starts with {kw.arg}=, which {path} "
                                         "does not take")
                    self.edits.add(self.t.node_offsets(args[i - 1])[1], self.t.node_offsets(kw)[1], "")
            old_tail = old.rsplit(".", 1)[-1]
            wd_old = F.OPTIMIZER_WEIGHT_DECAY_DEFAULTS.get(old_tail)
            if "weight_decay" in keeps and self.keyword(call, "weight_decay") is None and wd_old is not None \
                    and wd_old != F.OPTIMIZER_WEIGHT_DECAY_DEFAULTS.get(new_tail):
                self.add_keyword(call, "weight_decay", repr(wd_old))
        top = path.split(".")[0]
        if not self.imported(top) and f"import {top}" not in self.imports:
            self.imports.append(f"import {top}")
        return True

    def insert(self, fld: str, value: Any) -> None:
        """Add ``fld = value`` to a script that never writes it (fields.PY_INSERT / PY_STATEMENTS)."""
        tried = []
        for pattern, kw, conv, requires in F.PY_INSERT.get(fld, []):
            if not packages_ok(requires, self.doc.packages) or (
                requires and requires[0] in self.doc.packages and self.doc.packages[requires[0]] is None):
                tried.append(f"{kw}= needs {requires[0]} in its version range")
                continue
            out, states = render_value(conv, value)
            if out is INEXPRESSIBLE or not states:
                continue
            calls = self.find_calls(pattern)
            if not calls:
                tried.append(f"no {pattern.strip('<>') if pattern.startswith('<') else pattern} call for {kw}=")
                continue
            default = F.PY_KEYWORD_DEFAULTS.get((pattern, kw), INEXPRESSIBLE)
            for call in calls if pattern == "<tokenizer>" else calls[:1]:
                if self.keyword(call, kw) is None and out != default:
                    self.add_keyword(call, kw, render_literal(out, "python"))
            return
        if fld in F.PY_STATEMENTS:
            template, module, comment = F.PY_STATEMENTS[fld]
            if not self.imported(module):
                raise PatchError(f"script does not import {module} at module level; cannot place "
                                 f"{template.format(value=value)}")
            self.statements.append(f"{template.format(value=value)}  # goblin: {comment}")
            return
        why = "; ".join(tried) or "no known place for it"
        raise PatchError(f"no place to write {fld} in this Python script ({why})")

    def keyword_edit(self, edit: KeywordEdit, signatures: Callable[[str], list[str] | None]) -> None:
        """Set ``edit``'s keyword in every call it names, under the first of its names the library accepts.

        A call that already passes one of ``edit.names`` has that value
        rewritten; otherwise the keyword is added.  No such call: nothing to
        do.  Raises PatchError when a call exists and ``accepted`` (the
        signature's keywords in the user's interpreter, asked only now) is None or holds none
        of the names: the edit is never written blind.
        """
        calls = self.find_calls(edit.call)
        if not calls:
            return
        accepted = signatures(edit.signature)
        if accepted is None:
            raise PatchError(f"{edit.signature} cannot be inspected in the job's interpreter, so the keyword "
                             f"{' / '.join(edit.names)} cannot be checked")
        name = next((n for n in edit.names if n in accepted), None)
        if name is None:
            raise PatchError(f"the installed {edit.signature} accepts none of {', '.join(edit.names)}")
        value = repr(edit.value)
        for call in calls:
            given = next((kw for kw in call.keywords if kw.arg in edit.names), None)
            if given is None:
                self.add_keyword(call, name, value)
            elif ast.unparse(given.value) != value:
                a, b = self.t.node_offsets(given.value)
                self.edits.add(a, b, value)

    def companion(self, edit: CompanionEdit) -> None:
        """Pass ``edit.template`` to the first consumer call the script makes, and import it."""
        built = edit.template.split("(")[0]
        for pattern, kw in edit.consumers:
            calls = self.find_calls(pattern)
            if not calls:
                continue
            call = calls[0]
            given = self.keyword(call, kw)
            if given is not None:
                if self.callee_of(given.value).rsplit(".", 1)[-1] in edit.met_by:
                    return
                raise PatchError(f"{dotted(call.func)}(...) line {call.lineno} already has {kw}="
                                 f"{ast.unparse(given.value)}, not known to pad each batch")
            if pattern == F.TRAINER_CALL and any(self.keyword(call, k) for k in F.TRAINER_TOKENIZER_KWARGS):
                return      # the Trainer builds DataCollatorWithPadding from its tokenizer itself
            tok = self.tokenizer_for(call)
            if tok is None:
                raise PatchError(f"no tokenizer variable in scope of {dotted(call.func)}(...) line {call.lineno} "
                                 f"to build {built} from")
            self.add_keyword(call, kw, edit.template.format(tokenizer=tok))
            name = edit.import_line.rsplit(" ", 1)[-1]
            if not self.imported(name) and edit.import_line not in self.imports:
                self.imports.append(edit.import_line)
            return
        raise PatchError(f"{edit.field}={edit.value!r} needs {built} and there is no "
                         f"{' or '.join(p for p, _ in edit.consumers)} call to pass it to")
