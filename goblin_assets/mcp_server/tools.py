"""The MCP tools: the chat agent's six tools, the whole audit and the recorded-trace analysis.

Each tool here calls what a front door already calls, and nothing else:

- the six tools of :data:`goblin_assets.agent.tools.TOOLS` (``parse_config``,
  ``profile_run``, ``query_rocm_kb``, ``propose_patch``, ``benchmark``,
  ``compare_runs``; and any tool added to that table later), each on one
  :class:`~goblin_assets.audit.session.AuditSession` per workload, opened as
  ``goblin chat`` opens it (:func:`goblin_assets.cli_common.open_session`) and
  kept while the workload's files are unchanged: a stage runs at most once;
- ``audit``: :func:`goblin_assets.cli_common.complete_audit` on a fresh session, as
  ``goblin audit`` runs it (warehouse rows, MLflow run when a tracking URI is set);
- ``trace``: :func:`goblin_assets.cli_trace.analyse_traces`, as ``goblin trace``.

A tool's result is (structured content, one-line summary).  The structured
content is the JSON the matching command prints: ``goblin audit --json``,
``goblin trace --json``, and for the six session tools the tool result that
``goblin chat --json`` prints (the agent's summary); every string is redacted
(:func:`goblin_assets.redact.redact_tree`), as for the chat agent.

Further stages outside the agent's table register their tools with :func:`register` (one
:class:`McpTool` each) when they land; a tool added to the agent's table
appears here by itself.
"""
from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goblin_assets.agent.tools import TOOLS as AGENT_TOOLS
from goblin_assets.agent.tools import Tool
from goblin_assets.errors import GoblinError

Log = Callable[[str], None]

PATH = {"type": "string", "description": "the workload: a folder with workload.yaml, a replay folder "
        "(cached_metrics.json) or a training script; absolute, or relative to the server's working directory"}

#: The audit settings a caller may change (AuditSettings fields; defaults: $GOBLIN_RUNNER_*, else the CLI's).
SETTINGS = {
    "type": "object", "additionalProperties": False,
    "description": "optional run budgets, as goblin audit's options: fewer steps cost less and measure less",
    "properties": {
        "profiled_steps": {"type": "integer", "minimum": 1, "description": "profiled steps (--steps)"},
        "bench_steps": {"type": "integer", "minimum": 1, "description": "timed steps per benchmark repeat"},
        "bench_repeats": {"type": "integer", "minimum": 1, "description": "alternating repeats per arm, at least"},
        "bench_budget_s": {"type": "number", "exclusiveMinimum": 0,
                           "description": "seconds the benchmark may add repeat pairs for"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "description": "wall-clock limit per child run, s"},
    },
}


