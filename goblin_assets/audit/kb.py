"""The knowledge base: load cited rules, check their ``detect`` conditions on a run.

A rule's ``detect`` is a list of conditions, all of which must hold for the
rule to fire.  Each condition is ``PATH OP VALUE``:

* ``PATH``: ``config.<field>`` (ConfigDict), ``waste.<bucket>.share`` or
  ``waste.<bucket>.seconds``, ``metrics.<field>`` (RunMetrics), ``env.<VAR>``,
  ``platform`` (``cpu``/``cuda``/``rocm``), ``cores``, ``torch_version``.
* ``OP``: ``<  <=  >  >=  ==  !=  in  not_in``.
* ``VALUE``: a YAML scalar or list (``0.3``, ``eager``, ``null``, ``[a, b]``),
  or another PATH.

A condition whose left side is unknown (null) does not hold, and the match
says which value was missing: the KB never fires on a guess.
"""
from __future__ import annotations

import ast
import hashlib
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from goblin_assets import REPO_ROOT
from goblin_assets.contracts import CONFIG_FIELDS, ConfigDict, Rule, RuleMatch, RunMetrics
from goblin_assets.errors import KBError

DEFAULT_KB = REPO_ROOT / "kb" / "rocm_rules.yaml"

_COND = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>|not_in|in)\s*(.+?)\s*$")
_OPS = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
    "in": lambda a, b: a in b, "not_in": lambda a, b: a not in b,
}
_ROOTS = ("config", "waste", "metrics", "env", "platform", "cores", "torch_version")

#: Variables that configure a profiler or a debugger, never the workload
#: (kb_facts G01, G02).  A rule may *unset* them, never set them.
PROFILER_ENV = re.compile(
    r"^(ROCPROFSYS_|ROCPROF_|OMNITRACE_|HIP_LAUNCH_BLOCKING$|CUDA_LAUNCH_BLOCKING$|AMD_SERIALIZE_|"
    r"PYTORCH_NO_(HIP|CUDA)_MEMORY_CACHING$|TORCH_COMPILE_DEBUG$|PYTORCH_TUNABLEOP_VERBOSE$|HIPBLASLT_LOG_|"
    r"MIOPEN_ENABLE_LOGGING|MIOPEN_LOG_LEVEL$|MIOPEN_CHECK_NUMERICS$|HIP_FORCE_QUEUE_PROFILING$|HSA_TOOLS_LIB$)"
)


