"""The MCP server of ``goblin mcp``: the tools of tools.py, two kinds of resources, stdio or streamable HTTP.

Built on the ``mcp`` SDK's low-level :class:`mcp.server.lowlevel.Server`
(https://py.sdk.modelcontextprotocol.io/): the input schemas are the tool
table's own, not inferred from Python signatures.

- ``tools/call`` runs the tool in a worker thread (the event loop keeps
  answering); each progress line of the audit session becomes a
  ``notifications/progress`` for the call's progress token (MCP 2025-11-25,
  "Progress": ``progress`` increases with every notification, ``total``
  unknown).  The result carries ``structuredContent`` (the tool's JSON) and two
  text blocks: the one-line summary and the same JSON serialized (the spec's
  "Structured Content": a tool returning structured content SHOULD also return
  it as text).  Bad input, a failed stage or a bug in one is a result with
  ``isError: true`` and the one line ``goblin TOOL: error: MESSAGE`` (as the CLI
  prints it), never an end of the server.
- Resources: ``goblin://kb/rules`` (the packaged rules, YAML) and
  ``goblin://reports/<workload>`` (the last report of each workload in the
  warehouse's ``audits`` table, markdown), redacted.

stdio: the protocol owns stdout (the SDK points fd 1 at stderr while it
serves, so a child's stray output cannot corrupt it); progress lines also go
to stderr.  HTTP: ``127.0.0.1`` only (the SDK's DNS-rebinding protection for
localhost is on), path ``/mcp``.
"""
from __future__ import annotations

import itertools
import json
import sys
import traceback
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from pydantic import ValidationError

from goblin_assets.errors import GoblinError
from goblin_assets.mcp_server.tools import McpTool, Sessions, build_tools, check_arguments
from goblin_assets.redact import redact, redact_tree

#: The only address ``--http`` binds.
HOST = "127.0.0.1"
KB_URI = "goblin://kb/rules"
REPORT_URI = "goblin://reports/"

#: The last report of each workload: the newest audit with a report.
LAST_REPORTS_SQL = ("SELECT workload, report_path, created_at FROM audits WHERE report_path IS NOT NULL "
                    "QUALIFY row_number() OVER (PARTITION BY workload ORDER BY created_at DESC) = 1 "
                    "ORDER BY workload")


def _stderr(line: str) -> None:
    sys.stderr.write(line.rstrip() + "\n")
    sys.stderr.flush()


