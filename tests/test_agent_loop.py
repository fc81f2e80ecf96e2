"""The agent loop against a real HTTP server speaking OpenAI chat completions, and the offline planner.

The server (http.server on 127.0.0.1, port 0, started here) replays scripted
responses: a malformed tool call, an unknown tool, a model that never stops
calling tools, and failing servers.  The tools keep their real names and
schemas (asserted in the request body) but run cheap fakes: the loop is
what is tested here; tests/test_agent_digits.py runs the real stages.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from goblin_assets.agent import (
    CANONICAL_ORDER,
    MAX_TOOL_CALLS,
    SYSTEM_PROMPT,
    TOOLS,
    AgentBackendError,
    AuditSession,
    FinalReport,
    OfflinePlanner,
    OpenAIChatBackend,
    Thought,
    ToolCall,
    ToolInputError,
    ToolResult,
    make_backend,
    run_agent,
    transcript_markdown,
)
from goblin_assets.agent.loop import tool_content
from goblin_assets.cli import main
from goblin_assets.kb.rules import load_kb
from goblin_assets.runners.workload import load_workload
from tests.conftest import WORKLOADS
from tests.test_redact import SECRETS
from tests.test_redaction_e2e import assert_clean

API_KEY = "sk-test-Q9w8E7r6T5y4U3i2O1p0AsDf"


class Scripted:
    """An OpenAI-compatible chat-completions server replaying ``script`` (the last entry repeats forever).

    An entry is a message dict (``choices[0].message``), or ``(status, body_text)`` for a raw reply, or
    ``("sleep", seconds)``.  ``requests`` holds every request's JSON body and headers.
    """

    def __init__(self, script: list):
        self.script = list(script)
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                entry = owner.script.pop(0) if len(owner.script) > 1 else owner.script[0]
                if isinstance(entry, tuple) and entry[0] == "sleep":
                    time.sleep(entry[1])
                    entry = {"role": "assistant", "content": "late"}
                if isinstance(entry, tuple):
                    status, text = entry
                else:
                    status, text = 200, json.dumps({"id": "x", "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", **entry}, "finish_reason": "stop"}]})
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            # server_close() joins the handler threads, so a reply still sleeping when its test ends
            # cannot write into a later test.  Its own trouble (a client that hung up before the reply
            # was written: the timeout test) is recorded, not printed; printed, a BrokenPipeError from
            # the timeout test's late reply once landed in the next CLI test's captured stderr and
            # failed its "no traceback" check.
            daemon_threads = False
            block_on_close = True

            def handle_error(self, request, client_address):
                owner.server_errors.append(repr(sys.exc_info()[1]))

        self.server_errors: list[str] = []
        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Summaries shaped like the real tools' (goblin_assets/agent/tools.py), so the offline planner can read them.
CANNED = {
    "parse_config": {"file": "train.py", "config": {"batch_size": 64, "dataloader_workers": 0,
                                                    "intra_op_threads": None, "precision": "fp32"},
                     "warnings": [line for _, line in SECRETS]},   # secrets the loop must redact
    "profile_run": {"provenance": "measured on cpu", "step_time_ms": 80.0, "throughput": 800.0,
                    "throughput_unit": "samples/s",
                    "waste_budget": {"useful": {"ms": 40.0, "share": 0.5, "status": "measured"},
                                     "data_wait": {"ms": 32.0, "share": 0.4, "status": "measured"},
                                     "host_gap": {"ms": 8.0, "share": 0.1, "status": "measured"}}},
    "query_rocm_kb": {"rules_checked": 49, "fired": [{"rule": "data.loader_workers_with_threads"}]},
    "propose_patch": {"applied": [{"rule": "data.loader_workers_with_threads", "predicted_share_of_step": 0.3,
                                   "changes": {"dataloader_workers": {"from": 0, "to": 2}}}],
                      "predicted_speedup": [1.18, 1.43], "diff": "--- a/train.py\n+++ b/train.py\n"},
    "benchmark": {"unit": "samples/s", "baseline": {"median": 800.0, "cache_hit": True},
                  "patched": {"median": 1440.0, "cache_hit": True}, "speedup": 1.8},
    "compare_runs": {"measured_speedup": 1.8, "predicted_speedup": [1.18, 1.43], "confidence": 0.75,
                     "throughput": {"original": 800.0, "patched": 1440.0, "unit": "samples/s",
                                    "cache_hits": ["baseline", "patched"]},
                     "waste_budget_ms": {"useful": {"original": 40.0, "patched": 38.0, "original_share": 0.5},
                                         "data_wait": {"original": 32.0, "patched": 4.0, "original_share": 0.4}},
                     "applied": [{"rule": "data.loader_workers_with_threads", "predicted_share_of_step": 0.3,
                                  "source": "PyTorch Performance Tuning Guide, data loading"}],
                     "holds_for": {"workload": "digits_mlp", "model": "MLP", "device": "cpu",
                                   "accelerator": "none (CPU)", "torch": "2.13.0", "shape": "batch_size=64"}},
}


@pytest.fixture
def fake_tools():
    """The real tools' names, descriptions and schemas with fakes that return CANNED; ``calls`` records them."""
    calls: list[tuple[str, dict]] = []

    def fake(name):
        def fn(session, **kwargs):
            calls.append((name, kwargs))
            out = dict(CANNED[name])
            if kwargs.get("overrides"):
                out["overrides"] = kwargs["overrides"]
                if name == "benchmark":
                    out.update(baseline={"median": 900.0}, patched={"median": 1500.0},
                               vs_original={"as_is": 1.125, "with_patch": 1.875})
            return out
        return fn

    tools = {n: replace(t, fn=fake(n)) for n, t in TOOLS.items()}
    return tools, calls


