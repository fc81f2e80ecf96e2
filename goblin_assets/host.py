"""Host facts: the one description of the machine a run belongs to.

Every rule check (``host.*``, ``cores``, ``packages.*``, ``env.*`` in detect
conditions), every estimate (the CPU ``precision_path`` bucket) and every
report reads the machine through one :class:`HostFacts` object, never through
``os.cpu_count()`` or ``/proc/cpuinfo`` of its own:

* for a run on this machine, :func:`current_host` detects the facts once per
  process;
* for a replayed recording, :meth:`HostFacts.from_recording` reads them from
  the recording's ``environment.yaml``;
* tests and users may *set* them: ``GOBLIN_HOST_FACTS`` holds a JSON object
  (or the path of a JSON/YAML file) whose keys replace the detected ones, and
  :func:`use_host` replaces them inside a ``with`` block.  A child process
  started by a runner inherits the variable, so parent and child agree.

"Has bf16 matrix instructions" has one definition here
(:attr:`HostFacts.cpu_bf16_matmul`): the CPU lists ``amx_bf16`` or
``avx512_bf16``, the instruction sets oneDNN runs bf16 GEMMs on (Intel
oneDNN developer guide, "Data types: bf16"; Intel AMX on Sapphire Rapids).
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from goblin_assets.errors import GoblinError

#: The environment variable that sets host facts (a JSON object, or a path to a JSON/YAML file).
HOST_FACTS_ENV = "GOBLIN_HOST_FACTS"

#: Distributions whose versions are detected up front (others are looked up when a rule asks).
KNOWN_PACKAGES: tuple[str, ...] = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes",
                                   "flash_attn", "deepspeed")

#: The CPU flags of bf16 matrix instructions (``/proc/cpuinfo``): AMX tiles and AVX-512 BF16 dot products.
BF16_MATMUL_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")

#: Keys of the ``host.*`` root of detect conditions (kb/rules.py).
HOST_KEYS: tuple[str, ...] = ("online_cpus", "affinity_cpus", "numa_nodes", "amx_bf16", "avx512_bf16",
                              "cpu_bf16_matmul", "devices")


class HostError(GoblinError):
    """Host facts cannot be read or set (names the variable or file and the field)."""


class HostFacts(BaseModel):
    """The machine (and process environment) a run belongs to.

    Units and meanings: ``cores`` is the number of CPUs the job may use (the
    ``cores`` name of detect conditions and fix expressions; by default the
    process's CPU affinity); ``online_cpus`` every online CPU; ``numa_nodes``
    the NUMA node count; ``amx_bf16`` / ``avx512_bf16`` the CPU flags (None:
    unknown); ``devices`` the accelerator names (``torch.cuda`` device names;
    empty: none); ``packages`` installed versions by distribution name (None:
    not installed) in the job's interpreter ``python`` (None: this process's
    own); ``env`` the job's environment variables (None: this
    process's environment, read when asked: :meth:`job_env`).  ``source`` says
    whether the facts were ``detected`` here, ``recorded`` with a replay, or
    ``set`` by ``GOBLIN_HOST_FACTS``/a test.
    """

    source: Literal["detected", "recorded", "set"] = "detected"
    hostname: str | None = None
    cores: int | None = None
    online_cpus: int | None = None
    affinity_cpus: int | None = None
    numa_nodes: int | None = None
    amx_bf16: bool | None = None
    avx512_bf16: bool | None = None
    devices: list[str] = Field(default_factory=list)
    packages: dict[str, str | None] = Field(default_factory=dict)
    python: str | None = None
    env: dict[str, str] | None = None

    @property
    def cpu_bf16_matmul(self) -> bool | None:
        """Whether the CPU has bf16 matrix instructions (``amx_bf16`` or ``avx512_bf16``); None when unknown."""
        flags = (self.amx_bf16, self.avx512_bf16)
        if any(flags):
            return True
        return None if None in flags else False

    def job_env(self) -> dict[str, str]:
        """The job's environment variables: the recorded or set ones, else this process's, now."""
        return dict(os.environ) if self.env is None else dict(self.env)

    def host_context(self) -> dict[str, Any]:
        """The ``host.*`` values of detect conditions (:data:`HOST_KEYS`)."""
        return {"online_cpus": self.online_cpus, "affinity_cpus": self.affinity_cpus, "numa_nodes": self.numa_nodes,
                "amx_bf16": self.amx_bf16, "avx512_bf16": self.avx512_bf16, "cpu_bf16_matmul": self.cpu_bf16_matmul,
                "devices": len(self.devices)}

    def package(self, name: str) -> str | None:
        """Installed version of distribution ``name`` (None when absent).

        A recorded or set host, or one whose job runs in another interpreter,
        answers from ``packages`` only; a detected one looks names it was not
        asked for up in this Python environment.
        """
        if name in self.packages or self.source != "detected" or self.python not in (None, sys.executable):
            return self.packages.get(name)
        version = _version(name)
        self.packages[name] = version
        return version

    @classmethod
    def from_recording(cls, doc: Mapping[str, Any], file: str | Path = "environment.yaml") -> HostFacts:
        """The host of a recording's ``environment.yaml`` (keys ``cores``, ``env``, ``host``, ``packages``).

        Raises
        ------
        HostError
            A value of the wrong type (names the file and the field).
        """
        host = dict(doc.get("host") or {})
        data = {"source": "recorded", "cores": doc.get("cores"), "env": {k: str(v) for k, v in
                                                                       (doc.get("env") or {}).items()},
                "packages": doc.get("packages") or {}, **{k: v for k, v in host.items() if k in cls.model_fields}}
        return _validated(data, str(file))


def _version(name: str) -> str | None:
    for dist in {name, name.replace("_", "-")}:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else None


def _devices() -> list[str]:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def detect_host() -> HostFacts:
    """This machine's facts (Linux; None where a fact cannot be read).

    ``affinity_cpus`` counts ``os.sched_getaffinity(0)`` (fewer than online
    when pinned with ``taskset``/``numactl``); ``numa_nodes`` counts
    ``/sys/devices/system/node/node*``; CPU flags come from ``/proc/cpuinfo``;
    ``devices`` from ``torch.cuda`` (ROCm builds included); ``env`` is left
    None: the process's environment is read each time it is asked for.
    """
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        affinity = None
    flags = _cpu_flags()
    return HostFacts(
        source="detected", hostname=platform.node(), cores=affinity or os.cpu_count(), online_cpus=os.cpu_count(),
        affinity_cpus=affinity, numa_nodes=len(glob.glob("/sys/devices/system/node/node[0-9]*")) or None,
        amx_bf16=None if flags is None else "amx_bf16" in flags,
        avx512_bf16=None if flags is None else "avx512_bf16" in flags,
        devices=_devices(), packages={p: _version(p) for p in KNOWN_PACKAGES})


class InterpreterError(HostError):
    """The job's interpreter cannot be run or does not answer (names it and the reason)."""