@dataclass
class KnowledgeBase:
    """Validated rules plus the content hash of the file they came from."""

    rules: list[Rule]
    path: Path
    sha256: str
    by_id: dict[str, Rule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {r.id: r for r in self.rules}


def load_kb(path: str | Path | None = None) -> KnowledgeBase:
    """Load and validate ``kb/rocm_rules.yaml`` (or ``path``).

    Raises
    ------
    KBError
        Unreadable YAML, a rule failing the Rule schema (message names the
        rule id and the field), a duplicate id, a condition that does not
        parse, or a rule that *sets* a profiler/debug variable (kb_facts G01/G02).
    """
    p = Path(path) if path else DEFAULT_KB
    try:
        text = p.read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KBError(f"{p}: cannot read the knowledge base: {exc}") from None
    items = doc.get("rules") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise KBError(f"{p}: expected a top-level 'rules:' list")
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        rid = item.get("id", f"#{i}") if isinstance(item, dict) else f"#{i}"
        try:
            rule = Rule.model_validate(item)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise KBError(f"{p}: rule {rid}: field '{loc}': {err['msg']}") from None
        if rule.id in seen:
            raise KBError(f"{p}: rule {rule.id}: duplicate id")
        seen.add(rule.id)
        for cond in rule.detect:
            if not _COND.match(cond) or cond.split()[0].split(".")[0] not in _ROOTS:
                raise KBError(f"{p}: rule {rule.id}: field 'detect': cannot parse condition {cond!r}")
        for var in rule.fix.env:
            if PROFILER_ENV.match(var):
                raise KBError(f"{p}: rule {rule.id}: field 'fix.env': {var} configures a profiler or "
                              "debugger, not the workload (kb_facts G01/G02); it can never be a fix")
        for fld in rule.fix.config:
            if fld not in CONFIG_FIELDS:
                raise KBError(f"{p}: rule {rule.id}: field 'fix.config': unknown ConfigDict field {fld!r}")
        rules.append(rule)
    return KnowledgeBase(rules=rules, path=p, sha256=hashlib.sha256(text.encode()).hexdigest())


def detect_context(config: ConfigDict, metrics: RunMetrics, env: dict[str, str] | None = None,
                   cores: int | None = None) -> dict[str, Any]:
    """The values ``detect`` conditions read, from one config and one run."""
    import os

    from goblin_assets.audit.waste import shares

    prov = metrics.provenance
    platform = "rocm" if prov.hip_version else ("cuda" if prov.cuda_version and prov.device != "cpu" else "cpu")
    sh = shares(metrics.waste_budget)
    return {
        "config": config.values(),
        "waste": {b: {"share": sh[b], "seconds": v.seconds, "status": v.status}
                  for b, v in metrics.waste_budget.items()},
        "metrics": metrics.model_dump(exclude={"waste_budget", "step_times_s", "stderr_tail"}),
        "env": dict(env if env is not None else os.environ),
        "platform": platform,
        "cores": cores or prov.cpu_count or os.cpu_count(),
        "torch_version": prov.torch_version,
    }


_MISSING = object()


def _resolve(path: str, ctx: dict[str, Any]) -> Any:
    cur: Any = ctx
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return _MISSING if not path.startswith("env.") else None
    return cur


def _value(text: str, ctx: dict[str, Any]) -> Any:
    if text.split(".")[0] in _ROOTS and re.fullmatch(r"[A-Za-z_][\w.]*", text):
        return _resolve(text, ctx)
    return yaml.safe_load(text)


def check_condition(cond: str, ctx: dict[str, Any]) -> tuple[bool, str]:
    """Evaluate one ``PATH OP VALUE`` condition; returns (holds, explanation)."""
    m = _COND.match(cond)
    if not m:
        return False, f"unparseable condition {cond!r}"
    path, op, rhs_text = m.groups()
    lhs = _resolve(path, ctx)
    rhs = _value(rhs_text, ctx)
    if lhs is _MISSING or rhs is _MISSING:
        return False, f"{path}: not available"
    if lhs is None and op not in ("==", "!=", "in", "not_in"):
        return False, f"{path} is unknown (null)"
    try:
        ok = bool(_OPS[op](lhs, rhs))
    except TypeError:
        return False, f"{path}={lhs!r} not comparable with {rhs!r}"
    shown = f"{lhs:.3g}" if isinstance(lhs, float) else repr(lhs)
    return ok, f"{path}={shown} {op} {rhs_text}: {'yes' if ok else 'no'}"


def match_rule(rule: Rule, ctx: dict[str, Any]) -> RuleMatch:
    """Check every condition of ``rule``; it fires only if all hold and the platform fits."""
    results = [check_condition(c, ctx) for c in rule.detect]
    platform_ok = ctx.get("platform") in rule.platforms
    held = sum(ok for ok, _ in results)
    score = held / len(results) if results else 0.0
    fired = platform_ok and held == len(results)
    reason = "; ".join(expl for _, expl in results)
    if not platform_ok:
        reason = f"platform {ctx.get('platform')} not in {rule.platforms}; " + reason
    evidence = {c: expl for c, (_, expl) in zip(rule.detect, results)}
    return RuleMatch(rule_id=rule.id, fired=fired, detect_score=score, evidence=evidence, reason=reason)


def match_rules(kb: KnowledgeBase, ctx: dict[str, Any]) -> list[RuleMatch]:
    """Check every rule of the KB against one context (fired rules first)."""
    matches = [match_rule(r, ctx) for r in kb.rules]
    return sorted(matches, key=lambda m: (not m.fired, -m.detect_score, m.rule_id))


# ---------------------------------------------------------------- fix expressions

_SAFE_FUNCS = {"min": min, "max": max, "int": int, "round": round}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}


def eval_fix_value(value: Any, names: dict[str, Any]) -> Any:
    """A fix value: a literal, or ``"=expr"`` over ``names`` (arithmetic, min/max/int/round).

    Raises
    ------
    KBError
        The expression uses anything else or refers to an unknown/null name.
    """
    if not (isinstance(value, str) and value.startswith("=")):
        return value
    expr = value[1:]

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if names.get(node.id) is None:
                raise KBError(f"fix expression {expr!r}: {node.id} is unknown")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            return _BIN[type(node.op)](ev(node.left), ev(node.right))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _SAFE_FUNCS and not node.keywords):
            return _SAFE_FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise KBError(f"fix expression {expr!r}: unsupported syntax {ast.dump(node)[:60]}")

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise KBError(f"fix expression {expr!r}: not a valid expression") from None
    return ev(tree)
