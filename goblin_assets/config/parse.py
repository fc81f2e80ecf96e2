"""``parse_config``: a user's training setup as a ConfigDict with provenance.

Reads the files people fine-tune with (issue 3): Python scripts (Trainer,
TRL, raw loops, Fabric and accelerate loops; read with ``ast``, never run),
JSON argument dumps, YAML configs of axolotl, LLaMA-Factory, torchtune,
alignment-handbook and oumi, torchtitan TOML, DeepSpeed and accelerate
companions, and shell launch lines (the script a launch line runs is read
too when it sits beside it, with the line's flags over its defaults).
Which key means which field, and each tool's defaults, live in
``goblin_assets/config/fields.py``.

A file whose format or tool is not recognised is reported as such
(``source_format`` ``<syntax>:unknown``, ``format_confidence`` 0): its
values are read by key name only and no tool's defaults are applied
(issue 17); the patch stage writes nothing into it.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.table import Table

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import (
    Found,
    LibraryChoice,
    Ratio,
    Raw,
    Undetermined,
    deprecated_keys,
    detect_tool,
    detect_tool_confidence,
    detect_tool_reason,
    found,
    map_by_name,
    map_entries,
    tool_chain,
    tool_defaults,
    tool_rows,
)
from goblin_assets.config.python_script import analyse_python
from goblin_assets.config.shell import find_launch, scan_text
from goblin_assets.config.tree import flatten_json, flatten_toml, flatten_yaml
from goblin_assets.contracts import CONFIG_FIELDS, ConfigDict, Provenance
from goblin_assets.errors import ConfigParseError
from goblin_assets.redact import redact, redact_tree

#: Files larger than this are refused (issue 3: "files over 5 MB").
MAX_BYTES = 5 * 1024 * 1024
#: Lines, commas and ``--`` flags: a proxy for the number of entries.  No
#: training config or script we know of comes near it (the longest common
#: scripts have a few thousand lines); past it, parsing a file of up to 5 MB
#: could take several seconds, so it is refused instead (issue 3: 2 s a file).
MAX_ITEMS = 20_000
#: Companion files (accelerate, DeepSpeed) larger than this are ignored.
MAX_COMPANION_BYTES = 1024 * 1024
#: accelerate config files are a few lines; bigger siblings are not read.
MAX_ACCELERATE_BYTES = 64 * 1024
#: How many sibling YAML files are checked for an accelerate config.
MAX_SIBLINGS = 20
_RANK_FINAL = 99


@dataclass
class _Parsed:
    """One file read by a format parser (``cls``: the library config class it builds;
    ``confidence``: how sure the format and tool are, 0 for unknown)."""

    tool: str
    fmt: str
    found: list[Found] = field(default_factory=list)
    raws: dict[str, Raw] = field(default_factory=dict)
    deferred: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    cls: str | None = None
    confidence: float = 1.0
    reason: str = ""


# --------------------------------------------------------------------------- reading

def read_text(path: Path, limit: int = MAX_BYTES) -> str:
    """The file's text, refusing what is not a small UTF-8 text file.

    Raises
    ------
    ConfigParseError
        Missing file, directory, larger than ``limit`` bytes, empty, binary
        (NUL bytes), not valid UTF-8, or more than MAX_ITEMS lines + commas.
    """
    name = redact(str(path))
    if not path.exists():
        raise ConfigParseError(name, "no such file")
    if not path.is_file():
        raise ConfigParseError(name, "not a regular file")
    size = path.stat().st_size
    if size > limit:
        raise ConfigParseError(name, f"file is {size / 1e6:.1f} MB, over the {limit / 1e6:.0f} MB limit")
    data = path.read_bytes()
    if not data.strip():
        raise ConfigParseError(name, "file is empty")
    if b"\x00" in data:
        raise ConfigParseError(name, "binary file (NUL bytes), not a text config")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigParseError(name, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    items = text.count("\n") + text.count(",") + text.count(" --")
    if items > MAX_ITEMS:
        raise ConfigParseError(name, f"{items} lines, items and flags, more than any training config "
                                     f"(limit {MAX_ITEMS}): not parsed")
    return text


def _source_path(path: Path) -> str:
    """The path to store: relative to the working directory when the file is
    under it (so no home directory is stored, and the patch stage can still
    open it), else redacted (``/home/<user>/...``)."""
    if path.is_absolute():
        try:
            return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
        except ValueError:
            pass
    return redact(str(path))


def detect_format(path: Path, text: str) -> tuple[str, float]:
    """The syntax of a file and how sure that is: ``(format, confidence)``.

    The suffix decides when it is known (fields.FORMATS_BY_SUFFIX);
    otherwise the content is tried: a JSON object, a launch command or
    shebang (shell), a TOML file with ``[tables]``, a YAML mapping, Python
    that parses.  Anything else is ``unknown`` with confidence 0.
    """
    fmt = F.FORMATS_BY_SUFFIX.get(path.suffix.lower())
    if fmt:
        return fmt, F.FORMAT_CONFIDENCE["suffix"]
    sniffed = F.FORMAT_CONFIDENCE["content"]
    head = text.lstrip()
    if head.startswith("{"):
        return "json", sniffed
    if head.startswith("#!") or find_launch(text) is not None:
        return "shell", sniffed
    if re.search(r"(?m)^\s*\[[\w.\-\s\"']+\]\s*$", text):
        try:
            flatten_toml(text, path.name)
            return "toml", sniffed
        except ConfigParseError:
            pass
    if re.match(r"(?m)^[A-Za-z_][\w.-]*:(\s|$)", head):
        return "yaml", sniffed
    try:
        if re.search(r"(?m)^(import |from \w|def |class )", text) and ast.parse(text):
            return "python", sniffed
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    return "unknown", F.FORMAT_CONFIDENCE["unknown"]


def _format_reason(fmt: str, tool: str, parsed: _Parsed) -> str:
    """Why the file is read as ``tool`` when the parser set no reason of its own (Python, shell, unknown text)."""
    if tool == "unknown":
        return f"a {fmt} file with no construct of a tool Goblin knows: read by key name only, no defaults"
    what = F.TOOL_NAMES.get(tool, tool)
    if fmt == "python":
        return f"a Python script analysed as a {what}" + (f" (it builds {parsed.cls})" if parsed.cls else "")
    if fmt == "shell":
        return f"a launch line read as a {what}"
    return f"read as {what}"


# --------------------------------------------------------------------------- format parsers

def _parse_python(text: str, name: str) -> _Parsed:
    try:
        result = analyse_python(text, name)
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        where = f" at line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        msg = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        parsed = _parse_shell(text, name)
        parsed.fmt = "python"
        parsed.warnings.append(f"{name}: Python does not parse ({msg}{where}); values were read with the "
                               "regex fallback and have less context")
        return parsed
    return _Parsed(result.tool, "python", result.found, result.raws, {}, result.warnings, result.cls)


def _unknown_why(name: str) -> str:
    return (f"{name} is in a format Goblin does not know: read by its key name only, and no tool's defaults "
            "are applied")


def _parse_mapping(raws: dict[str, Raw], fmt: str, name: str) -> _Parsed:
    tool, confidence = detect_tool_confidence(raws)
    reason = detect_tool_reason(raws)
    if tool == "unknown":
        return _Parsed("unknown", fmt, map_by_name(raws, _unknown_why(name)).found, raws,
                       warnings=[_unknown_why(name)], confidence=0.0, reason=reason)
    mapped = map_entries(tool, raws)
    warnings = []
    if not any(not f.field.startswith("_") for f in mapped.found):
        warnings.append(f"{name}: no known training keys found for {F.TOOL_NAMES.get(tool, tool)}")
    return _Parsed(tool, fmt, mapped.found, raws, {}, warnings, confidence=confidence, reason=reason)


def _parse_json(text: str, name: str) -> _Parsed:
    return _parse_mapping(flatten_json(text, name), "json", name)


def _parse_yaml(text: str, name: str) -> _Parsed:
    return _parse_mapping(flatten_yaml(text, name), "yaml", name)


def _parse_toml(text: str, name: str) -> _Parsed:
    return _parse_mapping(flatten_toml(text, name), "toml", name)


def _shell_tool(text: str, raws: dict[str, Raw]) -> tuple[str, str] | None:
    """A launch line of a tool other than the Trainer (fields.SHELL_TOOLS): (tool, why), else None."""
    for tool, names, keys in F.SHELL_TOOLS:
        named = next((n for n in names if n in text), None)
        key = next((k for k in raws for want in keys if k == want or (want.endswith(".") and k.startswith(want))),
                   None)
        if named or key:
            why = f"the line runs {named}" if named else f"flag {key!r} is one only {F.TOOL_NAMES[tool]} takes"
            return tool, why
    return None


def _parse_shell(text: str, name: str) -> _Parsed:
    raws = scan_text(text, name)
    other = _shell_tool(text, raws)
    if other is not None:
        tool, why = other
        return _Parsed(tool, "shell", map_entries(tool, raws).found, raws, confidence=F.FORMAT_CONFIDENCE["content"],
                       reason=f"{why}: read as a {F.TOOL_NAMES[tool]}, with that tool's own defaults only")
    hf_keys = {key for _, key, _, _ in tool_rows("shell")}
    if hf_keys & set(raws):
        return _Parsed("shell", "shell", map_entries("shell", raws).found, raws)
    # a launch line whose script is not beside it, or no launch line: nothing says which tool reads the flags
    return _Parsed("unknown", "shell", map_by_name(raws, _unknown_why(name)).found, raws,
                   warnings=[f"{name}: no Trainer flags, and no script beside it to read; " + _unknown_why(name)],
                   confidence=0.0)


def _parse_unknown(text: str, name: str) -> _Parsed:
    raws = scan_text(text, name)
    return _Parsed("unknown", "unknown", map_by_name(raws, _unknown_why(name)).found, raws,
                   warnings=[_unknown_why(name)], confidence=0.0)


_PARSERS = {"python": _parse_python, "json": _parse_json, "yaml": _parse_yaml, "toml": _parse_toml,
            "shell": _parse_shell, "unknown": _parse_unknown}


# --------------------------------------------------------------------------- companions

def _companion_text(path: Path) -> str | None:
    try:
        return read_text(path, MAX_COMPANION_BYTES)
    except (ConfigParseError, OSError):
        return None


def _accelerate(entry: Path, parsed: _Parsed, texts: list[str], named: Path | None = None) -> None:
    """An accelerate config: the one a launch line names (``--config_file``), else one beside the
    entry.  Its mixed_precision reaches the HF Trainer and any ``Accelerator()`` of a raw loop."""
    uses_accelerator = any(f.field == "_accelerate_ga" for f in parsed.found)
    if parsed.tool not in F.ACCELERATE_TOOLS and not uses_accelerator:
        return
    if named is not None:
        siblings = [named]
    else:
        siblings = sorted(p for p in entry.parent.iterdir() if p.suffix.lower() in (".yaml", ".yml") and p != entry)
    for sibling in siblings[:MAX_SIBLINGS]:
        if not sibling.is_file() or sibling.stat().st_size > MAX_ACCELERATE_BYTES:
            continue
        text = _companion_text(sibling)
        if text is None or not re.search(r"\b(compute_environment|distributed_type)\s*:", text):
            continue
        try:
            raws = flatten_yaml(text, sibling.name)
        except ConfigParseError:
            continue
        if detect_tool(raws) != "accelerate":
            continue
        mapped = map_entries("accelerate", raws, f"accelerate config {sibling.name} "
                                                  "(ACCELERATE_MIXED_PRECISION when launched with it)")
        parsed.found.extend(mapped.found)
        texts.append(text)
        return


def _launch(entry: Path, text: str, parsed: _Parsed, texts: list[str]) -> Path | None:
    """A launch line's script, read when it sits beside the launcher.

    ``torchrun ... main.py --batch-size 128``: ``main.py`` is analysed with
    the flags after it overriding its argparse / dataclass / entry-function
    defaults (their provenance points at the launch line); flags the
    script's tool knows (TrainingArguments names) rank above the script's
    own values.  The launcher's own flags give the accelerate config
    (``--config_file``), ``--mixed_precision`` and the GPU count.  Returns
    the accelerate config the line names, if any.
    """
    launch = find_launch(text)
    if launch is None:
        return None
    name = entry.name
    own = scan_text(text, name, pairs=False, region=launch.launcher_flags)
    script_flags = scan_text(text, name, pairs=False, region=launch.script_flags)
    gpus = [raw for key, raw in own.items() if key in F.LAUNCHER_GPU_FLAGS]
    if gpus:
        parsed.found.append(found("_gpus", gpus[0].value, Provenance(
            file=name, line=gpus[0].line, kind="literal", detail=f"{launch.launcher} process count"), F.R_EXPLICIT))
    parsed.found.extend(map_entries("accelerate", {k: v for k, v in own.items() if k == "mixed_precision"},
                                    f"{launch.launcher} launch flag").found)
    script = entry.parent / Path(launch.script).name
    config_file = own.get("config_file")
    named = entry.parent / Path(str(config_file.value)).name if config_file is not None else None
    if not script.is_file() or script.suffix != ".py":
        return named
    try:
        result = analyse_python(read_text(script), script.name, script_flags)
    except (ConfigParseError, SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        parsed.warnings.append(f"{name}: the script it launches, {script.name}, could not be read "
                               f"({type(exc).__name__}); only the launch line's flags are used")
        return named
    flagged = map_entries(result.tool, script_flags, f"the launch line in {name}").found if \
        result.tool not in ("torch", "text") else []
    for f in flagged:
        f.rank += 1
    kept = [f for f in parsed.found if f.field.startswith("_") or (f.field == "precision" and f.rank > F.R_NAME)]
    parsed.found = kept + result.found + flagged
    parsed.warnings = [w for w in parsed.warnings if "format Goblin does not know" not in w]
    parsed.confidence = F.FORMAT_CONFIDENCE["suffix"]
    parsed.tool, parsed.cls = result.tool, result.cls
    parsed.warnings.extend(result.warnings)
    parsed.warnings.append(f"{name} launches {script.name} with {launch.launcher}: read together, the launch "
                           "line's flags over the script's defaults")
    texts.append(read_text(script))
    return named


def _deepspeed(entry: Path, parsed: _Parsed, texts: list[str]) -> None:
    """The DeepSpeed JSON named by ``deepspeed``: its non-"auto" values override the trainer's."""
    ref = _best(parsed.found, "_deepspeed")
    if ref is None or not isinstance(ref.value, str):
        return
    target = Path(ref.value)
    candidates = [target] if target.is_absolute() else [entry.parent / target]
    candidates.append(entry.parent / target.name)
    path = next((p for p in candidates if p.is_file()), None)
    text = _companion_text(path) if path else None
    if text is None:
        parsed.warnings.append(f"DeepSpeed config {ref.value!r} named in {entry.name} was not found beside it "
                               "(or is not a readable text file): its settings are not included")
        return
    try:
        raws = flatten_yaml(text, path.name) if path.suffix.lower() in (".yaml", ".yml") \
            else flatten_json(text, path.name)
    except ConfigParseError as exc:
        parsed.warnings.append(f"DeepSpeed config {path.name}: {exc.problem}")
        return
    mapped = map_entries("deepspeed", raws, f"DeepSpeed config {path.name}")
    parsed.found.extend(mapped.found)
    for field_name, key in mapped.deferred.items():
        parsed.deferred.setdefault(field_name, f"{key} in {path.name}")
    texts.append(text)


