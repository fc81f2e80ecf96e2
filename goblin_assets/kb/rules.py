"""The knowledge base: load cited rules, check their ``detect`` conditions on a run.

A rule's ``detect`` is a list of conditions, all of which must hold for the
rule to fire.  Each condition is ``PATH OP VALUE``:

* ``PATH``: ``config.<field>`` (ConfigDict), ``waste.<bucket>.share`` or
  ``waste.<bucket>.seconds``, ``metrics.<field>`` (RunMetrics, nested fields
  with dots, e.g. ``metrics.provenance.device``), ``env.<VAR>``,
  ``platform`` (``cpu``/``cuda``/``rocm``), ``cores``, ``torch_version``,
  ``rocm_version`` (the HIP version of the run's torch build),
  ``env_prefix.<PREFIX>`` (how many environment variables start with PREFIX),
  ``kernels.<kind>.pct`` (percent of profiled time in the top kernels of one
  kind: a group of the one kernel/op category table,
  :func:`goblin_assets.runners.categories.groups`), ``host.<key>`` (``online_cpus``,
  ``affinity_cpus``, ``numa_nodes``, ``amx_bf16``, ``avx512_bf16``,
  ``cpu_bf16_matmul``, ``devices``: :data:`goblin_assets.host.HOST_KEYS`),
  ``packages.<dist>`` (installed version of a Python distribution, null when
  absent; all three from the one host-facts object, :mod:`goblin_assets.host`)
  and ``patterns.<site>.<finding>`` (the highest score of a mined tensor
  finding at a site, or at ``any`` site: :class:`PatternScores`) and
  ``tensors.<group>.<key>`` (a graded tensor finding of the sketches,
  :data:`goblin_assets.opscope.tensor_findings.TENSOR_KEYS`; its explanation
  names the site and training step behind the value) and
  ``invariants.<check>`` (the value of a run-time invariant check,
  :data:`goblin_assets.measure.invariants.CHECKS`: 0 when it held, not
  available when the run could not show it) and ``oom.<key>`` (a device
  allocator's out-of-memory message in the run's failure or stderr, read into
  numbers: :data:`goblin_assets.runners.oom.OOM_KEYS`, bytes, and ``kind``;
  not available when the run printed none) and ``warned.<field>`` (the value a
  warning the run printed names for a ConfigDict field, e.g. the DataLoader's
  suggested worker count: :func:`goblin_assets.measure.invariants.warned_values`;
  not available when no warning names one).  Fix expressions see the same
  values as ``warned_<field>``.
* ``OP``: ``<  <=  >  >=  ==  !=  in  not_in  multiple_of  not_multiple_of``.
* ``VALUE``: a YAML scalar or list (``0.3``, ``eager``, ``null``, ``[a, b]``),
  or another PATH.

Versions (``torch_version``, ``rocm_version``, ``packages.*``) compare as
release tuples, so ``torch_version >= 2.10`` is true for ``2.13.0+cpu``.
Environment values are strings; against a number they compare numerically
(``env.LOCAL_WORLD_SIZE > 1``).  A condition whose left side is unknown (null)
does not hold, and the match says which value was missing: the KB never fires
on a guess.  A rule with ``torch_version_min`` / ``rocm_version_min`` does not
fire on a run whose known version is lower.

Paths are checked on load: a condition that names a ConfigDict field, waste
bucket, RunMetrics field, kernel kind or host key that does not exist is a
:class:`KBError` naming the rule.
"""
from __future__ import annotations

import ast
import hashlib
import operator
import os
import re
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import ValidationError

from goblin_assets.contracts import (
    CONFIG_FIELDS,
    PATTERN_FINDINGS,
    WASTE_BUCKETS,
    ConfigDict,
    Rule,
    RuleMatch,
    RunMetrics,
)
from goblin_assets.errors import KBError
from goblin_assets.host import HOST_KEYS, HostFacts, current_host
from goblin_assets.measure.invariants import CHECKS, invariant_values, warned_values
from goblin_assets.measure.signals import DERIVED, signal_counts, signal_ids
from goblin_assets.opscope.tensor_findings import TENSOR_KEYS
from goblin_assets.runners.categories import category_pct, groups
from goblin_assets.runners.devices import DEVICE_KEYS, device_facts
from goblin_assets.runners.devices import matches as device_matches
from goblin_assets.runners.oom import OOM_KEYS, parse_device_oom

