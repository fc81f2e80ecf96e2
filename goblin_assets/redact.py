"""Redaction of secrets and personal paths before anything is stored or shown.

Every stage that stores, logs, embeds or displays user text calls
:func:`redact` first (issue 3, "Safety").  The patterns are a data table,
applied in order: multi-line private keys first, then credentials inside
URLs, then token formats with a recognisable prefix, then ``key = value``
assignments whose key names a secret, then object-store and websocket URLs
and home directories.

Ordinary words stay (issue 17): a value after ``token`` / ``Basic`` in prose,
or a bare (unquoted) value of a ``*token`` / ``auth`` key, is only removed when it
has the shape of a secret (:func:`secret_shaped`, the test detect-secrets
uses: letters mixed with digits, or a high Shannon entropy), and never when
it is a code reference (``tok.pad_token = tok.eos_token``).
"""
from __future__ import annotations

import math
import re
from collections import Counter

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
     re.compile(r"(?i)\b(bearer|basic|token)(\s+)([A-Za-z0-9._~+/=-]{8,})"), ""),
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
#: A dotted name (``tok.eos_token``, ``args.hf_token``): a reference in code, not a value.
_REFERENCE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
#: Shannon entropy (bits per character) above which a long string is taken for a
#: secret.  detect-secrets flags base64 strings above 4.5 and hex above 3.0;
#: 3.5 over 16+ characters sits between and keeps English words (about 2.5-3.2) out.
ENTROPY_BITS = 3.5
ENTROPY_MIN_LENGTH = 16


def shannon_entropy(text: str) -> float:
    """Bits per character of ``text`` (0.0 for an empty string).

    Source: detect-secrets' high-entropy string plugins use the same measure.
    """
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def secret_shaped(value: str) -> bool:
    """Whether a bare word looks like a credential rather than an ordinary word or a name.

    True for letters mixed with at least two digits (``hunter2hunter2``,
    ``s3cr3t-v4lue``, ``9a8b7c6d...``) and for any string of 16+ characters
    whose Shannon entropy is at least :data:`ENTROPY_BITS`; False for words
    (``sequences``, ``training``), dotted references (``tok.eos_token``) and
    shell variables (``$HF_TOKEN``).
    """
    if len(value) < 6 or value.startswith("$") or _REFERENCE.fullmatch(value):
        return False
    digits = sum(c.isdigit() for c in value)
    letters = sum(c.isalpha() for c in value)
    if digits >= 2 and letters >= 2:
        return True
    return len(value) >= ENTROPY_MIN_LENGTH and shannon_entropy(value) >= ENTROPY_BITS


def _assignment(match: re.Match[str]) -> str:
    quote, quoted, bare = match.group(2), match.group(3), match.group(4)
    value = quoted if quoted is not None else bare
    if value.lower() in _HARMLESS:
        return match.group(0)
    if quoted is None and (_REFERENCE.fullmatch(value) or value.startswith("$")):
        return match.group(0)                        # a code reference or a shell variable
    ambiguous = re.search(r"(?i)token|auth", match.group(1))   # pad_token, eos_token, auth mode ...
    if quoted is None and ambiguous and not secret_shaped(value):
        return match.group(0)
    return match.group(1) + (f"{quote}<redacted>{quote}" if quote else "<redacted>")


def _scheme_token(match: re.Match[str]) -> str:
    """``Bearer <token>`` always; ``Basic`` / ``token`` only before a secret-shaped word."""
    if match.group(1).lower() != "bearer" and not secret_shaped(match.group(3)):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}<redacted>"


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
        elif name == "bearer":
            text = pattern.sub(_scheme_token, text)
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
