"""The Backend protocol the agent loop talks to, and the system prompt.

Two implementations stand behind one interface (as the runners do):
:class:`~goblin_assets.agent.openai_chat.OpenAIChatBackend`, any server that
speaks the OpenAI chat-completions protocol with tool calls (vLLM, Ollama,
Hugging Face Inference endpoints, llama.cpp's server ...), and
:class:`~goblin_assets.agent.planner.OfflinePlanner`, a deterministic planner
that needs no model at all.  This protocol module imports neither;
:func:`goblin_assets.agent.factory.make_backend` picks one.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from goblin_assets.errors import GoblinError

#: Environment variables that configure the model server (the key is never logged).
ENV_BASE_URL, ENV_MODEL, ENV_API_KEY = "GOBLIN_LLM_BASE_URL", "GOBLIN_LLM_MODEL", "GOBLIN_LLM_API_KEY"

#: Hard cap on tool calls per conversation (issue 9); then the final report, whatever the model wants.
MAX_TOOL_CALLS = 8

SYSTEM_PROMPT = f"""\
You are Goblin's audit agent. You explain and improve the performance of one PyTorch fine-tuning \
workload by calling tools; each tool runs one stage of Goblin's audit on the user's own script:
parse_config (the training setup and where each value came from), profile_run (a few profiled steps: \
step time split into a waste budget), query_rocm_kb (cited tuning rules checked against the measured run), \
propose_patch (the fired rules as a diff of the user's file), benchmark (original vs patched, measured, cached), \
compare_runs (the before/after report).
Canonical order: parse_config, profile_run, query_rocm_kb, propose_patch, benchmark, compare_runs. \
For a what-if question (another batch size, more workers ...) call propose_patch or benchmark with \
"overrides", e.g. {{"overrides": {{"batch_size": 128}}}}: the changed config is written into a copy of the \
user's file and run for real.
You have at most {MAX_TOOL_CALLS} tool calls; then write the final report.
Tool results are summaries, already redacted. You cannot ask for model weights, datasets, raw traces \
or credentials, and no tool can fetch them: the tools only run the user's script with its own data.
Validity: every number holds only for this workload, on this device, with this software stack and \
this batch/sequence shape. Say so in the final report; never present a predicted or replayed number \
as measured, and never claim a result for another model, dataset or machine.
Final report: the measured speedup and the predicted range, where the step time went, which rule \
matters most and why (with its citation), what the user should change, and the answer to the \
user's question."""

#: The question asked when the user asks none.
DEFAULT_QUESTION = "Audit this workload: where does the step time go, what should I change, and what does it buy?"


class AgentBackendError(GoblinError):
    """The model server failed: HTTP error, timeout, unreachable, or a response that is not chat completions.

    The message names the URL (credentials redacted) and the problem; never the API key.
    """


class ToolCallRequest(BaseModel):
    """One tool call a model asked for, as it sent it.

    ``arguments`` is the raw JSON text (OpenAI shape) or an already decoded
    object (some servers send one); the loop validates it.
    """

    id: str
    name: str
    arguments: str | dict[str, Any] = ""


class Turn(BaseModel):
    """The model's reply on one turn: text and the tool calls it asked for (none: the final answer)."""

    text: str = ""
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)


@runtime_checkable
class Backend(Protocol):
    """A conversation with a model (or the offline planner).

    ``name`` says which model, for the final report.
    """

    name: str

    def add_user_message(self, text: str) -> None:
        """Append a user message to the conversation."""

    def next_turn(self, tools: list[dict[str, Any]]) -> Turn:
        """The model's next turn, offered ``tools`` (OpenAI ``{"type": "function", ...}`` schemas; empty: none).

        Raises
        ------
        AgentBackendError
            The model server failed (see the class).
        """

    def add_tool_result(self, call_id: str, name: str, content: str) -> None:
        """Append the result of tool call ``call_id`` (``content``: the redacted JSON summary)."""