#: Run in the job's interpreter: the versions of the distributions named in argv, as JSON (stdlib only).
_PROBE = ("import json, sys\nfrom importlib import metadata\nout = {}\nfor n in sys.argv[1:]:\n"
          "    v = None\n    for d in (n, n.replace('_', '-')):\n        try:\n            v = metadata.version(d)\n"
          "            break\n        except metadata.PackageNotFoundError:\n            pass\n    out[n] = v\n"
          "print(json.dumps({'python': sys.executable, 'version': sys.version.split()[0], 'packages': out}))")


def interpreter_packages(python: str, names: tuple[str, ...] = KNOWN_PACKAGES) -> dict[str, str | None]:
    """Versions of ``names`` installed in the interpreter ``python`` (None when absent there).

    Runs ``python -c`` with the standard library only (``importlib.metadata``),
    so the interpreter needs nothing of Goblin.

    Raises
    ------
    InterpreterError
        ``python`` cannot be started, fails, or answers something else than the JSON asked for.
    """
    try:
        out = subprocess.run([python, "-c", _PROBE, *names], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InterpreterError(f"{python}: cannot run the interpreter ({exc})") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise InterpreterError(f"{python}: exited with code {out.returncode}: {last}")
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1])["packages"])
    except (json.JSONDecodeError, IndexError, KeyError, TypeError) as exc:
        raise InterpreterError(f"{python}: unexpected answer to the package probe ({exc})") from None


#: Run in the job's interpreter: the keyword names of the dotted callable argv[1], as JSON (stdlib + the library).
_SIGNATURE = ("import importlib, inspect, json, sys\nmod, _, attr = sys.argv[1].rpartition('.')\n"
              "print(json.dumps(list(inspect.signature(getattr(importlib.import_module(mod), attr)).parameters)))")
