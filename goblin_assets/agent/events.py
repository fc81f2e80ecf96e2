"""The typed events of a conversational audit, and their markdown transcript.

An audit conversation is a stream of four kinds of event: the model's
``thought`` (text it wrote beside its tool calls), a ``tool_call`` (a tool
name and its arguments), the ``tool_result`` the model was given (a redacted
JSON summary, never a raw trace), and one ``final_report`` that ends every
conversation, even one cut off by the tool-call cap or a failing model.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class Thought(BaseModel):
    """Text the model wrote on a turn on which it also called tools (redacted)."""

    kind: Literal["thought"] = "thought"
    text: str


class ToolCall(BaseModel):
    """One tool call as the model asked for it.

    ``arguments`` is the parsed JSON object, or the raw text (redacted) when
    the model sent something that is not a JSON object.
    """

    kind: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: dict[str, Any] | str


class ToolResult(BaseModel):
    """What the model got back for one call: exactly ``content``, a redacted JSON summary.

    Units: ``elapsed_s`` is wall-clock seconds spent in the tool.
    """

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    ok: bool
    content: str
    elapsed_s: float = 0.0


class FinalReport(BaseModel):
    """The end of every conversation.

    ``text`` is the model's final answer (or a note saying why there is
    none); ``report_markdown`` is the audit report rendered by
    ``report/markdown.py`` when the session compared the runs; ``capped`` says
    the tool-call cap stopped the loop; ``model_error`` names a failure of
    the model server (HTTP error, timeout, unreachable, malformed response).
    """

    kind: Literal["final_report"] = "final_report"
    text: str
    backend: str
    tool_calls: int
    capped: bool = False
    model_error: str | None = None
    report_markdown: str | None = None
    report_path: str | None = None


AgentEvent = Annotated[Thought | ToolCall | ToolResult | FinalReport, Field(discriminator="kind")]


def _json_block(text: str) -> str:
    try:
        text = json.dumps(json.loads(text), indent=2)
    except (TypeError, ValueError):
        pass
    return f"```json\n{text}\n```"


def transcript_markdown(events: list[BaseModel]) -> str:
    """The conversation as markdown (for Dagster's metadata view); events are already redacted."""
    out: list[str] = []
    for ev in events:
        if isinstance(ev, Thought):
            out += [f"> {line}" for line in ev.text.splitlines() or [""]] + [""]
        elif isinstance(ev, ToolCall):
            args = ev.arguments if isinstance(ev.arguments, str) else json.dumps(ev.arguments)
            out += [f"**tool call** `{ev.name}` ({ev.call_id}): `{args}`", ""]
        elif isinstance(ev, ToolResult):
            out += [f"**{'result' if ev.ok else 'error'}** of `{ev.name}` ({ev.elapsed_s:.1f} s):", "",
                    _json_block(ev.content), ""]
        elif isinstance(ev, FinalReport):
            note = " (stopped by the tool-call cap)" if ev.capped else ""
            out += ["---", f"## Final report ({ev.backend}, {ev.tool_calls} tool calls{note})", ""]
            if ev.model_error:
                out += [f"**The model failed:** {ev.model_error}", ""]
            out += [ev.text, ""]
            if ev.report_markdown:
                out += ["<details><summary>audit report</summary>", "", ev.report_markdown, "</details>", ""]
    return "\n".join(out) + "\n"
