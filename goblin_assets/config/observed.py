"""The config as it ran: observed values over parsed ones, and every disagreement (issue 27).

A live audit runs the user's program; the harness records the settings the
program really used (:mod:`goblin_assets.runners.observe`, stored as
``RunMetrics.observed``).  :func:`observed_values` turns that record into one
value per ConfigDict field with provenance kind ``observed``;
:func:`effective_config` puts them over the parsed ConfigDict: the observed
value wins, the parsed value and provenance stay beside it
(``ConfigDict.parsed`` / ``parsed_provenance``), and each field where both
are stated and differ becomes a :class:`~goblin_assets.contracts.Disagreement`
naming both values and where each came from.

What each field is read from (the record's keys):

=======================  ===============================================================
field                    observed as
=======================  ===============================================================
model_name               the stepped model's ``config._name_or_path``
batch_size               the first iterated DataLoader's ``batch_size`` (per device); without a
                         DataLoader, the leading dimension of the stepped model's input
grad_accum_steps         ``torch.autograd.backward`` calls per optimizer step (the mode)
seq_len                  the widest integer ``[batch, seq]`` input of the first batches
precision                an enabled ``torch.autocast`` entered with gradients on, else the
                         trainable parameters' dtype
optimizer                the stepped optimizer's class (Hugging Face ``optim`` name, ``fused``)
attention_impl           the model config's ``_attn_implementation``; SDPA calls counted
gradient_checkpointing   ``is_gradient_checkpointing`` or ``checkpoint`` calls
lora_rank                the peft adapter config's ``r`` (null: no adapter in the model)
dataloader_workers       the DataLoader's ``num_workers`` (0 when the loop iterates none)
intra_op_threads         ``torch.get_num_threads()`` at the first step
lr                       the first parameter group's base ``lr`` (``initial_lr``)
warmup_steps             the LR scheduler's stated warm-up (0 with no scheduler)
padding                  fixed vs per-batch widths of the token field with its mask (without a
                         mask: rows ending in a run of one id, the pad id)
group_by_length          the loader's sampler class (``LengthGroupedSampler``)
=======================  ===============================================================

Only the standard library and pydantic models are used here (the record is plain JSON).
"""
from __future__ import annotations

import ast
import math
from collections import Counter
from pathlib import Path
from typing import Any

from goblin_assets.config import fields as F
from goblin_assets.config.mapping import map_by_name
from goblin_assets.config.shell import scan_text
from goblin_assets.contracts import CONFIG_FIELDS, ConfigDict, Disagreement, Provenance
from goblin_assets.config.overrides import setting_call

#: transformers ``_attn_implementation`` -> ConfigDict ``attention_impl``.
_ATTN = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "flash", "flash_attention_3": "flash",
         "flex_attention": "unknown"}
#: torch dtype names -> ConfigDict ``precision``.
_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _where(text: str | None) -> tuple[str | None, int | None]:
    """(file name, line) of a ``path:line`` the harness recorded."""
    if not text:
        return None, None
    path, _, line = text.rpartition(":")
    if not line.isdigit():
        return Path(text).name, None
    return Path(path).name, int(line)


def _prov(detail: str, key: str, where: str | None = None) -> Provenance:
    file, line = _where(where)
    return Provenance(file=file, line=line, kind="observed", detail=detail, key=key)


def _loader(rec: dict) -> dict | None:
    """The training loader: the first DataLoader iterated before the first optimizer step, else the first."""
    loaders = rec.get("loaders") or []
    return next((ld for ld in loaders if ld.get("step") == 1), loaders[0] if loaders else None)