@pytest.fixture
def session(tmp_path) -> AuditSession:
    """A session on digits_mlp that must never run anything (the fake tools do not use it)."""
    return AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), kb=load_kb(), out_dir=tmp_path / "out")


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def test_scripted_model_malformed_and_unknown_calls(fake_tools, session, monkeypatch):
    tools, calls = fake_tools
    script = [
        {"content": "First the config.", "tool_calls": [call("c1", "parse_config", "{}")]},
        {"content": None, "tool_calls": [call("c2", "profile_run", '{"overrides": {"batch_size": 12')]},
        {"content": None, "tool_calls": [call("c3", "rm_rf_weights", "{}")]},
        {"content": None, "tool_calls": [call("c4", "benchmark", json.dumps({"overrides": {"batch_size": 128}}))]},
        {"content": "Batch 128 gives 1.88x."},
    ]
    monkeypatch.setenv("GOBLIN_LLM_API_KEY", API_KEY)
    with Scripted(script) as srv:
        backend = make_backend(srv.url, "qwen-test")
        assert isinstance(backend, OpenAIChatBackend)
        events = list(run_agent(backend, session, "what if I double the batch?", tools=tools))
    assert kinds(events) == ["thought"] + ["tool_call", "tool_result"] * 4 + ["final_report"]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.ok for r in results] == [True, False, False, True]
    assert "not valid JSON" in json.loads(results[1].content)["error"]
    assert "unknown tool 'rm_rf_weights'" in json.loads(results[2].content)["error"]
    assert calls == [("parse_config", {}), ("benchmark", {"overrides": {"batch_size": 128}})]  # bad calls ran nothing
    final = events[-1]
    assert isinstance(final, FinalReport) and final.text == "Batch 128 gives 1.88x."
    assert final.tool_calls == 4 and not final.capped and final.model_error is None
    assert final.backend == f"qwen-test at {srv.url}/chat/completions"
    # the protocol: path, model, the real tool schemas, the system prompt, auth from the environment
    first = srv.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["body"]["model"] == "qwen-test" and first["body"]["tool_choice"] == "auto"
    assert first["body"]["tools"] == [t.schema() for t in TOOLS.values()]
    assert [t["function"]["name"] for t in first["body"]["tools"]] == list(CANONICAL_ORDER)
    assert first["body"]["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert "cannot ask for model weights, datasets" in SYSTEM_PROMPT and "holds only for this workload" in SYSTEM_PROMPT
    assert first["headers"]["Authorization"] == f"Bearer {API_KEY}"
    # the model saw each error as a tool message answering its call, after its own assistant message
    msgs = srv.requests[-1]["body"]["messages"]
    roles = [m["role"] for m in msgs]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 4
    assert msgs[4]["tool_calls"][0]["id"] == "c2" and msgs[5]["tool_call_id"] == "c2"
    assert "not valid JSON" in msgs[5]["content"]
    # redaction: no secret from a tool result reaches the model, the events or the transcript; nor the API key
    everything = json.dumps([r["body"] for r in srv.requests]) + "".join(e.model_dump_json() for e in events)
    assert_clean("requests to the model and the events", everything + transcript_markdown(events))
    assert API_KEY not in everything and API_KEY not in transcript_markdown(events)


def test_model_that_never_stops_is_capped(fake_tools, session):
    tools, calls = fake_tools
    forever = {"content": None, "tool_calls": [call("a", "parse_config", "{}"), call("b", "query_rocm_kb", "{}")]}
    with Scripted([forever]) as srv:
        events = list(run_agent(make_backend(srv.url, "looper", env={}), session, tools=tools))
    assert sum(isinstance(e, ToolCall) for e in events) == MAX_TOOL_CALLS == 8
    assert len(calls) == 8
    final = events[-1]
    assert isinstance(final, FinalReport) and final.capped and final.tool_calls == 8
    assert "Stopped after 8 tool calls" in final.text
    last = srv.requests[-1]["body"]
    assert "tools" not in last                      # the report is asked for without tools
    assert "tool budget (8 calls) is spent" in last["messages"][-1]["content"]
    asked = [tc["id"] for m in last["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in last["messages"] if m["role"] == "tool"]
    assert asked == answered                        # every call got an answer, the ones past the cap included
    assert "Authorization" not in srv.requests[0]["headers"]   # no key set: none sent


@pytest.mark.parametrize("reply,expect", [
    ((500, '{"error": {"message": "CUDA out of memory"}}'), "HTTP 500"),
    ((401, json.dumps({"error": f"bad key {API_KEY}"})), "HTTP 401"),
    ((200, "<html>gateway</html>"), "not JSON"),
    ((200, '{"choices": []}'), "not a chat-completions response"),
    (("sleep", 1.5), "no response within 0.5 s"),
])
def test_server_failure_ends_in_a_final_report(reply, expect, fake_tools, session):
    tools, _ = fake_tools
    with Scripted([reply]) as srv:
        backend = OpenAIChatBackend(srv.url, "m", api_key=API_KEY, timeout_s=0.5)
        events = list(run_agent(backend, session, tools=tools))
    assert len(events) == 1 and isinstance(events[0], FinalReport)
    assert expect in events[0].model_error and srv.url in events[0].model_error
    assert API_KEY not in events[0].model_dump_json()           # even when the server echoes it


def test_unreachable_server(session, fake_tools):
    with Scripted([{"content": "x"}]) as srv:
        url = srv.url
    events = list(run_agent(OpenAIChatBackend(url, "m", timeout_s=2), session, tools=fake_tools[0]))
    assert [e.kind for e in events] == ["final_report"] and "unreachable" in events[0].model_error


def test_make_backend_is_offline_by_default():
    assert isinstance(make_backend(env={}), OfflinePlanner)
    assert isinstance(make_backend(env={"GOBLIN_LLM_MODEL": "m"}), OfflinePlanner)
    b = make_backend(env={"GOBLIN_LLM_BASE_URL": "http://h:8000/v1/", "GOBLIN_LLM_MODEL": "m"})
    assert isinstance(b, OpenAIChatBackend) and b.url == "http://h:8000/v1/chat/completions"
    with pytest.raises(AgentBackendError, match="GOBLIN_LLM_MODEL"):
        make_backend(env={"GOBLIN_LLM_BASE_URL": "http://h:8000/v1"})
    with pytest.raises(AgentBackendError, match="needs a model server"):
        make_backend(model="m", env={})


def test_offline_planner_audit_and_what_if(fake_tools, session):
    tools, calls = fake_tools
    events = list(run_agent(OfflinePlanner(), session, "What if I double the batch? Which rule matters most?",
                            tools=tools))
    assert [(c.name, c.arguments) for c in events if isinstance(c, ToolCall)] == [
        *[(n, {}) for n in CANONICAL_ORDER],
        ("propose_patch", {"overrides": {"batch_size": 128}}), ("benchmark", {"overrides": {"batch_size": 128}})]
    assert [c.call_id for c in events if isinstance(c, ToolCall)] == [f"call_{i}" for i in range(1, 9)]
    thoughts = [e.text for e in events if isinstance(e, Thought)]
    assert thoughts[0] == "I start from the training setup in your own file (parse_config)."
    assert thoughts[2] == ("A step takes 80.0 ms (800.0 samples/s, measured on cpu); besides useful work the "
                           "largest bucket is data_wait: 40% of the step (measured). Next: check every cited rule "
                           "against this run (query_rocm_kb).")
    assert thoughts[6].startswith("Your question: what if batch_size = 128 (your file has 64)?")
    final = events[-1]
    assert isinstance(final, FinalReport) and final.backend == "offline planner (no model)"
    assert final.tool_calls == 8 and not final.capped      # done at the cap is not cut short by it
    assert final.text.split("\n\n") == [
        "Measured speedup 1.80x: 800.0 -> 1440.0 samples/s (replayed from the benchmark cache: baseline, patched); "
        "predicted 1.18x-1.43x, confidence 0.75.",
        "Why: before the patch data_wait took 40% of the step (32.0 ms; 4.0 ms after).",
        "The rule that matters most: data.loader_workers_with_threads, predicted to recover 30% of the step "
        "(source: PyTorch Performance Tuning Guide, data loading).",
        "Change in your file: dataloader_workers 0 -> 2 (the diff is in the report).",
        "What if batch_size = 128: 900.0 samples/s as-is, 1500.0 with its patch (data.loader_workers_with_threads) "
        "(1.12x and 1.88x your original).",
        "These numbers hold only for workload digits_mlp (MLP) on cpu, none (CPU), torch 2.13.0, batch_size=64; "
        "they say nothing about another model, dataset or machine."]
    # deterministic: the same conversation twice gives the same events (timings aside)
    again = list(run_agent(OfflinePlanner(), session, "What if I double the batch? Which rule matters most?",
                           tools=tools))
    strip = lambda evs: [e.model_dump(exclude={"elapsed_s"}) for e in evs]  # noqa: E731
    assert strip(again) == strip(events)


def test_offline_planner_stops_at_a_failed_stage(fake_tools, session):
    tools, _ = fake_tools

    def broken(s, overrides=None):
        from goblin_assets.errors import RunFailed
        raise RunFailed("profile_run: exit code 1 (train.py)")

    tools = {**tools, "profile_run": replace(tools["profile_run"], fn=broken)}
    events = list(run_agent(OfflinePlanner(), session, tools=tools))
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["parse_config", "profile_run"]
    assert events[-1].text.startswith("The audit stopped at profile_run: profile_run: exit code 1 (train.py).")


def test_arguments_are_checked_against_the_schema(fake_tools, session):
    tools, calls = fake_tools
    script = [{"tool_calls": [call("1", "benchmark", '{"overrides": "batch 128"}'),
                              call("2", "compare_runs", '{"verbose": true}'),
                              call("3", "query_rocm_kb", '["idle GPU"]')]},
              {"content": "ok"}]
    with Scripted(script) as srv:
        events = list(run_agent(OpenAIChatBackend(srv.url, "m"), session, tools=tools))
    errors = [json.loads(e.content)["error"] for e in events if isinstance(e, ToolResult)]
    assert errors == ["argument overrides must be a JSON object, not str",
                      "unknown argument(s) verbose for compare_runs; it takes: no arguments",
                      "arguments must be a JSON object, not list"]
    assert calls == []


def test_what_if_variant_is_a_copy_of_the_users_file(tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    before = wl.script.read_text()
    s = AuditSession.open(wl, kb=load_kb(), out_dir=tmp_path / "out")
    v = s.what_if({"batch_size": 128})
    assert v is s.what_if({"batch_size": 128}) and s.what_if({"batch_size": 64}) is s  # same or no change
    assert v.training_config().batch_size == 128 and v.overrides == {"batch_size": 128}
    assert "-" in v.whatif_diff and "128" in v.whatif_diff and v.workload.root.is_relative_to(tmp_path)
    assert wl.script.read_text() == before                                       # the user's file is untouched
    with pytest.raises(ToolInputError, match="unknown field"):
        s.what_if({"batch": 128})
    with pytest.raises(ToolInputError, match="overrides.batch_size"):
        s.what_if({"batch_size": "big"})


def test_goblin_chat_cli_with_a_model_server(capsys, monkeypatch):
    monkeypatch.setenv("GOBLIN_LLM_API_KEY", API_KEY)
    monkeypatch.delenv("GOBLIN_LLM_BASE_URL", raising=False)
    with Scripted([{"content": "Nothing to run: ask me about the batch."}]) as srv:
        code = main(["chat", str(WORKLOADS / "digits_mlp"), "--base-url", srv.url, "--model", "tiny", "--json"])
    out = capsys.readouterr()
    assert code == 0
    events = [json.loads(line) for line in out.out.splitlines()]
    assert [e["kind"] for e in events] == ["final_report"]
    assert events[0]["text"] == "Nothing to run: ask me about the batch." and events[0]["backend"].startswith("tiny")
    assert srv.requests[0]["body"]["model"] == "tiny"
    assert API_KEY not in out.out + out.err
    # a failing server: the final report says so, exit code 2, no traceback
    with Scripted([(503, "overloaded")]) as srv:
        code = main(["chat", str(WORKLOADS / "digits_mlp"), "--base-url", srv.url, "--model", "tiny"])
    out = capsys.readouterr()
    assert code == 2 and "HTTP 503" in out.out and "Traceback" not in out.out + out.err
    # a model without a server is a one-line error
    assert main(["chat", str(WORKLOADS / "digits_mlp"), "--model", "tiny"]) == 2
    assert "needs a model server" in capsys.readouterr().err


def test_transcript_markdown_names_every_event():
    events = [Thought(text="hm"), ToolCall(call_id="c1", name="parse_config", arguments={}),
              ToolResult(call_id="c1", name="parse_config", ok=False, content='{"ok": false}'),
              FinalReport(text="done", backend="offline", tool_calls=1, report_markdown="# Goblin audit")]
    md = transcript_markdown(events)
    for piece in ("> hm", "`parse_config`", "**error** of `parse_config`", "## Final report (offline, 1 tool calls)",
                  "done", "# Goblin audit"):
        assert piece in md


def test_tool_content_is_redacted_and_bounded():
    diff = "+" + "x" * 10_000 + "\n"
    text = tool_content({"ok": True, "diff": diff, "warnings": [line for _, line in SECRETS]})
    doc = json.loads(text)
    assert len(doc["diff"]) < 3100 and doc["diff"].endswith("(7002 more characters)")
    assert_clean("a tool result", text)


@pytest.mark.parametrize("speedup", [1.4047131147540983, 1.40495, 2.0049999, 0.995])
def test_agent_states_the_speedup_as_the_report_prints_it(speedup):
    """compare_runs' measured_speedup is rounded once, as the report prints it (a CI run once read 1.41x vs 1.40x)."""
    from types import SimpleNamespace

    from goblin_assets.agent.tools import report_summary
    from goblin_assets.report.verdict import audit_verdict

    rep = SimpleNamespace(measured_speedup=speedup, predicted_low=1.1, predicted_high=1.5, confidence=0.7,
                          baseline_throughput=780.8, patched_throughput=1096.8, throughput_unit="samples/s",
                          cache_hits=[], buckets=[], applied=[], workload="digits_mlp", model="MLP", device="cpu",
                          accelerator_version="none (CPU)", torch_version="2.13.0", batch_shape="batch_size=64")
    s = SimpleNamespace(audit_report=lambda: rep, patch=lambda: SimpleNamespace(applied=[]), overrides=None,
                        report_path=None, verdict=lambda: audit_verdict(interval=getattr(rep, "measured_interval", None)))
    summary = report_summary(s)
    planner = OfflinePlanner()
    planner.results = {"compare_runs": {"ok": True, **summary}}
    assert planner.final_text().startswith(f"Measured speedup {speedup:.2f}x: 780.8 -> 1096.8 samples/s")


def test_a_speedup_whose_interval_holds_1_is_no_significant_change():
    from types import SimpleNamespace

    from goblin_assets.agent.tools import report_summary
    from goblin_assets.report.verdict import audit_verdict
    from goblin_assets.measure.benchmark import SpeedupInterval

    iv = SpeedupInterval(point=1.04, low=0.93, high=1.16, pairs=3, paired=True, method="t", verdict="no significant change")
    rep = SimpleNamespace(measured_speedup=1.04, measured_interval=iv, predicted_low=1.1, predicted_high=1.5,
                          confidence=0.7, baseline_throughput=780.8, patched_throughput=812.0, throughput_unit="samples/s",
                          cache_hits=[], buckets=[], applied=[], workload="w", model="m", device="cpu",
                          accelerator_version="none (CPU)", torch_version="2.13.0", batch_shape="batch_size=64")
    s = SimpleNamespace(audit_report=lambda: rep, patch=lambda: SimpleNamespace(applied=[]), overrides=None,
                        report_path=None, verdict=lambda: audit_verdict(interval=getattr(rep, "measured_interval", None)))
    planner = OfflinePlanner()
    planner.results = {"compare_runs": {"ok": True, **report_summary(s)}}
    assert planner.final_text().startswith("No significant change: 1.04x (95% interval 0.93x-1.16x)")
