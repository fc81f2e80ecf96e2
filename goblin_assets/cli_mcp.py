"""``goblin mcp``: the audit's stages as Model Context Protocol tools, for coding agents.

    goblin mcp                     # stdio (what an agent launches)
    goblin mcp --http [--port N]   # streamable HTTP on 127.0.0.1:N/mcp (default 8765)
    goblin mcp [--mlflow URI]      # the audit tool also logs each audit to MLflow

The tools, resources and their costs: docs/agents.md, goblin_assets/mcp_server/.
"""
from __future__ import annotations

import argparse

from goblin_assets.errors import GoblinError

#: The default ``--http`` port.
DEFAULT_PORT = 8765


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve until the client closes stdin (stdio) or until interrupted (HTTP); exit 2 when mcp is missing."""
    try:
        import anyio

        from goblin_assets.mcp_server.server import build_server, serve_http, serve_stdio
    except ImportError as exc:
        raise GoblinError(f"the mcp package is not installed ({exc.name}): pip install 'goblin-assets[agents]'") \
            from None
    server = build_server(args.mlflow)
    if args.http:
        serve_http(server, args.port)
    else:
        anyio.run(serve_stdio, server)
    return 0


def add_mcp_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``goblin mcp``."""
    m = sub.add_parser("mcp", help="serve the audit's stages as MCP tools for coding agents (stdio, or --http)")
    m.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 instead of stdio")
    m.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the --http port (default {DEFAULT_PORT})")
    m.add_argument("--mlflow", metavar="URI", default=None,
                   help="log every audit tool call as one MLflow run to this tracking URI "
                        "(default $GOBLIN_MLFLOW_TRACKING_URI)")
    m.set_defaults(fn=cmd_mcp)