def _precision(rec: dict) -> tuple[str, str, str | None]:
    ac = [a for a in rec.get("autocast") or [] if a.get("enabled") and a.get("training")
          and a.get("dtype") in ("bfloat16", "float16")]
    if ac:
        a = max(ac, key=lambda x: x.get("count", 0))
        scaler = rec.get("grad_scaler") or {}
        extra = f"; a GradScaler ({'enabled' if scaler.get('enabled') else 'disabled'})" if scaler else ""
        return (_PRECISION[a["dtype"]], f"torch.autocast({a['device_type']}, {a['dtype']}) entered "
                f"{a.get('count')} times with gradients on{extra}", a.get("where"))
    dtypes = Counter(rec.get("param_dtypes") or {})
    if dtypes:
        top = dtypes.most_common(1)[0][0]
        p = _PRECISION.get(top)
        if p is not None:
            why = "no enabled torch.autocast region with gradients on" if not rec.get("autocast") else \
                "every torch.autocast region entered was disabled or outside training"
            return p, f"{why}; the trainable parameters are {top} ({dict(dtypes)})", None
    return "fp32", "no reduced-precision autocast and no trainable parameters seen", None


def _seq(rec: dict) -> tuple[int | None, str]:
    rows = [b for b in rec.get("batches") or [] if b.get("shape") and len(b["shape"]) >= 2
            and (b.get("dtype") or "").startswith(("int", "uint"))]
    if not rows:
        seen = next((b for b in rec.get("batches") or [] if b.get("shape")), None)
        return None, (f"the inputs are not token sequences ({seen['dtype']} {seen['shape']})" if seen
                      else "no batch of the DataLoader was readable")
    widths = [b["shape"][1] for b in rows]
    return max(widths), f"width of the token field over the first {len(rows)} batches: {sorted(set(widths))}"


def _padding(rec: dict) -> tuple[str | None, str]:
    rows = [b for b in rec.get("batches") or [] if b.get("padded_rows") is not None and b.get("shape")]
    if not rows:
        return None, "no attention mask in the batches: no padding to observe"
    widths = {b["shape"][1] for b in rows}
    padded = sum(b["padded_rows"] for b in rows)
    told = next((f" (pad id {b['pad_id']}, told from {b['pad_from']})" for b in rows if b.get("pad_from")), "")
    if len(widths) == 1:
        if padded == 0:
            return None, f"every row fills the fixed width {next(iter(widths))}: no padding seen (packed or equal)"
        return "max_length", (f"every batch is {next(iter(widths))} wide and {padded} rows carry pad positions"
                              f"{told}: padded to a fixed length")
    tight = all(b.get("longest") == b["shape"][1] for b in rows)
    return ("dynamic" if tight else "longest",
            f"batch widths vary ({sorted(widths)}); each batch is as wide as its longest row{told}" if tight else
            f"batch widths vary ({sorted(widths)}){told}")


def _warmup(rec: dict) -> tuple[int | None, str]:
    scheds = rec.get("schedulers") or []
    if not scheds:
        return 0, "no LR scheduler was constructed: the learning rate is constant"
    s = scheds[0]
    w = s.get("warmup_steps")
    if isinstance(w, float) and not w.is_integer():
        return None, f"{s['detail']}: a fraction of the total steps, which the harness cut short"
    ta = rec.get("training_arguments") or {}
    if w is not None and ta and float(ta.get("warmup_ratio") or 0) > 0 and not ta.get("warmup_steps"):
        return None, (f"{s['detail']}: computed from warmup_ratio over the harness's shortened max_steps, "
                      "not the program's own")
    return (int(w) if w is not None else None), s.get("detail") or s["cls"]


def _optimizer(rec: dict) -> tuple[str | None, str, dict | None]:
    opts = rec.get("optimizers") or []
    if not opts:
        return None, "no optimizer step was taken", None
    o = opts[0]
    name = F.OPTIMIZER_CLASSES.get(o["cls"])
    if name is None:
        name = f"{o['module']}.{o['cls']}"
    elif o.get("fused") is True and name in F.FUSED_OPTIMIZERS:
        name = F.FUSED_OPTIMIZERS[name]
    return name, f"{o['module']}.{o['cls']} stepped (fused={o.get('fused')}, foreach={o.get('foreach')})", o