# --------------------------------------------------------------------------- assembly

def _best(cands: list[Found], field_name: str) -> Found | None:
    pool = [c for c in cands if c.field == field_name]
    return max(pool, key=lambda c: (c.rank, -c.seq)) if pool else None


def _final(cands: list[Found], field_name: str, value: Any, file: str, kind: str, detail: str,
           line: int | None = None) -> None:
    prov = Provenance(file=file, line=line, kind=kind, detail=detail)
    cands.append(found(field_name, value, prov, _RANK_FINAL))


def _derive(tool: str, name: str, cands: list[Found]) -> None:
    """Values that follow from others: accumulation from a global batch, warmup ratios, LoRA gates,
    torchtune packing, the attention transformers picks by itself."""
    chain = tool_chain(tool)
    total, micro = _best(cands, "_global_batch"), _best(cands, "batch_size")
    known = total is not None and micro is not None and isinstance(total.value, int) and \
        isinstance(micro.value, int) and micro.value > 0
    if "verl" in chain:
        _verl_accumulation(cands, name)
    if known and _best(cands, "grad_accum_steps") is None:
        if any(t in F.GA_FROM_GLOBAL_BATCH for t in chain):
            _final(cands, "grad_accum_steps", total.value // micro.value, name, "variable",
                   f"batch_size {total.value} // micro_batch_size {micro.value} (axolotl derives it when unset)")
        else:
            _ga_per_gpu(cands, total, micro, name)
    _library_attention(cands, name)

    warm, ratio, max_steps = _best(cands, "warmup_steps"), _best(cands, "_warmup_ratio"), _best(cands, "_max_steps")
    share, src = None, None
    if warm is not None and isinstance(warm.value, Ratio):
        share, src = warm.value.value, f"warmup_steps {warm.value.value} < 1 is a ratio (transformers v5)"
    elif (warm is None or warm.value == 0) and ratio is not None and isinstance(ratio.value, float) and ratio.value > 0:
        share, src = ratio.value, f"warmup_ratio {ratio.value}"
    if share is not None:
        line = (warm if warm is not None and isinstance(warm.value, Ratio) else ratio).prov.line
        if max_steps is not None and isinstance(max_steps.value, int) and max_steps.value > 0:
            _final(cands, "warmup_steps", math.ceil(max_steps.value * share), name, "inferred",
                   f"{src} of max_steps {max_steps.value}", line)
        else:
            _final(cands, "warmup_steps", Undetermined(
                f"{src}: a fraction of the total steps, which depend on the dataset size and epochs"),
                name, "unset", "", line)

    for t in chain:
        gate = F.LORA_GATES.get(t)
        if gate is None:
            continue
        aux, allowed, absent = gate
        hit = _best(cands, aux)
        value = hit.value if hit is not None else absent
        value = value.lower() if isinstance(value, str) else value
        if value not in allowed:
            _final(cands, "lora_rank", Undetermined(
                f"{aux.lstrip('_')}={value!r}: no LoRA adapter is trained, so any lora rank is unused"),
                name, "unset", "")
        break

    packed = _best(cands, "_packed")
    if packed is not None and packed.value is True and _best(cands, "attention_impl") is None:
        cands.append(found("attention_impl", "unknown", Provenance(
            file=name, line=packed.prov.line, kind="inferred",
            detail="dataset.packed: True: torchtune uses flex attention (not sdpa/flash/eager)"), F.R_EXPLICIT))