def error_line(tool: str, exc: BaseException) -> str:
    """The one line a failed call returns: ``goblin TOOL: error: ...`` (``internal error`` for a bug)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    msg = lines[0] if isinstance(exc, GoblinError) else f"internal error: {type(exc).__name__}: {lines[0]}"
    return redact(f"goblin {tool}: error: {msg}")


def call(tool: McpTool, sessions: Sessions, arguments: dict[str, Any] | None,
         progress) -> types.CallToolResult:
    """Run one tool (blocking; in a worker thread) and wrap its result or its error for the protocol."""
    try:
        args = check_arguments(tool, arguments)
        with sessions.lock:
            sessions._log = progress
            try:
                doc, summary = tool.run(args, progress)
            finally:
                sessions._log = lambda _: None
    except (GoblinError, ValidationError) as exc:
        return types.CallToolResult(content=[types.TextContent(text=error_line(tool.name, exc))], is_error=True)
    except Exception as exc:  # a bug in a stage must not end the server: the agent reads the reason
        _stderr(traceback.format_exc())
        return types.CallToolResult(content=[types.TextContent(text=error_line(tool.name, exc))], is_error=True)
    doc = json.loads(json.dumps(redact_tree(doc), default=str))
    return types.CallToolResult(content=[types.TextContent(text=redact(summary)),
                                         types.TextContent(text=json.dumps(doc))], structured_content=doc)


def last_reports() -> dict[str, str]:
    """``{workload: report.md path}`` of the newest report of each workload (empty when the warehouse cannot be
    read now, or has no audits yet)."""
    from goblin_assets.warehouse.db import query

    try:
        df = query(LAST_REPORTS_SQL)
    except GoblinError:
        return {}
    return {r.workload: r.report_path for r in df.itertuples()}


def build_server(mlflow: str | None = None) -> Server:
    """The server: tools of :func:`build_tools`, the KB and report resources.  ``mlflow``: the tracking URI the
    ``audit`` tool logs to (default ``$GOBLIN_MLFLOW_TRACKING_URI``)."""
    sessions = Sessions(mlflow)
    tools = build_tools(sessions)

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=t.name, description=t.description,
                                                       input_schema=t.input_schema) for t in tools.values()])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            return types.CallToolResult(is_error=True, content=[types.TextContent(
                text=f"goblin mcp: error: unknown tool {params.name!r}; the tools are: {', '.join(tools)}")])
        token, counter = anyio.lowlevel.current_token(), itertools.count(1)

        def progress(line: str) -> None:
            line = redact(line)
            _stderr(f"{tool.name}: {line}")
            try:
                anyio.from_thread.run(ctx.session.report_progress, float(next(counter)), None, line, token=token)
            except Exception:  # the client went away or the loop is closing: the work goes on
                pass

        return await anyio.to_thread.run_sync(call, tool, sessions, params.arguments, progress)

    async def list_resources(ctx, params) -> types.ListResourcesResult:
        res = [types.Resource(uri=KB_URI, name="kb-rules", mime_type="application/yaml",
                              description="the packaged tuning rules (detect conditions, fixes, citations)")]
        res += [types.Resource(uri=REPORT_URI + wl, name=f"report-{wl}", mime_type="text/markdown",
                               description=f"the last audit report of {wl}")
                for wl in await anyio.to_thread.run_sync(last_reports)]
        return types.ListResourcesResult(resources=res)

    async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        if uri == KB_URI:
            from goblin_assets.kb.rules import DEFAULT_KB

            text, mime = DEFAULT_KB.read_text(encoding="utf-8"), "application/yaml"
        elif uri.startswith(REPORT_URI):
            path = (await anyio.to_thread.run_sync(last_reports)).get(uri[len(REPORT_URI):])
            try:
                text, mime = open(path, encoding="utf-8").read(), "text/markdown"
            except (OSError, TypeError):
                raise MCPError(-32002, f"no report for {uri}: audit that workload first") from None
        else:
            raise MCPError(-32002, f"unknown resource {uri}; the resources are {KB_URI} and {REPORT_URI}<workload>")
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime,
                                                                             text=redact(text))])

    return Server("goblin", version=_version(), instructions=(
        "Goblin audits PyTorch / Hugging Face fine-tuning workloads. Give every tool the workload's path. "
        "parse_config is instant; profile_run, benchmark and audit run the workload (minutes); a replay folder "
        "is never run."), on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_read_resource=read_resource)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("goblin-assets")
    except PackageNotFoundError:
        return "0"


async def serve_stdio(server: Server) -> None:
    """Serve one client over stdin/stdout until it closes stdin."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(server: Server, port: int) -> None:
    """Serve streamable HTTP at ``http://127.0.0.1:PORT/mcp`` until interrupted.

    Raises GoblinError when the port cannot be listened on (in use, out of range, privileged).
    """
    import socket

    import uvicorn

    try:
        with socket.socket() as probe:
            probe.bind((HOST, port))
    except (OSError, OverflowError) as exc:
        raise GoblinError(f"{HOST}:{port}: cannot listen there ({getattr(exc, 'strerror', None) or exc}); "
                          "pick another --port") from None

    app = server.streamable_http_app(host=HOST)
    _stderr(f"goblin mcp: serving streamable HTTP on http://{HOST}:{port}/mcp")
    uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning")).run()
