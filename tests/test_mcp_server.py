"""``goblin mcp`` driven by the mcp SDK's own client: over stdio (a subprocess) and over streamable HTTP on 127.0.0.1.

Both transports run the same conversation (:func:`drive`): list the tools, parse a shipped workload's
config (the structured content is the chat agent's ``parse_config`` result, redacted), check the rules on
a shipped replay folder, audit that replay end to end while progress notifications arrive, read the
report it wrote back as a resource, and get a tool error, not a dead server, for a missing path.
A replay folder is never run, so the whole audit costs seconds; both servers share one GOBLIN_HOME, so
the second reads the rule embeddings the first audit wrote to the warehouse.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import REPO, WORKLOADS

pytestmark = pytest.mark.slow

REPLAY = WORKLOADS / "synthetic" / "no_loader_workers"
SESSION_TOOLS = ("parse_config", "profile_run", "query_rocm_kb", "propose_patch", "benchmark", "compare_runs")


@pytest.fixture(scope="module")
def server_env(tmp_path_factory) -> dict[str, str]:
    """The servers' environment: this suite's, with one private GOBLIN_HOME for the module."""
    return {**os.environ, "GOBLIN_HOME": str(tmp_path_factory.mktemp("mcp_home")), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def expected_config() -> dict:
    """The chat agent's parse_config result for digits_mlp, computed in this process (nothing runs)."""
    from goblin_assets.agent.tools import TOOLS
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.redact import redact_tree
    from goblin_assets.runners.workload import load_workload

    return redact_tree(TOOLS["parse_config"].fn(AuditSession.open(load_workload(WORKLOADS / "digits_mlp"))))


async def drive(client: Client, expected_config: dict) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(SESSION_TOOLS) | {"audit", "trace"} <= set(tools)
    for name, t in tools.items():
        assert t.input_schema["type"] == "object" and "path" in t.input_schema["required"], name
    assert "symptom" in tools["query_rocm_kb"].input_schema["properties"]
    assert "overrides" in tools["profile_run"].input_schema["properties"]

    r = await client.call_tool("parse_config", {"path": str(WORKLOADS / "digits_mlp")})
    assert not r.is_error, r.content
    assert r.structured_content == expected_config
    assert r.structured_content["config"]["batch_size"] == 64
    assert json.loads(r.content[1].text) == r.structured_content     # the same JSON as text
    assert "batch_size=64" in r.content[0].text                       # the one-line summary

    r = await client.call_tool("query_rocm_kb", {"path": str(REPLAY), "symptom": "the GPU waits for the data loader"})
    assert not r.is_error, r.content
    kb = r.structured_content
    assert "data.loader_workers_with_threads" in [f["rule"] for f in kb["fired"]]
    assert kb["rules_checked"] >= len(kb["fired"]) and kb["search"]
    assert "data.loader_workers_with_threads" in r.content[0].text

    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    r = await client.call_tool("audit", {"path": str(REPLAY)}, progress_callback=on_progress)
    assert not r.is_error, r.content
    doc = r.structured_content
    assert doc["workload"] == "no_loader_workers" and doc["rules"] == ["data.loader_workers_with_threads"]
    assert doc["measured_speedup"] is None and doc["patched"] is None       # a replay: nothing was measured
    assert "replay runs nothing" in doc["not_observable"]["benchmarks"]
    assert doc["provenance"] in ("replayed", "modelled") and doc["verdict"]["headline"]
    values = [v for v, _ in progress]
    assert len(values) >= 11 and values == sorted(set(values))       # one per line, increasing
    messages = [m for _, m in progress]
    assert "[1/11] training_config" in messages and "[11/11] audit_report" in messages
    assert "measured speedup not observable" in r.content[0].text

    uri = "goblin://reports/no_loader_workers"
    assert uri in [str(res.uri) for res in (await client.list_resources()).resources]
    report = (await client.read_resource(uri)).contents[0].text
    assert report.startswith("# Goblin audit: no_loader_workers")
    assert "rules:" in (await client.read_resource("goblin://kb/rules")).contents[0].text

    missing = REPO / "workloads" / "no_such_workload"
    r = await client.call_tool("parse_config", {"path": str(missing)})
    assert r.is_error and r.structured_content is None
    assert r.content[0].text == f"goblin parse_config: error: {missing}: no such workload folder or file"
    r = await client.call_tool("profile_run", {"path": str(REPLAY), "settings": {"profiled_steps": 0}})
    assert r.is_error and "settings.profiled_steps" in r.content[0].text
    r = await client.call_tool("parse_config", {"path": str(WORKLOADS / "digits_mlp")})  # the server is alive
    assert not r.is_error and r.structured_content == expected_config


