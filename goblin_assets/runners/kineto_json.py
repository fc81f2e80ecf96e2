"""Decode a Kineto (Chrome trace) JSON file into typed, compact event records, once.

``json.load`` of a trace builds one Python dict per event with every key of
the event and of its ``args``; a 3-million-event trace then costs several
times its decompressed size in memory (HTA's maintainers report 6 GB for an
800 MB trace).  Here the file is decoded by `msgspec
<https://jcristharif.com/msgspec/>`_ against a schema of the fields the
analyses read (:class:`Event`, :class:`Args`): every other key is skipped by
the decoder without being materialised, and each event becomes a slotted
struct without a GC header (``gc=False``).  msgspec decodes from one buffer,
so peak memory is the decompressed file plus the records (measured in
``benchmarks/trace_scale.py``; ``docs/measured_facts.md``).

Field names are those torch 2.x / Kineto write (``docs/sources.md``
"Profiler trace format"); values whose type varies between Kineto versions
(``pid``/``tid`` numbers or strings, ``ts`` numbers or strings) are decoded as
whatever the file holds and converted by the caller.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import msgspec


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys of an event that the analyses read (absent keys are None)."""

    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    grid: Any = None
    block: Any = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_types: Any = msgspec.field(default=None, name="Input type")
    concrete_inputs: Any = msgspec.field(default=None, name="Concrete Inputs")
    sequence_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread_id: Any = msgspec.field(default=None, name="Fwd thread id")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    bytes: Any = msgspec.field(default=None, name="Bytes")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    process_group_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")

    def get(self, key: str, default=None):
        """Dict-style access by the trace's own key (``args.get("External id")``)."""
        v = getattr(self, _ARG_KEYS.get(key, key), None)
        return default if v is None else v


_ARG_KEYS = {f.encode_name: f.name for f in msgspec.structs.fields(Args)}


class Event(msgspec.Struct, gc=False):
    """One ``traceEvents`` entry: phase, name, category, µs ``ts``/``dur``, pid/tid and :class:`Args`."""

    ph: Any = None
    name: Any = ""
    cat: Any = ""
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Args | None = None


class KinetoDoc(msgspec.Struct, gc=False):
    """A Kineto trace file: its events and the header keys the analyses read."""

    traceEvents: list[Event] | None = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    record_shapes: Any = None
    with_stack: Any = None
    profile_memory: Any = None
    with_flops: Any = None
    with_modules: Any = None
    hip_runtime_version: Any = None
    cuda_runtime_version: Any = None

    def header(self) -> dict:
        """The header keys that are present, as a dict (``traceEvents`` excluded)."""
        return {f: getattr(self, f) for f in self.__struct_fields__
                if f != "traceEvents" and getattr(self, f) is not None}


_DECODER = msgspec.json.Decoder(KinetoDoc)


class KinetoDecodeError(ValueError):
    """The bytes are not a JSON object of the Kineto shape (message says why)."""


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (by its magic number, not its name).

    Raises OSError / EOFError / gzip.BadGzipFile as the file system or gzip does.
    """
    with open(path, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        if magic == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=f) as g:
                return g.read()
        return f.read()


def decode(raw: bytes) -> KinetoDoc:
    """Decode the bytes of a Kineto trace (UTF-8 JSON object) into a :class:`KinetoDoc`.

    Raises
    ------
    KinetoDecodeError
        Invalid JSON, or JSON whose top level / ``traceEvents`` entries are
        not objects (msgspec's message, with the JSON path of the problem).
    """
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KinetoDecodeError(str(exc)) from None

