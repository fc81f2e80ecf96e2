"""What a Python training script sets: its calls and values mapped onto ConfigDict fields.

What the script's calls mean is data (``fields.CALL_FIELDS``,
``fields.TRAINING_ARGS_CLASSES``, ``fields.OPTIMIZER_CLASSES`` ...); the code
here only finds the calls and maps their values, resolved by
:class:`goblin_assets.config.python_resolve.Script` (never executed).
"""
from __future__ import annotations

import ast
import re
from typing import Any

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import (
    DEFER,
    SKIP,
    Found,
    LibraryChoice,
    Raw,
    Undetermined,
    Weak,
    class_default,
    convert,
    found,
    map_entries,
    optimizer_name,
)
from goblin_assets.config.python_resolve import (
    PythonResult,
    Resolved,
    Script,
    dotted,
    short_source,
    static_truth,
    undetermined,
)
from goblin_assets.contracts import Provenance


class _Analysis:
    def __init__(self, script: Script):
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
                          if v is not None else undetermined(f"dataclass field {k} has no default"))
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
                what = F.CHECKPOINTING_CALLS.get(tail, f"{name}(...) from {F.CHECKPOINT_MODULE}")
                if s.live(call) is None:  # under a test decided at run time: a flag named like the field wins
                    self.infer("gradient_checkpointing", True, F.R_NAME - 1, call,
                               f"{what}, under a condition decided at run time")
                else:
                    self.infer("gradient_checkpointing", True, F.R_PATTERN, call, what)
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
                self.infer("precision", hit, F.R_PATTERN, call, f".to({short_source(node)}) cast")
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
                if isinstance(anc, ast.If) and child is not anc.test and static_truth(s.resolve(anc.test).value) is None:
                    mod = self._modulo(anc.test, call.lineno)
                    if mod is not None:
                        node, line = mod
                        self.add("grad_accum_steps", s.resolve(node, line), "int", F.R_PATTERN, call,
                                 f"{who}.step() runs when `{short_source(anc.test)}`")
                        return
                    guard = guard or anc
                child = anc
            if accumulate is not None:
                self._accumulate_steps(call, who)
                return
            if guard is not None:
                self.out.append(found("grad_accum_steps", Undetermined(
                    f"{who}.step() runs only when `{short_source(guard.test)}`: how many micro-batches it accumulates "
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
                    if inner.arg in F.BNB_KEYS and static_truth(s.resolve(inner.value, call.lineno).value):
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


def _name_gate(s: Script, name: str) -> Resolved | None:
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
    script = Script(text, file, cli)
    return _Analysis(script).run()
