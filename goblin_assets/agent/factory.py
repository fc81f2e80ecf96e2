"""Build the agent's backend: the one place that knows every Backend implementation.

``agent/backend.py`` holds the protocol only and imports no implementation, so
the implementations may import it without a cycle; callers that pick a backend
from settings (``goblin chat``, the agent asset) come here.  Which backend
:func:`make_backend` returns depends only on whether a base URL is configured:
offline is the default.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from goblin_assets.agent.backend import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL, AgentBackendError, Backend
from goblin_assets.agent.openai_chat import OpenAIChatBackend
from goblin_assets.agent.planner import OfflinePlanner


def make_backend(base_url: str | None = None, model: str | None = None,
                 env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> Backend:
    """The backend for these settings: a chat-completions client when a base URL is set, else offline.

    Parameters
    ----------
    base_url, model
        The server (``http://host:8000/v1``) and the model name it serves;
        default ``$GOBLIN_LLM_BASE_URL`` and ``$GOBLIN_LLM_MODEL``.
    env
        Where to read the variables (default ``os.environ``); the API key
        is ``$GOBLIN_LLM_API_KEY`` (optional: local servers need none).
    timeout_s
        Seconds to wait for one model response.

    Raises
    ------
    AgentBackendError
        A base URL without a model name, or a model name without a base URL.
    """
    env = os.environ if env is None else env
    url = base_url or env.get(ENV_BASE_URL) or ""
    if not url:
        if model:
            raise AgentBackendError(f"--model {model!r} needs a model server: pass --base-url or set {ENV_BASE_URL}")
        return OfflinePlanner()
    name = model or env.get(ENV_MODEL) or ""
    if not name:
        raise AgentBackendError(f"a model server is set ({ENV_BASE_URL} or --base-url) but no model name: "
                                f"pass --model or set {ENV_MODEL}")
    return OpenAIChatBackend(url, name, api_key=env.get(ENV_API_KEY) or None, timeout_s=timeout_s)