@dataclass(frozen=True)
class McpTool:
    """One MCP tool: its name, description, JSON-schema input, cost in words, and the function.

    ``run(arguments, log)`` returns (structured content, one-line summary) and
    raises GoblinError (or a pydantic ValidationError) on bad input; ``log``
    receives progress lines (each becomes a progress notification).
    ``long``: the tool may run the workload (minutes), so progress matters.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[dict[str, Any], Log], tuple[dict[str, Any], str]]
    cost: str
    long: bool = False


class Sessions:
    """One audit session per workload and settings, reused while the workload's files are unchanged.

    Calls run one at a time (a lock): two profiled runs at once would measure each other.
    """

    def __init__(self, mlflow: str | None = None):
        self.mlflow = mlflow
        self.lock = threading.Lock()
        self._open: dict[tuple, Any] = {}
        self._log: Log = lambda _: None

    def relay(self, line: str) -> None:
        """The sessions' log: forwards to the current call's progress (sessions outlive calls)."""
        self._log(line)

    def args(self, arguments: dict[str, Any]) -> argparse.Namespace:
        """The argparse namespace ``open_session`` reads: the path and the settings given."""
        return argparse.Namespace(path=arguments["path"], kb=None, python=None, **arguments.get("settings", {}))

    def session(self, arguments: dict[str, Any]):
        """The cached session of ``arguments["path"]`` (opened now when its files changed or it is new)."""
        from goblin_assets.cli_common import open_session
        from goblin_assets.runners.workload import load_workload

        wl = load_workload(arguments["path"])
        files = [f for f in {wl.config_file, wl.script} if f is not None and Path(f).is_file()]
        key = (str(wl.root), tuple(sorted(arguments.get("settings", {}).items())),
               tuple((str(f), Path(f).stat().st_mtime_ns, Path(f).stat().st_size) for f in files))
        if key not in self._open:
            self._open[key] = open_session(self.args(arguments), workload=wl, log=self.relay)
        return self._open[key]


def _agent_run(tool: Tool, sessions: Sessions, summary: Callable[[dict], str]):
    def run(arguments: dict[str, Any], log: Log) -> tuple[dict[str, Any], str]:
        own = {k: v for k, v in arguments.items() if k not in ("path", "settings")}
        doc = tool.fn(sessions.session(arguments), **own)
        return doc, summary(doc)
    return run


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:g} ms"


def _profile_line(d: dict) -> str:
    wb = {k: b for k, b in d.get("waste_budget", {}).items() if k != "useful" and (b.get("ms") or 0) > 0}
    worst = max(wb.items(), key=lambda kv: kv[1]["ms"], default=None)
    return (f"{d.get('provenance')}: step {_ms(d.get('step_time_ms'))}, {d.get('throughput')} "
            f"{d.get('throughput_unit')}" + (f"; largest waste {worst[0]} {_ms(worst[1]['ms'])} "
                                              f"({worst[1]['status']})" if worst else ""))


def _bench_line(d: dict) -> str:
    if d.get("status") == "not_observable":
        return f"benchmark not observable: {d.get('reason')}"
    return f"measured speedup {d['speedup']}x {d['speedup_interval']} ({d['verdict']})"


def _report_line(d: dict) -> str:
    speed = ("measured speedup not observable" if d.get("measured_speedup") is None
             else f"measured speedup {d['measured_speedup']}x")
    return f"{d['audit_verdict']}; {speed}; report {d.get('report')}"


#: One-line summaries of the agent tools' results (a tool added to the agent's table later gets its keys).
SUMMARIES: dict[str, Callable[[dict], str]] = {
    "parse_config": lambda d: f"{d['file']} ({d['format']}): " + ", ".join(
        f"{k}={v}" for k, v in d["config"].items() if v is not None) + f"; {len(d['warnings'])} warning(s)",
    "profile_run": _profile_line,
    "query_rocm_kb": lambda d: f"{d['rules_checked']} rules checked; fired: "
                               + (", ".join(f["rule"] for f in d["fired"]) or "none"),
    "propose_patch": lambda d: "applied: " + (", ".join(a["rule"] for a in d["applied"]) or "none")
                               + f"; predicted {d['predicted_speedup'][0]}x-{d['predicted_speedup'][1]}x",
    "benchmark": _bench_line,
    "compare_runs": _report_line,
}

#: What each tool costs (docs/agents.md repeats it): the session tools run earlier stages they need first.
COSTS: dict[str, str] = {
    "parse_config": "reads the file: under a second, nothing runs",
    "profile_run": "runs the workload (warm-up + profiled steps) in a child process: seconds to minutes",
    "query_rocm_kb": "profiles first if not yet done; the rule checks and search take a few seconds",
    "propose_patch": "profiles and checks rules first if needed; one validation step of the patched program",
    "benchmark": "alternating baseline/patched repeats then a patched profile: the longest stage (minutes); "
                 "cached by config, script, image and runner code",
    "compare_runs": "every stage before it, then writes report.md/.html/.png",
}


def _audit(sessions: Sessions):
    def run(arguments: dict[str, Any], log: Log) -> tuple[dict[str, Any], str]:
        from goblin_assets.cli_common import complete_audit, open_session

        s = open_session(sessions.args(arguments), log=log)
        completed, mlflow_run = complete_audit(s, mlflow=sessions.mlflow)
        tracked = {"mlflow_run_id": mlflow_run} if mlflow_run else {}
        if not completed:   # the original failed as written: its diagnosis (logged to MLflow too)
            return {**s.failure_json(), **tracked}, f"{s.verdict().headline}; report {s.report_path}"
        doc = {**s.to_json(), **tracked}
        speed = doc["measured_speedup"]
        return doc, (f"{s.verdict().headline}; rules: {', '.join(doc['rules']) or 'none'}; measured speedup "
                     + (f"{speed:.2f}x" if speed is not None else "not observable") + f"; report {s.report_path}")
    return run


def _trace(arguments: dict[str, Any], log: Log) -> tuple[dict[str, Any], str]:
    from goblin_assets.cli_trace import analyse_traces, trace_json

    reps, diff = analyse_traces([arguments["path"], *([arguments["compare_to"]] if arguments.get("compare_to")
                                                      else [])], progress=log)
    wb = reps[0].metrics.waste_budget
    return trace_json(reps, diff), (f"{reps[0].path.name}: " + ", ".join(
        f"{k} {b.seconds * 1e3:.2f} ms ({b.status})" for k, b in wb.items()) + "; nothing was run")


def _memory(arguments: dict[str, Any], log: Log) -> tuple[dict[str, Any], str]:
    from goblin_assets.trace.memory_snapshot import analyze_snapshot, mib

    log(f"memory: reading {arguments['path']} with the restricted unpickler")
    rep = analyze_snapshot(arguments["path"])
    t = rep.totals
    return rep.to_json(), (f"{rep.path.name}: {mib(t['reserved_bytes'])} reserved, {mib(t['allocated_bytes'])} "
                           f"allocated, {t['oom_events']} OOM events" + (f"; {rep.diagnosis[0]}" if rep.diagnosis
                                                                          else ""))


def _fit(sessions: Sessions):
    def run(arguments: dict[str, Any], log: Log) -> tuple[dict[str, Any], str]:
        from goblin_assets.audit.fit import fit_text

        ans = sessions.session(arguments).memory_fit(arguments.get("device"))
        return ans, fit_text(ans).splitlines()[0]
    return run


def _schema(props: dict[str, Any], required: tuple[str, ...] = ("path",)) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


#: Tools of stages outside the agent's table: the memory and fit stages add theirs with :func:`register`.
EXTRA_TOOLS: list[McpTool] = []


def register(tool: McpTool) -> McpTool:
    """Add a tool to every ``goblin mcp`` server built after this call (returns it, for use as a value)."""
    if any(t.name == tool.name for t in EXTRA_TOOLS):
        raise ValueError(f"an MCP tool named {tool.name!r} is already registered")
    EXTRA_TOOLS.append(tool)
    return tool


def build_tools(sessions: Sessions) -> dict[str, McpTool]:
    """Every tool of one server, by name: the agent's tools, ``audit``, ``trace``, then :data:`EXTRA_TOOLS`."""
    tools = [McpTool(t.name, t.description, _schema({"path": PATH, **t.parameters.get("properties", {}),
                                                      "settings": SETTINGS}),
                     _agent_run(t, sessions, SUMMARIES.get(t.name, lambda d: f"{t.name}: done")),
                     COSTS.get(t.name, ""), long=t.name not in ("parse_config",))
             for t in AGENT_TOOLS.values()]
    tools.append(McpTool(
        "audit", "The whole audit, as goblin audit: parse, profile, rules, patch, paired benchmark, report; "
        "writes the warehouse rows and the report (and one MLflow run when a tracking URI is set). Returns "
        "goblin audit --json: verdict, measured speedup and its interval, rules, diff, report path.",
        _schema({"path": PATH, "settings": SETTINGS}), _audit(sessions),
        "every stage on a fresh session: minutes for a real workload, seconds for a replay folder", long=True))
    tools.append(McpTool(
        "trace", "Analyse a trace recorded elsewhere (Kineto .json/.json.gz or rocprofv3 JSON/CSV), or compare two: "
        "waste budget, temporal breakdown, kernel categories, critical path, findings. Nothing is run.",
        _schema({"path": {"type": "string", "description": "the trace file"},
                 "compare_to": {"type": "string", "description": "optional: a second trace to diff against"}}),
        _trace, "reads the trace: seconds (HTA on large traces: longer)", long=True))
    tools.append(McpTool(
        "memory", "Read a memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes) with a restricted "
        "unpickler: reserved vs allocated, the largest free block of each segment against the failed request, live "
        "memory by frame and category, the allocator timeline around the OOM. Returns goblin memory --json.",
        _schema({"path": {"type": "string", "description": "the snapshot .pickle file"}}),
        _memory, "reads the file: seconds; nothing is run"))
    tools.append(McpTool(
        "fit", "Will the configured training step fit in memory (goblin fit --json)? Weights, gradients, optimizer "
        "state, master copies, activations per sample and transients, each with its provenance, against the "
        "device's memory (device: mi300x, h100, a100, ...; default the runner's device or the CPU cap), the "
        "margin, and the levers that bring it under (micro-batch with accumulation, checkpointing, optimizer, "
        "LoRA rank, sequence length, ZeRO by world size). The configured run itself is never started.",
        _schema({"path": PATH, "device": {"type": "string", "description": "a part of the device table"},
                 "settings": SETTINGS}),
        _fit(sessions), "two short probe runs at small micro-batches: seconds to a minute", long=True))
    for t in EXTRA_TOOLS:
        tools.append(t)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate MCP tool names: {sorted({n for n in names if names.count(n) > 1})}")
    return {t.name: t for t in tools}


def check_arguments(tool: McpTool, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """``arguments`` validated against the tool's input schema (jsonschema, Draft 2020-12).

    Raises GoblinError naming the argument and the problem.
    """
    from jsonschema import Draft202012Validator

    args = dict(arguments or {})
    errors = sorted(Draft202012Validator(tool.input_schema).iter_errors(args), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.path) or "arguments"
        raise GoblinError(f"{where}: {e.message}")
    return args