_signature_memo: dict[tuple[str | None, str], list[str] | None] = {}


def keyword_names(dotted: str, python: str | None = None) -> list[str] | None:
    """The parameter names of the callable ``dotted`` (``transformers.TrainingArguments``) where the job runs.

    In the interpreter ``python`` (a child process, so the user's installed
    version decides), or in this process when ``python`` is None or ours.
    None when the module cannot be imported or the callable has no signature
    there.  Memoised per (interpreter, callable).
    """
    key = (None if python in (None, sys.executable) else python, dotted)
    if key not in _signature_memo:
        if key[0] is None:
            import importlib
            import inspect

            mod, _, attr = dotted.rpartition(".")
            try:
                _signature_memo[key] = list(inspect.signature(getattr(importlib.import_module(mod), attr)).parameters)
            except (ImportError, AttributeError, TypeError, ValueError):
                _signature_memo[key] = None
        else:
            try:
                out = subprocess.run([python, "-c", _SIGNATURE, dotted], capture_output=True, text=True, timeout=120)
                _signature_memo[key] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
                _signature_memo[key] = None
    return _signature_memo[key]


def for_interpreter(host: HostFacts, python: str | None) -> HostFacts:
    """``host`` with the package versions of the job's interpreter ``python`` (``host`` itself when it is ours).

    Raises InterpreterError (the interpreter does not run).
    """
    if not python or python == sys.executable:
        return host
    return host.model_copy(update={"python": python,
                                   "packages": interpreter_packages(python, tuple(dict.fromkeys(
                                       (*KNOWN_PACKAGES, *host.packages))))})


def _validated(data: dict[str, Any], where: str) -> HostFacts:
    try:
        return HostFacts.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HostError(f"{where}: field '{'.'.join(str(x) for x in first['loc'])}': {first['msg']}") from None


def host_overrides(raw: str | None = None) -> dict[str, Any]:
    """The host facts set by ``GOBLIN_HOST_FACTS`` (or ``raw``): a JSON object, or a JSON/YAML file's path.

    Raises
    ------
    HostError
        The value is neither a JSON object nor a readable file holding a mapping.
    """
    raw = os.environ.get(HOST_FACTS_ENV, "") if raw is None else raw
    if not raw.strip():
        return {}
    where = HOST_FACTS_ENV
    text = raw
    if not raw.lstrip().startswith("{"):
        where = raw
        try:
            text = Path(raw).read_text(encoding="utf-8")
        except OSError as exc:
            raise HostError(f"{HOST_FACTS_ENV}={raw}: not a JSON object and not a readable file ({exc})") from None
    try:
        doc = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise HostError(f"{where}: invalid host facts: {exc}") from None
    if not isinstance(doc, dict):
        raise HostError(f"{where}: host facts must be a mapping of HostFacts fields")
    unknown = sorted(set(doc) - set(HostFacts.model_fields))
    if unknown:
        raise HostError(f"{where}: unknown host fact(s) {', '.join(unknown)} "
                        f"(fields: {', '.join(HostFacts.model_fields)})")
    return doc


_current: list[HostFacts] = []


def current_host() -> HostFacts:
    """The facts of the machine this process runs on: detected once, with ``GOBLIN_HOST_FACTS`` applied.

    Inside :func:`use_host`, the facts given there.

    Raises
    ------
    HostError
        ``GOBLIN_HOST_FACTS`` is invalid.
    """
    if not _current:
        over = host_overrides()
        detected = detect_host()
        if over:
            merged = {**detected.model_dump(), **over, "source": "set"}
            if "packages" in over:
                merged["packages"] = {**detected.packages, **over["packages"]}
            detected = _validated(merged, HOST_FACTS_ENV)
        _current.append(detected)
    return _current[-1]


@contextlib.contextmanager
def use_host(facts: HostFacts | Mapping[str, Any]) -> Iterator[HostFacts]:
    """Within the block, :func:`current_host` returns ``facts`` (a HostFacts or fields over the current ones)."""
    if not isinstance(facts, HostFacts):
        facts = _validated({**current_host().model_dump(), **dict(facts), "source": "set"}, "use_host")
    current_host()
    _current.append(facts)
    try:
        yield facts
    finally:
        _current.pop()


def reset_host() -> None:
    """Forget the detected facts (the next :func:`current_host` detects again)."""
    _current.clear()