def observed_values(record: dict[str, Any] | None) -> dict[str, tuple[Any, Provenance]]:
    """Field -> (observed value, provenance kind ``observed``) for every ConfigDict field the record settles.

    ``record``: ``RunMetrics.observed`` (an ``ObservedRecord`` dumped).  A
    field the record cannot settle (no optimizer step was taken, a warm-up
    computed from a ratio of the harness's shortened run) is left out, so the
    parsed value stays the effective one.  Empty for None.
    """
    if not record:
        return {}
    out: dict[str, tuple[Any, Provenance]] = {}
    ld, model, adapter = _loader(record), record.get("model"), record.get("adapter")
    if model is not None:
        name = model.get("name_or_path")
        out["model_name"] = (name or None, _prov(
            f"config._name_or_path of the stepped model ({model['cls']})" if name else
            f"the stepped model is a {model['cls']} built in code: it has no name or path", "model.config"))
        attn = model.get("attn_implementation")
        sdpa = record.get("sdpa_calls", 0)
        if attn:
            out["attention_impl"] = (_ATTN.get(attn, "unknown"), _prov(
                f"config._attn_implementation = {attn!r}; scaled_dot_product_attention called {sdpa} times",
                "model.config._attn_implementation"))
        elif sdpa:
            out["attention_impl"] = ("sdpa", _prov(f"scaled_dot_product_attention called {sdpa} times",
                                                   "torch.nn.functional.scaled_dot_product_attention"))
        elif not model.get("attention_modules"):
            out["attention_impl"] = (None, _prov(f"the model ({model['cls']}) computes no attention: no "
                                                 "attention config, no SDPA call, no nn.MultiheadAttention",
                                                 "model"))
        ck = record.get("checkpoint_calls", 0)
        out["gradient_checkpointing"] = (bool(model.get("gradient_checkpointing") or ck), _prov(
            f"is_gradient_checkpointing = {model.get('gradient_checkpointing')}; "
            f"torch.utils.checkpoint.checkpoint called {ck} times", "model.is_gradient_checkpointing"))
        out["lora_rank"] = ((adapter or {}).get("r"), _prov(
            f"peft adapter {adapter['name']!r} ({adapter.get('peft_type')}): r={adapter.get('r')}, "
            f"lora_alpha={adapter.get('lora_alpha')}, target_modules={adapter.get('target_modules')}"
            if adapter else "the stepped model carries no peft adapter", "model.peft_config"))
    if ld is not None:
        where = ld.get("where")
        out["batch_size"] = (ld.get("batch_size"), _prov(
            f"{ld['cls'].rsplit('.', 1)[-1]}(batch_size={ld.get('batch_size')}) iterated "
            f"(samples per batch, per device)", "DataLoader.batch_size", where))
        out["dataloader_workers"] = (ld.get("num_workers"), _prov(
            f"DataLoader num_workers={ld.get('num_workers')}, pin_memory={ld.get('pin_memory')}, "
            f"prefetch_factor={ld.get('prefetch_factor')}, persistent_workers={ld.get('persistent_workers')}",
            "DataLoader.num_workers", where))
        sampler = ld.get("sampler") or ""
        ta = record.get("training_arguments") or {}
        grouped = "LengthGrouped" in sampler or ta.get("train_sampling_strategy") == "group_by_length" \
            or ta.get("group_by_length") is True
        out["group_by_length"] = (grouped, _prov(f"the loader's sampler is {sampler or 'none'}",
                                                 "DataLoader.sampler", where))
    elif record.get("inputs") and record.get("steps"):  # batches made in the loop: the model's own inputs
        rows = record["inputs"]
        lead = Counter(r["shape"][0] for r in rows if r.get("shape"))
        none = "no DataLoader was iterated: the loop makes its batches in the main process"
        if lead:
            b = lead.most_common(1)[0][0]
            out["batch_size"] = (b, _prov(
                f"leading dimension of the model's input ({none}); over its first {len(rows)} calls: "
                f"{sorted(lead)}", "model forward input"))
        out["dataloader_workers"] = (0, _prov(none, "no DataLoader"))
        out["group_by_length"] = (False, _prov(f"{none}: no sampler groups by length", "no DataLoader"))
    steps = record.get("backward_per_step") or []
    if steps:
        counted = steps[1:] or steps   # the first step may follow set-up backward calls
        mode = Counter(counted).most_common(1)[0][0]
        if mode >= 1:
            out["grad_accum_steps"] = (mode, _prov(
                f"torch.autograd.backward called {mode} times per optimizer step (per step: {steps[:8]})",
                "torch.autograd.backward"))
    name, detail, opt = _optimizer(record)
    if opt is not None:
        out["optimizer"] = (name, _prov(detail, "optimizer.__class__"))
        lrs = [g["lr"] for g in opt["groups"] if g.get("lr") is not None]
        if lrs:
            out["lr"] = (float(max(lrs)), _prov(
                f"base learning rate of the optimizer's parameter groups: {sorted(set(lrs))}", "param_groups.lr"))
        p, why, where = _precision(record)
        out["precision"] = (p, _prov(why, "torch.autocast / parameter dtype", where))
        w, why = _warmup(record)
        if w is not None:
            out["warmup_steps"] = (w, _prov(why, "lr_scheduler"))
    if record.get("threads"):
        out["intra_op_threads"] = (record["threads"], _prov("torch.get_num_threads() at the first optimizer step",
                                                            "torch.get_num_threads"))
    if record.get("batches") or (ld is None and record.get("inputs") and record.get("steps")):
        rec = record if record.get("batches") else {**record, "batches": record["inputs"]}
        s, why = _seq(rec)
        out["seq_len"] = (s, _prov(why, "batch shape" if rec is record else "model forward input"))
        pad, why = _padding(rec)
        out["padding"] = (pad, _prov(why, "batch attention mask" if rec is record else "model forward input"))
    return out