def test_mcp_over_stdio(server_env, expected_config):
    params = StdioServerParameters(command=sys.executable, args=["-m", "goblin_assets.cli", "mcp"], env=server_env,
                                   cwd=str(REPO))

    async def main() -> None:
        async with Client(params, read_timeout_seconds=600) as client:
            await drive(client, expected_config)

    anyio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mcp_over_http(server_env, expected_config):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "goblin_assets.cli", "mcp", "--http", "--port", str(port)],
                            env=server_env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until it listens (importing the stages takes a few seconds)
            assert proc.poll() is None, proc.stdout.read()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail("goblin mcp --http did not listen within 120 s")

        async def main() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=600) as client:
                await drive(client, expected_config)

        anyio.run(main)
        assert proc.poll() is None, "the server exited"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_tool_errors_are_one_redacted_line_and_bugs_do_not_escape():
    """In process, no transport: a token in a bad path never reaches the agent, and a bug in a tool is an
    ``internal error`` result, not an exception out of the server's handler."""
    from goblin_assets.mcp_server.server import call
    from goblin_assets.mcp_server.tools import McpTool, Sessions, build_tools

    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    sessions = Sessions()
    tools = build_tools(sessions)
    r = call(tools["parse_config"], sessions, {"path": f"/no/{secret}/train.py"}, lambda _: None)
    assert r.is_error and len(r.content) == 1 and "\n" not in r.content[0].text
    assert r.content[0].text.startswith("goblin parse_config: error: /no/") and secret not in r.content[0].text
    r = call(tools["trace"], sessions, {"path": str(REPO / "pyproject.toml"), "extra": 1}, lambda _: None)
    assert r.is_error and "additional properties" in r.content[0].text.lower()

    def broken(arguments, log):
        return {}["missing"]

    r = call(McpTool("broken", "", {"type": "object"}, broken, ""), sessions, {}, lambda _: None)
    assert r.is_error and r.content[0].text == "goblin broken: error: internal error: KeyError: 'missing'"


def test_the_memory_tool_reads_a_snapshot_and_refuses_a_malicious_pickle(tmp_path):
    """``memory`` is ``goblin memory --json`` (the same report), and a pickle that would run code is a tool error."""
    import pickle

    from goblin_assets.mcp_server.server import call
    from goblin_assets.mcp_server.tools import Sessions, build_tools
    from goblin_assets.trace.memory_snapshot import analyze_snapshot

    sessions = Sessions()
    tool = build_tools(sessions)["memory"]
    snap = REPO / "tests" / "data" / "memory_snapshots" / "digits_mlp_oom.pickle"
    lines: list[str] = []
    r = call(tool, sessions, {"path": str(snap)}, lines.append)
    assert not r.is_error and r.structured_content == analyze_snapshot(snap).to_json()
    assert "OOM events" in r.content[0].text and lines

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            import os
            return os.system, (f"touch {marker}",)

    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps(Evil()))
    r = call(tool, sessions, {"path": str(bad)}, lambda _: None)
    assert r.is_error and r.content[0].text.startswith("goblin memory: error: ") and not marker.exists()


@pytest.mark.slow
def test_the_fit_tool_is_goblin_fit(goblin_home):
    """``fit`` answers as ``goblin fit --json`` does (the session's memory_fit: two small probe runs)."""
    from goblin_assets.audit.fit import fit_text
    from goblin_assets.mcp_server.server import call
    from goblin_assets.mcp_server.tools import Sessions, build_tools

    sessions = Sessions()
    tool = build_tools(sessions)["fit"]
    r = call(tool, sessions, {"path": str(REPO / "workloads" / "digits_mlp")}, lambda _: None)
    assert not r.is_error, r.content[0].text
    ans = r.structured_content
    assert ans["fits"] in (True, False, None) and ans["peak_bytes"] > 0 and ans["levers"] is not None
    assert r.content[0].text == fit_text(ans).splitlines()[0]
    r = call(tool, sessions, {"path": str(REPO / "workloads" / "digits_mlp"), "device": "no-such-gpu"}, lambda _: None)
    assert r.is_error and r.content[0].text.startswith("goblin fit: error: ")
