"""Regex fallback: ``--key value`` flags and ``key=value`` pairs in any text.

Used for shell launch scripts (``torchrun ... --per_device_train_batch_size
8``), for files of unknown type, and for Python files that do not parse.
Shell variables (``LR=3e-4`` ... ``--learning_rate $LR``) are substituted
when they are assigned in the same file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import Raw

_VALUE = r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\\\"';|&()]+)"
#: ``--key value``, ``--key=value`` or a bare ``--flag``.
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w.-]*)(?:(?:[ \t]*=[ \t]*|[ \t]+)(?!-)" + _VALUE + r")?")
#: ``key=value`` / ``key: value`` (Python keywords, env files, YAML-ish lines).
PAIR = re.compile(r"(?<![\w.$-])([A-Za-z_][\w.]*)[ \t]*(?:=|:(?=[ \t]))[ \t]*"
                  r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\\\"';|&(),\[\]{}]+)")
#: ``NAME=value`` shell assignments at the start of a line (optionally exported).
ASSIGN = re.compile(r"(?m)^[ \t]*(?:export[ \t]+)?([A-Za-z_]\w*)=" + _VALUE)
_VAR = re.compile(r"^\$\{?([A-Za-z_]\w*)\}?$")


def _offsets(text: str):
    starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def at(offset: int) -> tuple[int, int]:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - starts[lo]

    return at


def _literal(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
        return token[1:-1]
    return token


def scan_text(text: str, file: str, pairs: bool = True, region: tuple[int, int] | None = None) -> dict[str, Raw]:
    """Flags and key/value pairs of ``text`` as ``key -> Raw`` (last one wins).

    Keys are normalised to ``snake_case`` (``--batch-size`` -> ``batch_size``).
    A bare ``--flag`` is ``True`` with the flag itself as its span; other
    values are strings (the converters coerce them).  ``region`` (start, end
    character offsets) keeps only what starts inside it (one command's flags).
    """
    at = _offsets(text)

    def span(start: int, end: int) -> tuple[int, int, int, int]:
        return (*at(start), *at(end))

    shell_vars: dict[str, Raw] = {}
    for m in ASSIGN.finditer(text):
        s = span(m.start(2), m.end(2))
        shell_vars[m.group(1)] = Raw(_literal(m.group(2)), file, s[0], s, "variable", f"shell variable {m.group(1)}")

    out: dict[str, Raw] = {}
    hits: list[tuple[int, str, Raw]] = []
    if pairs:
        for m in PAIR.finditer(text):
            s = span(m.start(2), m.end(2))
            hits.append((m.start(), m.group(1), Raw(_literal(m.group(2)), file, s[0], s)))
    for m in FLAG.finditer(text):
        key = m.group(1).replace("-", "_")
        if m.group(2) is None:
            s = span(m.start(), m.end(1))
            hits.append((m.start(), key, Raw(True, file, s[0], s, detail=f"flag --{m.group(1)}")))
            continue
        token = _literal(m.group(2))
        var = _VAR.match(token)
        if var and var.group(1) in shell_vars:
            hits.append((m.start(), key, shell_vars[var.group(1)]))
            continue
        s = span(m.start(2), m.end(2))
        hits.append((m.start(), key, Raw(token, file, s[0], s)))
    for start, key, raw in sorted(hits, key=lambda h: h[0]):
        if region is None or region[0] <= start < region[1]:
            out[key] = raw
    return out


@dataclass
class Launch:
    """One launch command: the launcher, the script it runs, and where the flags of each are.

    ``launcher_flags`` and ``script_flags`` are (start, end) character
    offsets of ``text``: the launcher's own flags come before the script,
    the script's after it, up to the end of the command (line continuations
    included).
    """

    launcher: str
    script: str
    launcher_flags: tuple[int, int]
    script_flags: tuple[int, int]


_SCRIPT = re.compile(r"(?<![\w./-])([\w./-]+\.py)\b")


def find_launch(text: str) -> Launch | None:
    """The first command of ``text`` that launches a Python script (fields.LAUNCHERS), or None.

    ``torchrun --nproc_per_node 8 main.py --batch-size 128``: launcher
    ``torchrun``, script ``main.py``, flags split at the script.  Comment
    lines are skipped.
    """
    launchers = re.compile("|".join(f"(?:{p})" for p in F.LAUNCHERS))
    for m in launchers.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if text[line_start:m.start()].lstrip().startswith("#"):
            continue
        end = m.end()
        while True:                                  # the command ends at a newline not escaped by "\"
            nl = text.find("\n", end)
            if nl == -1:
                end = len(text)
                break
            if text[:nl].rstrip(" \t").endswith("\\"):
                end = nl + 1
                continue
            end = nl
            break
        script = _SCRIPT.search(text, m.end(), end)
        if script is None:
            continue
        return Launch(m.group(0), script.group(1), (m.end(), script.start()), (script.end(), end))
    return None
