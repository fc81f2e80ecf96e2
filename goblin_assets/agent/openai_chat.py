"""A client for any server that speaks the OpenAI chat-completions protocol with tool calls.

``POST {base_url}/chat/completions`` with the conversation, the tool schemas
and ``tool_choice: "auto"``; the reply's ``choices[0].message`` carries
``content`` and ``tool_calls`` (``[{"id", "type": "function", "function":
{"name", "arguments"}}]``, arguments as JSON text).  Works with vLLM, Ollama
(``/v1``), Hugging Face Inference endpoints, llama.cpp's server and any other
compatible server: no provider is hard-coded, the standard library does the
HTTP.

Source: the OpenAI API reference, "Chat Completions" and "Function calling"
(https://platform.openai.com/docs/api-reference/chat).
"""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from goblin_assets.agent.backend import SYSTEM_PROMPT, AgentBackendError, ToolCallRequest, Turn
from goblin_assets.redact import redact


def chat_url(base_url: str) -> str:
    """``base_url`` with ``/chat/completions`` appended (kept when already there)."""
    url = base_url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def _text(content: Any) -> str:
    """A message's content as text (a string, or a list of ``{"type": "text", "text"}`` parts)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


class OpenAIChatBackend:
    """A conversation with one model on an OpenAI-compatible server.

    Parameters
    ----------
    base_url
        The server's API root, e.g. ``http://127.0.0.1:8000/v1`` (vLLM),
        ``http://127.0.0.1:11434/v1`` (Ollama).
    model
        The model name the server serves.
    api_key
        Sent as ``Authorization: Bearer``; never logged or put in an event.
    system
        The system prompt (default :data:`~goblin_assets.agent.backend.SYSTEM_PROMPT`).
    timeout_s
        Seconds to wait for one response.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, system: str = SYSTEM_PROMPT,
                 timeout_s: float = 120.0, temperature: float = 0.0):
        self.url = chat_url(base_url)
        self.model = model
        self.name = f"{model} at {redact(self.url)}"
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self._api_key = api_key

    def __repr__(self) -> str:  # the key stays out of reprs and logs
        return f"OpenAIChatBackend({self.name!r})"

    def add_user_message(self, text: str) -> None:
        """Append a user message."""
        self.messages.append({"role": "user", "content": text})

    def add_tool_result(self, call_id: str, name: str, content: str) -> None:
        """Append a ``role: tool`` message answering ``call_id``."""
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})

    def next_turn(self, tools: list[dict[str, Any]]) -> Turn:
        """Ask the server for the next assistant message (see :class:`~goblin_assets.agent.backend.Backend`).

        Raises
        ------
        AgentBackendError
            HTTP error status, timeout, unreachable server, or a body that is
            not a chat-completions response; the message names the URL.
        """
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "temperature": self.temperature}
        if tools:
            body.update(tools=tools, tool_choice="auto")
        data = self._post(body)
        try:
            msg = data["choices"][0]["message"]
            if not isinstance(msg, dict):
                raise TypeError("message is not an object")
        except (KeyError, IndexError, TypeError) as exc:
            raise AgentBackendError(f"{redact(self.url)}: not a chat-completions response "
                                    f"(no choices[0].message: {exc})") from None
        calls = []
        for i, tc in enumerate(msg.get("tool_calls") or []):
            tc = tc if isinstance(tc, dict) else {}
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
            args = fn.get("arguments", "")
            calls.append(ToolCallRequest(id=str(tc.get("id") or f"call_{len(self.messages)}_{i}"),
                                         name=str(fn.get("name") or ""),
                                         arguments=args if isinstance(args, (str, dict)) else json.dumps(args)))
        text = _text(msg.get("content"))
        record: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:  # as the server expects them back: arguments as JSON text
            record["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)}}
                for c in calls]
        self.messages.append(record)
        return Turn(text=text, tool_calls=calls)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
        where = redact(self.url)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:400].decode("utf-8", "replace").strip()
            raise AgentBackendError(f"{where}: HTTP {exc.code} {exc.reason}" +
                                    (f": {self._clean(detail)}" if detail else "")) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                raise AgentBackendError(f"{where}: no response within {self.timeout_s:g} s") from None
            raise AgentBackendError(f"{where}: unreachable ({self._clean(str(exc.reason))})") from None
        except (TimeoutError, socket.timeout):
            raise AgentBackendError(f"{where}: no response within {self.timeout_s:g} s") from None
        except OSError as exc:  # connection reset, refused mid-response ...
            raise AgentBackendError(f"{where}: connection failed ({self._clean(str(exc))})") from None
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise AgentBackendError(f"{where}: the response is not JSON ({self._clean(repr(raw[:120]))})") from None
        if not isinstance(data, dict):
            raise AgentBackendError(f"{where}: the response is not a JSON object")
        if "error" in data and "choices" not in data:
            raise AgentBackendError(f"{where}: the server reported an error: {self._clean(json.dumps(data['error']))}")
        return data

    def _clean(self, text: str) -> str:
        """``text`` redacted, with the API key removed even if a server echoes it."""
        text = redact(text)
        return text.replace(self._api_key, "<redacted>") if self._api_key else text