def _verl_inputs(cands: list[Found]) -> tuple[dict[str, Any], str]:
    """The inputs of verl's accumulation (fields.VERL_ACCUM_DEFAULTS keys -> value), each the file's or else
    verl's own documented default, and one sentence saying which came from where (an unstated
    ``trainer.n_gpus_per_node`` is left out of it: the accumulation is then not divided by any world size)."""
    vals, stated, defaulted = {}, [], []
    for k, (default, key) in F.VERL_ACCUM_DEFAULTS.items():
        hit = _best(cands, k)
        if hit is not None:
            vals[k] = hit.value
            stated.append(f"{key}={hit.value!r} ({hit.prov.file}:{hit.prov.line})")
        else:
            vals[k] = default
            if k != "_gpus":
                defaulted.append(f"{key}={default!r}")
    text = "; ".join(x for x in (", ".join(stated),
                                 f"verl defaults ({F.VERL_DEFAULTS_SOURCE}): {', '.join(defaulted)}" if defaulted
                                 else "") if x)
    return vals, text


def _verl_accumulation(cands: list[Found], name: str) -> None:
    """verl's actor accumulation: ``ppo_mini_batch_size x rollout.n // (GPUs x nodes // sequence-parallel)
    // ppo_micro_batch_size_per_gpu`` (verl's FSDP worker and dp_actor, fields.VERL_ACCUM_DEFAULTS for the
    values the file leaves to verl).  The per-GPU micro batch has no default: when neither it nor the
    deprecated global ``ppo_micro_batch_size`` is stated, or ``use_dynamic_bsz`` cuts micro-batches by token
    count, accumulation stays undetermined with the reason."""
    if _best(cands, "grad_accum_steps") is not None:
        return
    vals, sources = _verl_inputs(cands)
    if not all(isinstance(vals[k], int) and vals[k] > 0 for k in ("_verl_mini", "_verl_n", "_verl_sp", "_gpus",
                                                                   "_nodes")):
        return
    mini, n, sp = vals["_verl_mini"], vals["_verl_n"], vals["_verl_sp"]
    world = vals["_gpus"] * vals["_nodes"]
    dp = world // sp
    if vals["_verl_dynamic"] is True:
        _final(cands, "grad_accum_steps", Undetermined(
            f"use_dynamic_bsz=True: verl cuts each mini-batch into micro-batches by token count, so the backward "
            f"passes per optimizer step depend on the sequence lengths ({sources})"), name, "unset", "")
        return
    micro = _best(cands, "batch_size")
    if _best(cands, "_gpus") is None:
        # the GPUs per node are the machine's, not the recipe's: divide only by a world size the file states
        per = (f", // ppo_micro_batch_size_per_gpu {micro.value}: "
               + ", ".join(f"{mini * n // (g // sp) // micro.value} on {g} GPU{'s' if g > 1 else ''}"
                           for g in (1, 8) if g >= sp and (mini * n) % (g // sp) == 0
                           and (mini * n // (g // sp)) % micro.value == 0)
               if micro is not None and isinstance(micro.value, int) and micro.value > 0 else "")
        _final(cands, "grad_accum_steps", Undetermined(
            f"trainer.n_gpus_per_node is not stated: verl's accumulation is ppo_mini_batch_size {mini} x rollout.n "
            f"{n} (global, prompts) // data-parallel GPUs{per} ({sources})"), name, "unset", "")
        return
    glob = _best(cands, "_verl_micro_global")
    if micro is None and glob is not None and isinstance(glob.value, int) and dp > 0:
        # verl divides the deprecated global micro batch by the data-parallel size (fsdp_workers.py)
        micro = found("batch_size", glob.value // dp, glob.prov.model_copy(update={
            "kind": "variable", "detail": f"{glob.prov.key} {glob.value} // data-parallel size {dp} "
                                          f"({world} GPUs // sequence-parallel {sp}) ({sources})"}), F.R_EXPLICIT)
        cands.append(micro)
    if micro is None or not isinstance(micro.value, int) or micro.value <= 0:
        _final(cands, "grad_accum_steps", Undetermined(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is not stated and has no verl default (null): "
            "accumulation = ppo_mini_batch_size x rollout.n // data-parallel size // it"), name, "unset", "")
        return
    per_gpu = mini * n // dp if dp > 0 else 0
    if per_gpu <= 0 or per_gpu % micro.value:
        _final(cands, "grad_accum_steps", Undetermined(
            f"ppo_mini_batch_size {mini} x rollout.n {n} // data-parallel size {dp} = {per_gpu} per GPU is not a "
            f"multiple of the micro batch {micro.value}: verl rejects this config ({sources})"), name, "unset", "")
        return
    _final(cands, "grad_accum_steps", per_gpu // micro.value, name, "variable",
           f"verl: ppo_mini_batch_size {mini} x rollout.n {n} // ({world} GPUs // sequence-parallel {sp}) = "
           f"{per_gpu} per GPU, // ppo_micro_batch_size_per_gpu {micro.value} ({sources})", micro.prov.line)


def _ga_per_gpu(cands: list[Found], total: Found, micro: Found, name: str) -> None:
    """Accumulation from a global batch that also counts the GPUs (DeepSpeed train_batch_size,
    torchtitan global_batch_size): global // (micro x GPUs), exact when the launch line gives
    the process count, else undetermined with the arithmetic spelled out."""
    gpus = _best(cands, "_gpus")
    nodes, tp, pp = (_best(cands, k) for k in ("_nodes", "_tp", "_pp"))
    split = 1
    for aux in (tp, pp):   # Megatron: data-parallel ranks = processes / (tensor x pipeline parallel)
        if aux is not None and isinstance(aux.value, int) and aux.value > 0:
            split *= aux.value
    if gpus is not None and str(gpus.value).isdigit() and nodes is not None and isinstance(nodes.value, int) \
            and nodes.value > 1:
        gpus = found("_gpus", int(gpus.value) * nodes.value, gpus.prov, gpus.rank)
    if gpus is not None and str(gpus.value).isdigit() and split > 1:
        if int(gpus.value) % split or int(gpus.value) < split:
            gpus = None     # the stated parallel sizes do not divide the processes: no data-parallel degree
        else:
            gpus = found("_gpus", int(gpus.value) // split, gpus.prov, gpus.rank)
    per_step = f"{total.value} / ({micro.value} x number of GPUs)"
    examples = ", ".join(f"{total.value // (micro.value * n)} on {n} GPU{'s' if n > 1 else ''}"
                         for n in (1, 8) if total.value % (micro.value * n) == 0)
    key = total.prov.key or "the global batch"
    if gpus is not None and str(gpus.value).isdigit() and int(gpus.value) > 0:
        n = int(gpus.value)
        _final(cands, "grad_accum_steps", max(1, total.value // (micro.value * n)), total.prov.file or name,
               "variable", f"{key} {total.value} / ({micro.value} per GPU x {n} processes on the launch line)",
               total.prov.line)
        return
    _final(cands, "grad_accum_steps", Undetermined(
        f"{key} {total.value} in {total.prov.file or name} fixes the global batch: accumulation = {per_step}"
        + (f" ({examples})" if examples else "") + ", so it depends on the GPU count"),
        total.prov.file or name, "unset", "", total.prov.line)


def _library_attention(cands: list[Found], name: str) -> None:
    """``LibraryChoice`` (``flash_attn: auto``, a model loaded without attn_implementation):
    SDPA when transformers uses it by default for the model's family (fields.SDPA_DEFAULT_FAMILIES),
    with the version it depends on; else unknown, with why."""
    best = _best(cands, "attention_impl")
    if best is None or not isinstance(best.value, LibraryChoice):
        return
    model = best.value.model
    if model is None:
        hit = _best(cands, "model_name")
        model = hit.value if hit is not None and isinstance(hit.value, str) else None
    low = (model or "").lower()
    family = next(((fam, ver) for fam, (keys, ver) in F.SDPA_DEFAULT_FAMILIES.items()
                   if any(k in low for k in keys)), None)
    if family is None:
        value, detail = "unknown", f"{best.value.why}: {F.SDPA_DEFAULT_UNKNOWN}" + (
            f"; {model} is not in Goblin's table of model families" if model else "")
    else:
        value, detail = "sdpa", (f"library default: {best.value.why}; transformers uses SDPA for {family[0]} "
                                 f"models when attn_implementation is not set (transformers >= {family[1]} "
                                 "with torch >= 2.1.1)")
    best.value, best.prov = value, best.prov.model_copy(update={"kind": "default", "detail": detail})


def _absent_blocks(tool: str, name: str, cands: list[Found], raws: dict[str, Raw]) -> None:
    """Defaults a tool applies when a whole block is missing (fields.ABSENT_BLOCK_DEFAULTS)."""
    for t in tool_chain(tool):
        for block, field_name, value, why in F.ABSENT_BLOCK_DEFAULTS.get(t, []):
            if _best(cands, field_name) is None and not any(k == block or k.startswith(block + ".") for k in raws):
                cands.append(found(field_name, value, Provenance(file=name, kind="default", detail=why), F.R_DEFAULT))


def _defaults(tool: str, name: str, cands: list[Found], cls: str | None = None) -> None:
    if tool == "unknown":
        return
    for field_name, (value, kind, detail) in tool_defaults(tool, cls).items():
        if _best(cands, field_name) is not None:
            continue
        if value == F.UNDETERMINED or value is None:
            value = Undetermined(detail)
            detail = ""
        cands.append(found(field_name, value, Provenance(file=name, kind=kind, detail=detail), F.R_DEFAULT))


def _not_found_reason(tool: str, field_name: str, name: str) -> str:
    if tool == "unknown":
        return f"not found by name in {name}; its format is unknown, so no tool's defaults were applied"
    if tool in F.NOT_RECORDED_TOOLS:
        return f"not in {name}: {F.NOT_RECORDED_TOOLS[tool]}"
    keys = [key for f, key, _, _ in tool_rows(tool) if f == field_name]
    if tool in ("torch", "text") and field_name in F.NOT_FOUND_REASONS:
        return f"not found in {name}: {F.NOT_FOUND_REASONS[field_name]}"
    if tool in ("torch", "text") or not keys:
        names = ", ".join(F.PY_NAMES.get(field_name, ())[:6])
        return f"not found in {name}" + (f" (no call argument or variable named {names})" if names else "")
    return f"not found in {name} (looked for {', '.join(keys[:6])})"


def _check(field_name: str, value: Any) -> tuple[Any, str | None]:
    """Validate one value against the ConfigDict type; (value, problem)."""
    if value is None:
        return None, None
    if isinstance(value, bool) and field_name not in F.BOOL_FIELDS:
        return None, f"{value!r} is not a valid {field_name}"
    try:
        value = getattr(ConfigDict(**{field_name: value}), field_name)
    except ValidationError:
        return None, f"{value!r} is not a valid {field_name}"
    least = F.FIELD_MINIMUMS.get(field_name)
    if least is not None and value < least:
        return None, f"{value!r} is below the smallest valid {field_name} ({least:g})"
    return value, None


def _warnings(parsed: _Parsed, tool: str, texts: list[str], cfg_values: dict[str, Any], name: str,
              code: set[int] = frozenset()) -> list[str]:
    out = list(parsed.warnings)
    seen: set[str] = set()
    for text in texts:
        for var in re.findall(r"\b(?:" + "|".join(F.PROFILER_ENV_PREFIXES) + r")\w+", text):
            if var not in seen:
                seen.add(var)
                prefix = next(p for p in F.PROFILER_ENV_PREFIXES if var.startswith(p))
                out.append(f"{var} is set in {name}: it {F.PROFILER_ENV_PREFIXES[prefix]}")
    for key, message in deprecated_keys(tool).items():
        raw = parsed.raws.get(key)
        if raw is not None and raw.value not in (None, False, ""):
            out.append(f"{name}: {key}: {message}")
    optim = cfg_values.get("optimizer")
    if isinstance(optim, str) and optim.startswith(F.BNB_OPTIMIZER_PREFIXES):
        out.append(f"optimizer {optim} needs bitsandbytes: on ROCm it needs the ROCm build of bitsandbytes")
    for i, text in enumerate(texts):
        if i in code:
            continue            # Python: the analysis warns for the k-bit loads that run
        for key in sorted(set(re.findall(r"\b(" + "|".join(F.BNB_KEYS) + r")\b[\"']?\s*[=:]\s*(?:True|true|[1-9]\b)",
                                         text))):
            out.append(f"{key} quantizes with bitsandbytes: on ROCm it needs the ROCm build of bitsandbytes")
    return list(dict.fromkeys(redact(w) for w in out))


def parse_config(path: str | Path) -> ConfigDict:
    """Parse a training setup file into a ConfigDict with provenance.

    Dispatches on the format :func:`detect_format` finds: Python (``ast``,
    never executed), JSON, YAML, TOML, shell launch lines (the regex
    scanner; the script a launch line runs is analysed too when it sits
    beside it, with the line's flags over its defaults), or ``unknown``
    (values read by key name only, no defaults).  Companions in the same
    folder join in: the DeepSpeed JSON named by ``deepspeed`` (its values
    override the trainer's unless ``"auto"``) and an accelerate config YAML
    (the one ``accelerate launch --config_file`` names, else one beside the
    entry; its ``mixed_precision`` reaches the HF Trainer and an
    ``Accelerator()`` through ``ACCELERATE_MIXED_PRECISION``).  Defaults
    come from the library class the files build (fields.CLASS_DEFAULTS:
    ``DPOConfig``, ``LoraConfig``, oumi, torchtitan ...), each citing its
    library and version.

    Parameters
    ----------
    path : str or Path
        The entry file (a script, a config YAML/JSON, a launch script).

    Returns
    -------
    ConfigDict
        Every field of ``CONFIG_FIELDS`` with a provenance entry: ``literal``
        (written at the use site), ``variable`` (through names or
        arithmetic), ``default`` (argparse/dataclass default or the tool's
        documented default), ``env`` (an ``os.environ.get`` default),
        ``inferred`` (from code patterns or hardware rules) or ``unset``
        (null, with the reason in ``detail``).  ``span`` marks the exact
        source text of a value written in the file.  ``provenance.file`` is
        the file's name (companions live beside the entry).  ``source_file``
        is relative to the working directory when the file is under it, else
        redacted; ``raw_source``, details and warnings are redacted.
        ``source_format`` is ``<syntax>:<tool>`` (``yaml:unknown`` for a
        format Goblin does not know) and ``format_confidence`` how sure
        that is (0 for unknown).

    Raises
    ------
    ConfigParseError
        The file is missing, empty, binary, not UTF-8, over 5 MB, or invalid
        JSON/YAML (including alias bombs and nesting deeper than 64).  A
        Python file with a syntax error is not an error: it is read with the
        regex fallback and the result carries a warning.

    Source
    ------
    Tool defaults and synonyms: ``docs/sources.md`` ("Library
    defaults", "Field-name synonyms per tool"), tabulated in
    ``goblin_assets/config/fields.py``.  Hardware-dependent values (``bf16:
    auto``, ``is_bf16_supported()``) resolve for the target AMD MI300X on
    ROCm, where ``torch.cuda.is_bf16_supported()`` returns True.
    """
    path = Path(path)
    text = read_text(path)
    name = path.name
    fmt, confidence = detect_format(path, text)
    try:
        parsed = _PARSERS[fmt](text, name)
    except RecursionError:
        raise ConfigParseError(redact(str(path)), "nested too deeply to parse") from None
    texts = [text]
    named = _launch(path, text, parsed, texts) if fmt == "shell" else None
    code = {i for i, tx in enumerate(texts) if (i == 0 and fmt == "python" and parsed.tool != "shell") or i > 0}
    _accelerate(path, parsed, texts, named)
    _deepspeed(path, parsed, texts)
    tool = parsed.tool
    cands = parsed.found
    _derive(tool, name, cands)
    _absent_blocks(tool, name, cands, parsed.raws)
    _defaults(tool, name, cands, parsed.cls)

    values: dict[str, Any] = {}
    provenance: dict[str, Provenance] = {}
    extra_warnings: list[str] = []
    for field_name in CONFIG_FIELDS:
        best = _best(cands, field_name)
        if best is None:
            best = found(field_name, None, Provenance(file=name, kind="unset",
                                                      detail=_not_found_reason(tool, field_name, name)), 0)
        value, prov = best.value, best.prov
        if isinstance(value, LibraryChoice):
            value = "unknown"
        if isinstance(value, Ratio):
            value, prov = None, prov.model_copy(update={"kind": "unset", "span": None,
                                                        "detail": f"warmup ratio {value.value}; {prov.detail}"})
        value, problem = _check(field_name, value)
        if problem:
            extra_warnings.append(f"{name}: {field_name}: {problem}; reported as undetermined")
            prov = prov.model_copy(update={"kind": "unset", "span": None, "detail": f"{problem}; {prov.detail}"})
        if field_name in parsed.deferred and prov.kind != "unset":
            prov = prov.model_copy(update={"detail": f"{prov.detail}; DeepSpeed 'auto' "
                                                     f"({parsed.deferred[field_name]}) defers to this value"})
        if value is None and prov.kind != "unset":
            prov = prov.model_copy(update={"kind": "unset", "span": None})
        if isinstance(value, str):
            value = redact(value)
        values[field_name] = value
        provenance[field_name] = prov.model_copy(update={"detail": redact(prov.detail),
                                                         "file": redact(prov.file) if prov.file else prov.file})
    parsed.warnings.extend(extra_warnings)
    return ConfigDict(
        **values,
        raw_source=redact(text),
        source_file=_source_path(path),
        source_format=f"{fmt}:{tool}",
        format_confidence=0.0 if tool == "unknown" else round(min(confidence, parsed.confidence), 2),
        format_reason=redact(parsed.reason or _format_reason(fmt, tool, parsed)),
        provenance=provenance,
        warnings=_warnings(parsed, tool, texts, values, name, code),
    )


# --------------------------------------------------------------------------- output

def config_to_json(cfg: ConfigDict) -> dict[str, Any]:
    """The ``goblin parse --json`` document.

    Returns
    -------
    dict
        Top-level keys: every ConfigDict field of ``CONFIG_FIELDS`` with its
        value, ``source_file``, ``source_format``, ``format`` (the tool),
        ``format_confidence``, ``format_reason`` (why the detector chose
        that tool, issue 27), ``provenance`` (field -> ``{file, line, kind,
        detail, span, key}``; kind ``observed`` only in a live audit's
        effective config, never from ``goblin parse``) and ``warnings``.  All strings
        pass through :func:`redact`; ``raw_source`` is left out (it is on the
        ConfigDict, already redacted).
    """
    doc: dict[str, Any] = cfg.values()
    doc["source_file"] = cfg.source_file
    doc["source_format"] = cfg.source_format
    doc["format"] = cfg.source_format.rsplit(":", 1)[-1]      # the tool; "unknown" when Goblin does not know it
    doc["format_confidence"] = cfg.format_confidence
    doc["format_reason"] = cfg.format_reason
    doc["provenance"] = {f: p.model_dump() for f, p in cfg.provenance.items()}
    doc["warnings"] = list(cfg.warnings)
    return redact_tree(doc)


def render_config_table(cfg: ConfigDict) -> Table:
    """A rich table of the ConfigDict: field, value, kind, where, detail.

    Returns
    -------
    rich.table.Table
        One row per field of ``CONFIG_FIELDS``; warnings in the caption.
        All text is redacted.
    """
    unknown = cfg.source_format.endswith(":unknown")
    title = f"{cfg.source_file} ({cfg.source_format}" + (
        ": format unknown, no tool defaults applied)" if unknown else ")")
    table = Table(title=redact(title), show_lines=False)
    for column in ("field", "value", "kind", "where", "detail"):
        table.add_column(column, overflow="fold")
    for field_name in CONFIG_FIELDS:
        prov = cfg.provenance.get(field_name, Provenance())
        value = getattr(cfg, field_name)
        where = f"{prov.file or ''}:{prov.line}" if prov.line else (prov.file or "")
        table.add_row(field_name, redact("null" if value is None else str(value)), prov.kind,
                      redact(where), redact(prov.detail))
    if cfg.warnings:
        table.caption = redact("warnings:\n" + "\n".join(f"- {w}" for w in cfg.warnings))
    return table
