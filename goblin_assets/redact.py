"""Redaction of secrets and personal paths before anything is stored or shown.

Every stage that stores, logs, embeds or displays user text calls
:func:`redact` first (issue 3, "Safety").  The patterns are a data table,
applied in order: multi-line private keys first, then credentials inside
URLs, then token formats with a recognisable prefix, then ``key = value``
assignments whose key names a secret, then object-store and websocket URLs
and home directories.
"""
from __future__ import annotations

import re

# Secret-looking key names: `api_key`, `WANDB_API_KEY`, `hf_token`,
# `client_secret`, `db_password`, `AccountKey` ...  Not `tokenizer`,
# `max_new_tokens` or `pad_token_id` (a letter or `_id` follows the word).
_SECRET_KEY = (
    r"(?:api[_-]?key|access[_-]?key|account[_-]?key|private[_-]?key|secret[_-]?key"
    r"|secret|token|passw(?:or)?d|passphrase|pwd|credentials?|auth)(?![A-Za-z])(?!_id)"
)
# A value long enough, and made of token characters, to be a credential.
_SECRET_VALUE = r"[A-Za-z0-9_\-./+=:~]{6,}"

#: (name, hints, pattern, replacement) applied in this order; a pattern only
#: runs when one of its lower-case hints occurs in the text (a cheap substring
#: test).  Sources for the token formats: GitHub "About authentication" (ghp_/gho_/github_pat_), Hugging Face
#: "User access tokens" (hf_), OpenAI / Anthropic API key docs (sk-...), AWS IAM
#: "Unique identifiers" (AKIA/ASIA prefixes), Slack token types (xox?-),
#: RFC 7519 (JWT), RFC 7617/6750 (Basic/Bearer), RFC 7468 (PEM).
REDACTIONS: tuple[tuple[str, tuple[str, ...], re.Pattern[str], str], ...] = (
    ("private-key", ("private key",),
     re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
                r"(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s\\n:-]*)"),
     "<redacted:private-key>"),
    ("url-credentials", ("://",),
     re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,20}://)[^/\s:@\"'<>]+:[^/\s@\"'<>]+@"),
     r"\1<redacted>@"),
    ("bearer", ("bearer", "basic", "token"),
     re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1\2<redacted>"),
    ("jwt", ("eyj",), re.compile(r"\beyJ[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*){0,2}"), "<redacted:jwt>"),
    ("openai-key", ("sk-",), re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}"), "<redacted:sk>"),
    ("stripe-key", ("k_live_", "k_test_"), re.compile(r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{10,}"), "<redacted:key>"),
    ("hf-token", ("hf_",), re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"), "<redacted:hf>"),
    ("github-token", ("gh", "github_pat_"),
     re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), "<redacted:gh>"),
    ("gitlab-token", ("glpat-",), re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}"), "<redacted:gitlab>"),
    ("slack-token", ("xox",), re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "<redacted:slack>"),
    ("google-api-key", ("aiza",), re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), "<redacted:google>"),
    ("aws-access-key", ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa"),
     re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"), "<redacted:aws>"),
    # key = "value", key: value, os.environ["KEY"] = "value", --api-key value, KEY=value
    ("secret-assignment", ("key", "secret", "token", "pass", "pwd", "credential", "auth"),
     re.compile(r"(?i)(" + _SECRET_KEY + r"[\"']?\]?\s*[:=]\s*)"
                r"(?:([\"'])(" + _SECRET_VALUE + r")\2|(" + _SECRET_VALUE + r")(?=[\s,}\]]|$))"),
     ""),
    # --hf-token VALUE, --api_key=VALUE on a command line
    ("secret-flag", ("--",),
     re.compile(r"(?i)(--[A-Za-z0-9_-]*?" + _SECRET_KEY + r"(?:\s+|=)[\"']?)(" + _SECRET_VALUE + r")"),
     r"\1<redacted>"),
    ("object-store", ("://",), re.compile(r"(?i)\b(s3[an]?|gs|gcs|az|abfss?|wasbs?|oss|r2)://[^\s\"'<>)\]},;]+"),
     r"\1://<redacted>"),
    ("websocket", ("ws://", "wss://"), re.compile(r"(?i)\b(wss?)://[^\s\"'<>)\]},;]+"), r"\1://<redacted>"),
    ("home-dir", ("/home/",), re.compile(r"/home/(?!<user>)[^/\s\"'<>:;,)]+"), "/home/<user>"),
    ("mac-home", ("/users/",), re.compile(r"/Users/(?!<user>)[^/\s\"'<>:;,)]+"), "/Users/<user>"),
    ("windows-home", ("users\\",), re.compile(r"(?i)\b([a-z]:\\+Users\\+)(?!<user>)[^\\\s\"'<>]+"), r"\1<user>"),
)

# Values that look like a secret assignment but are not one.
_HARMLESS = {"none", "null", "true", "false", "auto", "required", "optional", "<redacted>"}


def _assignment(match: re.Match[str]) -> str:
    quote, quoted, bare = match.group(2), match.group(3), match.group(4)
    value = quoted if quoted is not None else bare
    if value.lower() in _HARMLESS:
        return match.group(0)
    return match.group(1) + (f"{quote}<redacted>{quote}" if quote else "<redacted>")


def redact(text: str) -> str:
    """Remove secrets and personal paths from ``text``.

    Parameters
    ----------
    text : str
        Any text: a config file, a log line, a warning, a value.

    Returns
    -------
    str
        The same text with bearer/basic tokens, JWTs, ``sk-...``, ``hf_...``,
        GitHub/GitLab/Slack/Google/Stripe tokens, AWS access keys, PEM private
        keys, passwords in URLs, values of secret-named keys (``*_API_KEY``,
        ``token``, ``password`` ...), ``s3://``/``gs://``/Azure paths,
        ``ws://``/``wss://`` URLs and ``/home/<name>``, ``/Users/<name>``,
        ``C:\\Users\\<name>`` replaced by ``<redacted...>`` / ``<user>``
        markers.  Idempotent: ``redact(redact(t)) == redact(t)``.

    Source
    ------
    Token formats: see the comment on ``REDACTIONS``.
    """
    if not text:
        return text
    lower = text.lower()
    for name, hints, pattern, replacement in REDACTIONS:
        if not any(h in lower for h in hints):
            continue
        if name == "secret-assignment":
            text = pattern.sub(_assignment, text)
        else:
            text = pattern.sub(replacement, text)
    return text


def redact_tree(obj):
    """:func:`redact` applied to every string of a JSON-like tree (dicts, lists, tuples).

    Returns a new tree (tuples become lists); non-string leaves are kept as they are.
    """
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_tree(v) for v in obj]
    return obj