def _same(field: str, a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6)
    if field == "model_name" and isinstance(a, str) and isinstance(b, str):
        x, y = a.rstrip("/").lower(), b.rstrip("/").lower()  # a hub id vs the local folder it was saved in
        return x == y or x.endswith("/" + y.rsplit("/", 1)[-1]) or y.endswith("/" + x.rsplit("/", 1)[-1])
    return a == b


def _where_text(p: Provenance | None) -> str:
    if p is None:
        return "not stated"
    loc = f"{p.file}:{p.line}" if p.file and p.line else (p.file or "")
    return f"{loc} ({p.kind})" if loc else p.kind


def _arg_fields(args: list[str]) -> dict[str, str]:
    """Field -> the flag of the workload's ``args`` that sets it (what the parser of the config file never sees)."""
    if not args:
        return {}
    text = " ".join(args)
    mapped = map_by_name(scan_text(text, "workload.yaml args"), "")
    out = {}
    for f in mapped.found:
        if f.field in CONFIG_FIELDS and f.prov.span is not None:
            out[f.field] = text  # the whole argument list, quoted in the finding
    return out


def _read_tree(source: Path | None) -> ast.Module | None:
    """The parsed entry script (None: not given, not Python, unreadable or not parsing)."""
    if source is None or source.suffix != ".py" or not source.is_file():
        return None
    try:
        return ast.parse(source.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _cause(field: str, value: Any, by_args: dict[str, str], config_is_entry: bool, tree: ast.Module | None,
           source: Path | None) -> tuple[str, Provenance | None, bool]:
    """(cause, where the run's value is set, patchable) of one disagreement.

    Patchable only when the entry script is the parsed file and one of its
    statements states the run's value as a literal the writer can rewrite.
    """
    if field in by_args:
        return (f"the workload's arguments ({by_args[field]}) override it, and the parser reads only the file; the "
                "patch writes only the file, so it writes nothing for this field", None, False)
    hit = setting_call(tree, field, lambda v: _same(field, v, value), source.name if source else "")
    if hit is not None:
        at = Provenance(file=source.name, line=hit.line, kind="literal" if hit.span else "inferred",
                        detail=hit.text, span=hit.span)
        if hit.span is not None and config_is_entry:
            return (f"line {hit.line} of {source.name} sets it at run time (`{hit.text}`), after the line the "
                    "parser reads; a patch of this field rewrites both", at, True)
        if hit.span is None:
            return (f"line {hit.line} of {source.name} sets it at run time (`{hit.text}`): a call, with no value "
                    "the patch writer can rewrite", at, False)
        return (f"line {hit.line} of {source.name}, the program that ran, sets it at run time (`{hit.text}`); the "
                "patch writes only the parsed file, so it writes nothing for this field", at, False)
    if not config_is_entry:
        return ("the program that ran is not the parsed file: its launch line or code sets the value that wins, "
                "which the parser does not read, so the patch writes nothing for this field", None, False)
    return ("something the parser cannot see sets the value that wins (a command-line argument, or code that "
            "computes it at run time: no statement of the script states it), so the patch writes nothing for this "
            "field", None, False)


def effective_config(cfg: ConfigDict, record: dict[str, Any] | None, *, args: list[str] | None = None,
                     config_is_entry: bool = True, source: str | Path | None = None) -> ConfigDict:
    """The ConfigDict a live audit reads: each observed value over the parsed one.

    Parameters
    ----------
    cfg
        The parsed config.
    record
        ``RunMetrics.observed`` of the profiled run (None: a replay or an
        older recording; ``cfg`` is returned unchanged).
    args
        The workload's extra command-line arguments (``workload.yaml``
        ``args``): the parser of the config file does not see them, so a
        disagreement they explain is reported as not patchable.
    config_is_entry
        False when the parsed file is not the program that ran (``config:``
        names a file the entry reads): a disagreement there may come from the
        entry's own code or launch line.
    source
        The program that ran (the workload's entry script): read for the
        statement that sets each disagreeing field's run value
        (:func:`~goblin_assets.config.overrides.setting_call`).  None: no
        statement is looked for, and no disagreement is patchable.

    Returns
    -------
    ConfigDict
        A copy: observed fields carry provenance kind ``observed``;
        ``parsed`` / ``parsed_provenance`` hold what the file said;
        ``disagreements`` lists each field both state with different values
        with ``set_at`` (the statement that sets the run's value, when one
        is found) and ``patchable`` (True only when that statement is a
        literal in the parsed file, which the patch rewrites with the file's
        line; False when the winning value is set where the parser cannot
        see, so the patch writes nothing for that field).
    """
    obs = observed_values(record)
    if not obs:
        return cfg
    by_args = _arg_fields(args or [])
    source = Path(source) if source is not None else None
    tree = _read_tree(source)
    values: dict[str, Any] = {}
    provs = dict(cfg.provenance)
    parsed, parsed_prov, dis = {}, {}, []
    for field in CONFIG_FIELDS:
        if field not in obs:
            continue
        value, prov = obs[field]
        old, old_prov = getattr(cfg, field), cfg.provenance.get(field)
        parsed[field], parsed_prov[field] = old, old_prov or Provenance()
        values[field], provs[field] = value, prov
        stated = old is not None and old != "unknown" and (old_prov is None or old_prov.kind != "unset")
        if not stated or value is None or _same(field, old, value):
            continue
        cause, set_at, patchable = _cause(field, value, by_args, config_is_entry, tree, source)
        dis.append(Disagreement(
            field=field, file_value=old, file_where=_where_text(old_prov), run_value=value,
            run_where=_where_text(prov) + (f": {prov.detail}" if prov.detail else ""),
            why=f"{field}: the file says {old!r} ({_where_text(old_prov)}); the run used {value!r} "
                f"({prov.detail}): {cause}",
            cause=cause, set_at=set_at, patchable=patchable))
    out = cfg.model_copy(update={**values, "provenance": provs, "parsed": parsed, "parsed_provenance": parsed_prov,
                                 "disagreements": dis})
    return out
