"""The conversational audit agent: a model (or the offline planner) calling the audit's stages as tools.

    from goblin_assets.agent import AuditSession, make_backend, run_agent
    for event in run_agent(make_backend(), AuditSession.start(workload, runner), "what if I double the batch?"):
        print(event.kind)

Modules: ``backend`` (the Backend protocol, system prompt), ``factory``
(``make_backend``: picks an implementation),
``openai_chat`` (any OpenAI-compatible chat-completions server),
``planner`` (the offline, deterministic planner), ``tools`` (the six tools
over the stage functions), ``loop`` (the capped tool-calling loop),
``events`` (the typed events and the markdown transcript).  No Dagster here.
"""
from goblin_assets.agent.backend import (
    DEFAULT_QUESTION, MAX_TOOL_CALLS, SYSTEM_PROMPT, AgentBackendError, Backend, ToolCallRequest, Turn,
)
from goblin_assets.agent.events import AgentEvent, FinalReport, Thought, ToolCall, ToolResult, transcript_markdown
from goblin_assets.agent.factory import make_backend
from goblin_assets.agent.loop import run_agent
from goblin_assets.agent.openai_chat import OpenAIChatBackend
from goblin_assets.agent.planner import OfflinePlanner
from goblin_assets.agent.tools import CANONICAL_ORDER, TOOLS, AuditSession, Tool, ToolInputError

__all__ = [
    "DEFAULT_QUESTION", "SYSTEM_PROMPT", "AgentBackendError", "Backend", "ToolCallRequest", "Turn", "make_backend",
    "AgentEvent", "FinalReport", "Thought", "ToolCall", "ToolResult", "transcript_markdown",
    "MAX_TOOL_CALLS", "run_agent", "OpenAIChatBackend", "OfflinePlanner",
    "CANONICAL_ORDER", "TOOLS", "AuditSession", "Tool", "ToolInputError",
]
