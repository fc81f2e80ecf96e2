"""The ``goblin chat`` command: the conversational audit agent in the terminal.

    goblin chat PATH [--question TEXT] [--base-url URL] [--model NAME] [--steps N] [--json]

Offline by default: without ``--base-url`` (or ``$GOBLIN_LLM_BASE_URL``) the
deterministic planner drives the tools.  With one, any OpenAI-compatible
chat-completions server does (vLLM, Ollama, Hugging Face Inference
endpoints ...): ``--model`` / ``$GOBLIN_LLM_MODEL`` names the model and
``$GOBLIN_LLM_API_KEY`` (never printed) authenticates.  Events stream as they
happen; ``--json`` prints one JSON object per event.  At the end the audits the chat measured (its
own and each what-if's) are written to the warehouse, as ``goblin audit`` writes its audit
(goblin_assets/agent/record.py).  Exit code 2 when the
model server failed (the final report says how) or on a bad path.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.text import Text

from goblin_assets.cli_common import add_settings_options, console, open_session, out

if TYPE_CHECKING:  # the agent (its stages, pandas) is imported when a chat runs, not for every command
    from goblin_assets.agent.events import AgentEvent


def _gist(content: str, width: int = 160) -> str:
    text = " ".join(content.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def show_event(ev: AgentEvent, con: Console = out) -> None:
    """Print one event for a person: thoughts dim, calls and results one line each, the final report as markdown."""
    from goblin_assets.agent.events import FinalReport, Thought, ToolCall, ToolResult

    if isinstance(ev, Thought):
        con.print(Text(ev.text, style="italic"))
    elif isinstance(ev, ToolCall):
        args = ev.arguments if isinstance(ev.arguments, str) else json.dumps(ev.arguments)
        con.print(Text.assemble(("→ ", "cyan"), (ev.name, "bold cyan"), (f" {args}", "cyan")))
    elif isinstance(ev, ToolResult):
        con.print(Text.assemble(("← ", "green" if ev.ok else "red"), (ev.name, "bold"),
                                (f" {'ok' if ev.ok else 'error'} ({ev.elapsed_s:.1f} s) ", "green" if ev.ok else "red"),
                                (_gist(ev.content), "dim")))
    elif isinstance(ev, FinalReport):
        title = f"final report: {ev.backend}, {ev.tool_calls} tool calls" + (" (cap reached)" if ev.capped else "")
        body = ev.text + (f"\n\n**The model failed:** {ev.model_error}" if ev.model_error else "")
        con.print(Panel(Markdown(body), title=title, border_style="red" if ev.model_error else "green"))
        if ev.report_path:
            con.print(f"report: {ev.report_path}", markup=False, highlight=False)


def cmd_chat(args: argparse.Namespace) -> int:
    """``goblin chat``: run the agent over a workload; 0 on a final report, 2 when the model failed."""
    from goblin_assets.agent import run_agent
    from goblin_assets.agent.events import FinalReport
    from goblin_assets.agent.factory import make_backend
    from goblin_assets.agent.record import audits_of, conversation_frames
    from goblin_assets.warehouse.db import write

    backend = make_backend(args.base_url, args.model)
    session = open_session(args)
    wl = session.workload
    if not args.json:
        console.print(f"[dim]goblin chat: {wl.name} with {backend.name}[/dim]", highlight=False)
    code = 0
    for ev in run_agent(backend, session, args.question or ""):
        if args.json:
            sys.stdout.write(ev.model_dump_json() + "\n")
            sys.stdout.flush()
        else:
            show_event(ev)
        if isinstance(ev, FinalReport) and ev.model_error:
            code = 2
    frames = conversation_frames(session)   # the chat's audit and its measured what-ifs, as goblin audit writes
    if frames:
        counts = write(frames)
        console.print(f"[dim]warehouse: {sum(counts.values())} rows in {len(counts)} tables "
                      f"({len(audits_of(session))} audit(s))[/dim]")
    return code


def add_chat_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``goblin chat`` on the ``goblin`` sub-command parser (sets ``fn``, as the other commands do)."""
    c = subparsers.add_parser("chat", help="ask the audit agent about a workload (offline planner unless a model "
                                           "server is configured)")
    c.add_argument("path", help="workload folder (with workload.yaml) or a training script")
    c.add_argument("--question", "-q", default="", help='e.g. "what if I double the batch?" (default: a full audit)')
    c.add_argument("--base-url", default=None,
                   help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (default $GOBLIN_LLM_BASE_URL; "
                        "none: the offline planner)")
    c.add_argument("--model", default=None, help="model name on that server (default $GOBLIN_LLM_MODEL)")
    add_settings_options(c)
    c.add_argument("--json", action="store_true", help="print the events as JSON lines")
    c.set_defaults(fn=cmd_chat)
    return c