DEFAULT_KB = files("goblin_assets.kb.data") / "rocm_rules.yaml"
#: Environment variable naming a rules file that replaces the packaged one wherever no path is given (every
#: front door: CLI, Dagster assets, chat, MCP), e.g. a team's own copy with local rules added.
KB_ENV = "GOBLIN_KB"

_COND = re.compile(
    r"^\s*([A-Za-z_][\w.\-]*)\s*(<=|>=|==|!=|<|>|not_multiple_of|multiple_of|not_in|in)\s*(.+?)\s*$")
_OPS = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
    "in": lambda a, b: a in b, "not_in": lambda a, b: a not in b,
    "multiple_of": lambda a, b: a % b == 0, "not_multiple_of": lambda a, b: a % b != 0,
}
_ORDER = ("<", "<=", ">", ">=", "==", "!=")
_ROOTS = ("config", "waste", "metrics", "env", "env_prefix", "platform", "cores", "torch_version",
          "rocm_version", "kernels", "host", "packages", "patterns", "device", "signals", "local_world_size",
          "tensors", "invariants", "oom", "warned")
_VERSION_PATHS = ("torch_version", "rocm_version")


#: Variables that configure a profiler or a debugger, never the workload
#: (kb_facts G01, G02).  A rule may *unset* them, never set them.
PROFILER_ENV = re.compile(
    r"^(ROCPROFSYS_|ROCPROF_|OMNITRACE_|HIP_LAUNCH_BLOCKING$|CUDA_LAUNCH_BLOCKING$|AMD_SERIALIZE_|"
    r"PYTORCH_NO_(HIP|CUDA)_MEMORY_CACHING$|TORCH_COMPILE_DEBUG$|PYTORCH_TUNABLEOP_VERBOSE$|HIPBLASLT_LOG_|"
    r"MIOPEN_ENABLE_LOGGING|MIOPEN_LOG_LEVEL$|MIOPEN_CHECK_NUMERICS$|HIP_FORCE_QUEUE_PROFILING$|HSA_TOOLS_LIB$|"
    r"HIPBLASLT_ENABLE_MARKER$|HSA_ENABLE_DEBUG$|HSA_DISABLE_FRAGMENT_ALLOCATOR$)"
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
    """Load and validate ``kb/rocm_rules.yaml`` (or ``path``, else the file ``$GOBLIN_KB`` names).

    Raises
    ------
    KBError
        Unreadable YAML, a rule failing the Rule schema (message names the
        rule id and the field), a duplicate id, a condition that does not
        parse or names a field no context has, a ``targets_bucket`` that is not
        a waste bucket, a version bound that is not a version, a fix that
        assigns an unknown ConfigDict field, or a rule that *sets* a
        profiler/debug variable (kb_facts G01/G02).
    """
    p = Path(path) if path else Path(os.environ[KB_ENV]) if os.environ.get(KB_ENV) else DEFAULT_KB
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
        if rule.targets_bucket not in WASTE_BUCKETS:
            raise KBError(f"{p}: rule {rule.id}: field 'targets_bucket': {rule.targets_bucket!r} is not a "
                          f"waste bucket ({', '.join(WASTE_BUCKETS)})")
        for bound in ("torch_version_min", "rocm_version_min"):
            v = getattr(rule, bound)
            if v is not None and version_tuple(v) is None:
                raise KBError(f"{p}: rule {rule.id}: field '{bound}': {v!r} is not a version")
        for cond in rule.detect:
            problem = _check_condition_paths(cond)
            if problem:
                raise KBError(f"{p}: rule {rule.id}: field 'detect': {problem}")
        for var in rule.fix.env:
            if PROFILER_ENV.match(var):
                raise KBError(f"{p}: rule {rule.id}: field 'fix.env': {var} configures a profiler or "
                              "debugger, not the workload (kb_facts G01/G02); it can never be a fix")
        for fld, raw in rule.fix.config.items():
            if fld == WARNED_FIX and raw != WARNED_FIX_VALUE:
                raise KBError(f"{p}: rule {rule.id}: field 'fix.config': {WARNED_FIX!r} (every field a warning of "
                              f"the run names) takes the value {WARNED_FIX_VALUE!r}, not {raw!r}")
            if fld not in CONFIG_FIELDS and fld != WARNED_FIX:
                raise KBError(f"{p}: rule {rule.id}: field 'fix.config': unknown ConfigDict field {fld!r}")
        problem = _check_kind(rule)
        if problem:
            raise KBError(f"{p}: rule {rule.id}: {problem}")
        rules.append(rule)
    ids = {r.id for r in rules}
    for rule in rules:
        for target in rule.blocks:
            if not (target in ids or (target.startswith("config.") and target[7:] in CONFIG_FIELDS)):
                raise KBError(f"{p}: rule {rule.id}: field 'blocks': {target!r} is neither a rule id nor "
                              "config.<field>")
    return KnowledgeBase(rules=rules, path=p, sha256=hashlib.sha256(text.encode()).hexdigest())


def _check_kind(rule: Rule) -> str:
    """What is wrong with a rule's kind-specific fields ('' when nothing).

    A ``warning`` changes nothing (no fix, no recovery): profiler variables and
    the like are reported, never tuned.  A ``hazard`` predicts no recovery.
    Only a hazard ``blocks``.  A ``tuning`` rule has a transform.
    """
    fix = rule.fix
    has_fix = bool(fix.config or fix.env or fix.unset_env or fix.keywords)
    if rule.kind == "warning" and (has_fix or rule.recovery_fraction):
        return "field 'kind': a warning has no fix and no recovery_fraction (it cannot change throughput)"
    if rule.kind == "hazard" and rule.recovery_fraction:
        return "field 'recovery_fraction': a hazard predicts no recovery (it is about correctness)"
    if rule.blocks and rule.kind != "hazard":
        return "field 'blocks': only a hazard blocks other changes"
    if rule.kind == "tuning" and not has_fix:
        return "field 'fix': a tuning rule needs a transform (config, env, unset_env or keywords)"
    for rng in rule.affected_versions:
        try:
            SpecifierSet(rng.specifier)
        except InvalidSpecifier:
            return f"field 'affected_versions': {rng.specifier!r} is not a version specifier (PEP 440)"
    return ""


def detect_context(config: ConfigDict, metrics: RunMetrics, host: HostFacts | None = None, *,
                   env: dict[str, str] | None = None, cores: int | None = None,
                   packages: dict[str, str | None] | None = None, patterns: Any = None,
                   tensors: Any = None) -> dict[str, Any]:
    """The values ``detect`` conditions read, from one config, one run and the host it belongs to.

    Parameters
    ----------
    config, metrics
        The parsed config and the profiled (or replayed) run.
    host
        The host facts (default :func:`goblin_assets.host.current_host`; a
        replay passes the recording's).  ``host.*``, ``cores``, ``env.*`` and
        ``packages.*`` are read from it.
    env, cores, packages
        Replace the host's environment, core count or package versions (an
        audit passes the job's; tests build contexts by hand with them).
    patterns
        The mined patterns (a ``patterns``-table frame) for
        ``patterns.<site>.<finding>``; None when nothing was mined.
    tensors
        The graded tensor findings
        (:class:`goblin_assets.opscope.tensor_findings.TensorFindings`) for
        ``tensors.<group>.<key>``; None (or a group not observable): the
        condition is "not available" and never fires.
    """
    from goblin_assets.measure.waste import shares

    host = host or current_host()
    prov = metrics.provenance
    platform = "rocm" if prov.hip_version else ("cuda" if prov.cuda_version and prov.device != "cpu" else "cpu")
    sh = shares(metrics.waste_budget)
    env_now = dict(env) if env is not None else host.job_env()
    given = dict(host.packages if packages is None else packages)
    return {
        "config": config.values(),
        "waste": {b: {"share": sh[b], "seconds": v.seconds, "status": v.status}
                  for b, v in metrics.waste_budget.items()},
        "metrics": metrics.model_dump(exclude={"waste_budget", "step_times_s", "stderr_tail"}),
        "env": env_now,
        "env_prefix": _EnvPrefix(env_now),
        "platform": platform,
        "cores": cores or host.cores or prov.cpu_count,
        "torch_version": prov.torch_version,
        "rocm_version": prov.hip_version,
        "kernels": category_pct(metrics),
        "host": host.host_context(),
        "packages": _Packages(given, host if packages is None else None),
        "patterns": PatternScores(patterns),
        "device": device_facts(prov.device, prov.arch, _device_memory_gb(metrics), host.cpu_bf16_matmul),
        "signals": signal_counts(metrics.signals) if metrics.signals is not None else {},
        "local_world_size": local_world_size(env_now),
        "tensors": tensors,
        "invariants": invariant_values(metrics.invariants),
        "oom": _device_oom(metrics),
        "warned": warned_values(metrics.invariants),
    }


def _device_oom(metrics: RunMetrics) -> dict[str, Any]:
    """``oom.<key>``: the device out-of-memory message of a failed run's failure line or stderr, read; {} if none."""
    if not metrics.failure and not metrics.stderr_tail:
        return {}
    found = parse_device_oom(f"{metrics.failure or ''}\n{metrics.stderr_tail or ''}")
    return found.values() if found is not None else {}


class _EnvPrefix(dict):
    """``env_prefix.<PREFIX>``: how many environment variables start with ``PREFIX``."""

    def __init__(self, env: dict[str, str]):
        super().__init__()
        self._env = env

    def __contains__(self, prefix: object) -> bool:
        return isinstance(prefix, str)

    def __missing__(self, prefix: str) -> int:
        return sum(1 for k in self._env if k.startswith(prefix))


class _Packages(dict):
    """``packages.<dist>``: installed versions (null when absent), asked of the host facts on first use."""

    def __init__(self, given: dict[str, str | None], host: HostFacts | None = None):
        super().__init__(given)
        self._host = host

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __missing__(self, name: str) -> str | None:
        version = self._host.package(name) if self._host is not None else None
        self[name] = version
        return version


class PatternScores:
    """``patterns.<site>.<finding>``: the highest score of ``finding`` at ``site`` (any role), from mined patterns.

    ``site`` may contain dots (module paths); the last component of a path is
    the finding, one of :data:`goblin_assets.contracts.PATTERN_FINDINGS`.
    The site ``any`` means every site.  Scores are the miner's (0..1); a
    finding that was not mined at that site reads 0.0, and the whole root is
    "not available" when no patterns were mined (a replay records no tensors).
    """

    def __init__(self, patterns: Any = None):
        self.rows: dict[tuple[str, str], float] = {}
        if patterns is not None and len(patterns):
            for site, finding, score in zip(patterns["site"], patterns["finding"], patterns["score"]):
                for key in ((str(site), str(finding)), ("any", str(finding))):
                    self.rows[key] = max(self.rows.get(key, 0.0), float(score))

    def __bool__(self) -> bool:
        return bool(self.rows)

    def score(self, site: str, finding: str) -> float:
        """Highest score of ``finding`` at ``site`` (or over all sites for ``any``); 0.0 when absent."""
        return self.rows.get((site, finding), 0.0)


def version_tuple(text: Any) -> tuple[int, ...] | None:
    """The release part of a version string as integers: ``"6.2.41133-dd7f"`` -> ``(6, 2, 41133)``.

    ``None`` when ``text`` does not start with a number.
    """
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text)) if text is not None else None
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _cmp_versions(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def version_at_least(version: str | None, minimum: str | None) -> bool | None:
    """``version >= minimum`` as release tuples; ``None`` when either is unknown."""
    va, vb = version_tuple(version), version_tuple(minimum)
    if va is None or vb is None:
        return None
    return _cmp_versions(va, vb) >= 0


_METRIC_FIELDS = set(RunMetrics.model_fields) - {"waste_budget", "step_times_s", "stderr_tail"}
_WASTE_KEYS = ("share", "seconds", "status")


def _check_path(path: str) -> str | None:
    """Why ``path`` names nothing a context has (None when it is fine)."""
    parts = path.split(".")
    root, rest = parts[0], parts[1:]
    if root not in _ROOTS:
        return f"unknown root {root!r} (one of {', '.join(_ROOTS)})"
    if root in ("platform", "cores", "torch_version", "rocm_version", "local_world_size"):
        return f"{root} has no sub-fields" if rest else None
    if not rest:
        return f"{root} needs a field ({root}.<name>)"
    if root == "config" and (len(rest) != 1 or rest[0] not in CONFIG_FIELDS):
        return f"unknown ConfigDict field {'.'.join(rest)!r}"
    if root == "waste" and (len(rest) != 2 or rest[0] not in WASTE_BUCKETS or rest[1] not in _WASTE_KEYS):
        return f"expected waste.<bucket>.share|seconds|status with a bucket of {', '.join(WASTE_BUCKETS)}"
    if root == "metrics" and rest[0] not in _METRIC_FIELDS:
        return f"unknown RunMetrics field {rest[0]!r}"
    if root == "kernels" and (len(rest) != 2 or rest[0] not in groups() or rest[1] != "pct"):
        return f"expected kernels.<kind>.pct with a kind of {', '.join(groups())}"
    if root == "host" and (len(rest) != 1 or rest[0] not in HOST_KEYS):
        return f"unknown host key {'.'.join(rest)!r} (one of {', '.join(HOST_KEYS)})"
    if root == "device" and (len(rest) != 1 or rest[0] not in DEVICE_KEYS):
        return f"unknown device key {'.'.join(rest)!r} (one of {', '.join(DEVICE_KEYS)})"
    if root == "signals" and (len(rest) != 1 or rest[0] not in signal_ids()):
        return f"unknown signal {'.'.join(rest)!r} (kb/signals.yaml or {', '.join(DERIVED)})"
    if root == "patterns" and (len(rest) < 2 or rest[-1] not in PATTERN_FINDINGS):
        return (f"expected patterns.<site>.<finding> (site: a module path or 'any') with a finding of "
                f"{', '.join(PATTERN_FINDINGS)}")
    if root == "tensors" and (len(rest) != 2 or rest[0] not in TENSOR_KEYS or rest[1] not in TENSOR_KEYS[rest[0]]):
        return "expected tensors.<group>.<key> of " + "; ".join(
            f"{g}: {', '.join(keys)}" for g, keys in TENSOR_KEYS.items())
    if root == "invariants" and (len(rest) != 1 or rest[0] not in CHECKS):
        return f"unknown invariant {'.'.join(rest)!r} (one of {', '.join(CHECKS)}: measure/invariants.py)"
    if root == "warned" and (len(rest) != 1 or rest[0] not in CONFIG_FIELDS):
        return f"unknown ConfigDict field {'.'.join(rest)!r} (warned.<field>: a value a warning of the run names)"
    if root == "oom" and (len(rest) != 1 or rest[0] not in OOM_KEYS):
        return f"unknown oom key {'.'.join(rest)!r} (one of {', '.join(OOM_KEYS)}: runners/oom.py)"
    if root in ("env", "env_prefix", "packages") and len(rest) != 1:
        return f"expected {root}.<NAME>"
    return None


def _is_path(text: str) -> bool:
    return text.split(".")[0] in _ROOTS and re.fullmatch(r"[A-Za-z_][\w.\-]*", text) is not None


def _check_condition_paths(cond: str) -> str | None:
    m = _COND.match(cond)
    if not m:
        return f"cannot parse condition {cond!r}"
    path, _, rhs = m.groups()
    for side in (path, rhs) if _is_path(rhs) else (path,):
        problem = _check_path(side)
        if problem:
            return f"condition {cond!r}: {problem}"
    return None


_MISSING = object()


def _resolve(path: str, ctx: dict[str, Any]) -> Any:
    if path.startswith("patterns."):
        pats = ctx.get("patterns")
        if not pats:
            return _MISSING
        site, _, finding = path.removeprefix("patterns.").rpartition(".")
        return pats.score(site, finding)
    if path.startswith("tensors."):
        known, value, _ = _tensor_value(path, ctx)
        return value if known else _MISSING
    cur: Any = ctx
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return _MISSING if not path.startswith("env.") else None
    return cur


def _tensor_value(path: str, ctx: dict[str, Any]) -> tuple[bool, Any, str]:
    """``(known, value, where)`` of a ``tensors.<group>.<key>`` path (unknown without tensor findings)."""
    tf = ctx.get("tensors")
    if tf is None:
        return False, None, ""
    group, _, key = path.removeprefix("tensors.").partition(".")
    return tf.value(group, key)


def _value(text: str, ctx: dict[str, Any]) -> Any:
    if _is_path(text):
        return _resolve(text, ctx)
    return yaml.safe_load(text)


def _is_version_path(path: str) -> bool:
    return path in _VERSION_PATHS or path.startswith("packages.")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_number(v: Any) -> Any:
    """An environment string that holds a number, as that number (else ``v`` unchanged)."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


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
    if _is_version_path(path) and op in _ORDER and lhs is not None and rhs is not None:
        # versions compare as release tuples: the raw text, so "2.10" is not the float 2.1
        va = version_tuple(lhs)
        vb = version_tuple(rhs if _is_path(rhs_text) else rhs_text.strip("'\""))
        if va is None or vb is None:
            return False, f"{path}={lhs!r}: not a version comparable with {rhs_text}"
        ok = _OPS[op](_cmp_versions(va, vb), 0)
        return ok, f"{path}={lhs} {op} {rhs_text}: {'yes' if ok else 'no'}"
    if op in _ORDER + ("multiple_of", "not_multiple_of") and (isinstance(lhs, str) or isinstance(rhs, str)):
        a, b = _as_number(lhs), _as_number(rhs)  # env values are strings: "8" > 1 compares 8.0 > 1
        if _is_number(a) and _is_number(b):
            lhs, rhs = a, b
    try:
        ok = bool(_OPS[op](lhs, rhs))
    except (TypeError, ZeroDivisionError):
        return False, f"{path}={lhs!r} not comparable with {rhs!r}"
    shown = f"{lhs:.3g}" if isinstance(lhs, float) else repr(lhs)
    where = _tensor_value(path, ctx)[2] if path.startswith("tensors.") else ""
    return ok, f"{path}={shown} {op} {rhs_text}: {'yes' if ok else 'no'}" + (f" (at {where})" if where else "")


def match_rule(rule: Rule, ctx: dict[str, Any]) -> RuleMatch:
    """Check every condition of ``rule``; it fires only if all hold, the platform and device fit, the known
    versions are not below its minimums, and every ``affected_versions`` range holds the installed version."""
    results = [check_condition(c, ctx) for c in rule.detect]
    platform_ok = ctx.get("platform") in rule.platforms
    device = ctx.get("device") or {}
    device_ok = device_matches(rule.devices, device)
    too_old = _too_old(rule, ctx)
    unaffected = _not_affected(rule, ctx)
    held = sum(ok for ok, _ in results)
    score = held / len(results) if results else 0.0
    fired = platform_ok and device_ok and not too_old and not unaffected and held == len(results)
    reason = "; ".join(expl for _, expl in results)
    for why in (unaffected, too_old,
                "" if device_ok else f"device {device.get('name')} ({device.get('arch')}) not in {rule.devices}",
                "" if platform_ok else f"platform {ctx.get('platform')} not in {rule.platforms}"):
        if why:
            reason = f"{why}; " + reason
    evidence = {c: expl for c, (_, expl) in zip(rule.detect, results)}
    if rule.affected_versions:
        evidence["affected_versions"] = unaffected or "the installed versions are affected"
    return RuleMatch(rule_id=rule.id, fired=fired, detect_score=score, evidence=evidence, reason=reason)


def _installed(ctx: dict[str, Any], package: str) -> str | None:
    """The job's version of ``package``: the run's torch for torch, else the host facts' packages."""
    if package == "torch" and ctx.get("torch_version"):
        return ctx["torch_version"]
    packages = ctx.get("packages")
    return packages[package] if packages is not None else None


def _not_affected(rule: Rule, ctx: dict[str, Any]) -> str:
    """Why the installed versions are outside the rule's ``affected_versions`` ('' when every range holds)."""
    for rng in rule.affected_versions:
        version = _installed(ctx, rng.package)
        if version is None:
            return f"{rng.package} is not installed (affected: {rng.specifier})"
        release = ".".join(str(x) for x in (version_tuple(version) or ()))
        if not release or not SpecifierSet(rng.specifier).contains(release, prereleases=True):
            return f"{rng.package} {version} is outside the affected versions {rng.specifier}"
    return ""


def _device_memory_gb(metrics: RunMetrics) -> float | None:
    """The device's total memory measured by the run (GB): peak + headroom on a GPU run, else None."""
    if metrics.provenance.device == "cpu" or metrics.mem_peak_gb is None or metrics.memory_headroom_gb is None:
        return None
    return metrics.mem_peak_gb + metrics.memory_headroom_gb


def local_world_size(env: dict[str, str]) -> int:
    """Processes of the job on this node: ``LOCAL_WORLD_SIZE`` (torchrun, accelerate) or ``OMPI_COMM_WORLD_LOCAL_SIZE``
    / ``SLURM_NTASKS_PER_NODE`` (MPI, Slurm launchers); 1 when none is set or it is not a number."""
    for var in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        try:
            n = int(str(env.get(var, "")).split("(")[0])
        except ValueError:
            continue
        if n > 0:
            return n
    return 1


def _too_old(rule: Rule, ctx: dict[str, Any]) -> str:
    """Why the run's known torch/ROCm version is below the rule's minimum ('' when it is not)."""
    tv = ctx.get("torch_version")
    if rule.torch_version_min and version_at_least(tv, rule.torch_version_min) is False:
        return f"torch {tv} < torch_version_min {rule.torch_version_min}"
    rv = ctx.get("rocm_version")
    if ctx.get("platform") == "rocm" and rule.rocm_version_min and version_at_least(rv, rule.rocm_version_min) is False:
        return f"ROCm/HIP {rv} < rocm_version_min {rule.rocm_version_min}"
    return ""


def match_rules(kb: KnowledgeBase, ctx: dict[str, Any]) -> list[RuleMatch]:
    """Check every rule of the KB against one context (fired rules first)."""
    matches = [match_rule(r, ctx) for r in kb.rules]
    return sorted(matches, key=lambda m: (not m.fired, -m.detect_score, m.rule_id))


# ---------------------------------------------------------------- fix expressions

_SAFE_FUNCS = {"min": min, "max": max, "int": int, "round": round}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}


#: The ``fix.config`` key that stands for every ConfigDict field a warning of the run names (``warned.<field>``),
#: each set to the value the warning names; its value is :data:`WARNED_FIX_VALUE`.
WARNED_FIX, WARNED_FIX_VALUE = "*", "=warned"


def fix_assignments(config: dict[str, Any], warned: dict[str, Any]) -> list[tuple[str, Any]]:
    """A rule's ``fix.config`` as (field, raw value) pairs, :data:`WARNED_FIX` expanded into each field of
    ``warned`` (field -> the value a warning named: :func:`goblin_assets.measure.invariants.warned_values`)
    with that value."""
    out: list[tuple[str, Any]] = []
    for fld, raw in config.items():
        out += list(warned.items()) if fld == WARNED_FIX else [(fld, raw)]
    return out


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
