"""The agent loop: a backend picks tools, the session runs them, events stream out.

At most :data:`MAX_TOOL_CALLS` tool calls per conversation (a hard cap): a
model that asks for more after the last one has those calls refused, is
asked without tools for its final answer, and a ``final_report`` ends the
stream anyway.  Every call's arguments are checked
against the tool's schema first: text that is not a JSON object, an unknown
tool or argument, or a failing stage becomes an error result the model can
read and react to; it never ends the loop.  A failing model server ends it
with a final report that names the failure.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from goblin_assets.agent.backend import DEFAULT_QUESTION, MAX_TOOL_CALLS, AgentBackendError, Backend, ToolCallRequest
from goblin_assets.agent.events import AgentEvent, FinalReport, Thought, ToolCall, ToolResult
from goblin_assets.agent.tools import TOOLS, Tool
from goblin_assets.audit.session import AuditSession
from goblin_assets.errors import GoblinError, RunFailed
from goblin_assets.redact import redact
from goblin_assets.redact import redact_tree as redact_all
from goblin_assets.report.markdown import report_markdown

#: Strings in a tool result longer than this are cut (a long diff), and a whole result longer than
#: MAX_RESULT_CHARS too, so that one result cannot flood the model's context.
MAX_STRING_CHARS, MAX_RESULT_CHARS = 3000, 12000

CAP_MESSAGE = ("The tool budget ({n} calls) is spent: no more tools will run. "
               "Write the final report now from the results you have.")

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list}


def _arguments(req: ToolCallRequest, tools: Mapping[str, Tool]) -> tuple[dict[str, Any], str | None]:
    """(the decoded arguments, None) or ({}, why they cannot be used)."""
    if req.name not in tools:
        return {}, f"unknown tool {req.name!r}; the tools are: {', '.join(tools)}"
    raw = req.arguments
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            return {}, f"arguments are not valid JSON ({exc.msg} at character {exc.pos}); send a JSON object"
    if not isinstance(raw, dict):
        return {}, f"arguments must be a JSON object, not {type(raw).__name__}"
    props = tools[req.name].parameters.get("properties", {})
    unknown = sorted(set(raw) - set(props))
    if unknown:
        return {}, (f"unknown argument(s) {', '.join(unknown)} for {req.name}; it takes: "
                    f"{', '.join(props) or 'no arguments'}")
    for k, v in raw.items():
        want = props[k].get("type")
        if v is not None and want in _JSON_TYPES and not isinstance(v, _JSON_TYPES[want]):
            return {}, f"argument {k} must be a JSON {want}, not {type(v).__name__}"
    return raw, None


def _failure(exc: Exception) -> str:
    """A short reason for a failed tool: the error's first line, plus the end of a failed run's stderr."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    msg = lines[0] if isinstance(exc, GoblinError) else f"{type(exc).__name__}: {lines[0]}"
    if isinstance(exc, RunFailed) and exc.metrics is not None and exc.metrics.stderr_tail:
        tail = [ln for ln in exc.metrics.stderr_tail.strip().splitlines() if ln.strip()][-3:]
        msg += " | stderr ends: " + " / ".join(t.strip() for t in tail)
    return msg


def _clip(obj: Any) -> Any:
    if isinstance(obj, str) and len(obj) > MAX_STRING_CHARS:
        return obj[:MAX_STRING_CHARS] + f"... ({len(obj) - MAX_STRING_CHARS} more characters)"
    if isinstance(obj, dict):
        return {k: _clip(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clip(v) for v in obj]
    return obj


def tool_content(payload: dict[str, Any]) -> str:
    """The JSON text a model receives for one result: every string redacted, long strings and results cut."""
    text = json.dumps(_clip(redact_all(payload)), default=str)
    if len(text) > MAX_RESULT_CHARS:
        text = json.dumps({"ok": payload.get("ok", True), "truncated": True, "text": text[:MAX_RESULT_CHARS]})
    return text


def _call(req: ToolCallRequest, tools: Mapping[str, Tool], session: AuditSession,
          backend: Backend) -> Iterator[AgentEvent]:
    args, error = _arguments(req, tools)
    yield ToolCall(call_id=req.id, name=req.name,
                   arguments=redact_all(args) if error is None else redact(str(req.arguments)))
    t0 = time.perf_counter()
    payload: dict[str, Any] = {}
    if error is None:
        try:
            payload = {"ok": True, **tools[req.name].fn(session, **args)}
        except (GoblinError, ValidationError) as exc:
            error = _failure(exc)
        except Exception as exc:  # a bug in a stage must not end the conversation; the model reads the reason
            error = "internal error: " + _failure(exc)
    if error is not None:
        payload = {"ok": False, "error": error}
    content = tool_content(payload)
    backend.add_tool_result(req.id, req.name, content)
    yield ToolResult(call_id=req.id, name=req.name, ok=error is None, content=content,
                     elapsed_s=round(time.perf_counter() - t0, 3))


def _final(session: AuditSession, backend: Backend, text: str, calls: int, capped: bool = False,
           model_error: str | None = None) -> FinalReport:
    if not text.strip():
        text = ("The model failed before a final answer." if model_error else
                f"Stopped after {calls} tool calls (the cap) without a final answer from the model." if capped else
                "The model ended without a final answer.")
    rep = session.results.get("audit_report")
    return FinalReport(text=redact(text), backend=backend.name, tool_calls=calls, capped=capped,
                       model_error=model_error,
                       report_markdown=report_markdown(rep, "report.png") if rep is not None else None,
                       report_path=str(session.report_path) if session.report_path else None)


def run_agent(backend: Backend, session: AuditSession, question: str = "",
              tools: Mapping[str, Tool] = TOOLS, max_tool_calls: int = MAX_TOOL_CALLS) -> Iterator[AgentEvent]:
    """Run one conversational audit; yield its events as they happen, a ``final_report`` last.

    Parameters
    ----------
    backend
        The model (or the offline planner).
    session
        The workload and its stage results (possibly seeded from a materialized audit).
    question
        The user's question (default :data:`~goblin_assets.agent.backend.DEFAULT_QUESTION`).
    tools
        Name -> Tool (default: the six audit tools); their schemas are offered on every turn.
    max_tool_calls
        The cap; calls beyond it are answered with an error and not run.

    Yields
    ------
    Thought, ToolCall, ToolResult, FinalReport
        Exactly one FinalReport, last, whatever the model does.
    """
    schemas = [t.schema() for t in tools.values()]
    calls = 0
    try:
        backend.add_user_message(question.strip() or DEFAULT_QUESTION)
        while True:
            turn = backend.next_turn(schemas)
            if not turn.tool_calls:
                yield _final(session, backend, turn.text, calls)
                return
            if turn.text.strip():
                yield Thought(text=redact(turn.text.strip()))
            capped = calls >= max_tool_calls  # the model wants more after the last allowed call
            for req in turn.tool_calls:
                if calls >= max_tool_calls:  # every call of the turn needs an answer, even past the cap
                    backend.add_tool_result(req.id, req.name, tool_content(
                        {"ok": False, "error": f"not run: the cap of {max_tool_calls} tool calls is reached"}))
                    continue
                calls += 1
                yield from _call(req, tools, session, backend)
            if capped:
                break
        backend.add_user_message(CAP_MESSAGE.format(n=max_tool_calls))
        turn = backend.next_turn([])
        yield _final(session, backend, turn.text, calls, capped=True)
    except AgentBackendError as exc:
        yield _final(session, backend, "", calls, capped=calls >= max_tool_calls, model_error=str(exc))
