"""Evidence that survives: the "Non-finite values" section of an audit report.

A run whose loss turns NaN is still audited; what it found is reported, not
lost.  The sketches count NaN and inf per tensor (``nonfinite``,
:mod:`goblin_assets.opscope.sketches`), the miner names every (site, role)
that held one and ranks them (``nonfinite`` findings,
:func:`goblin_assets.opscope.miner.nonfinite_finding`), and this module turns
those findings, the profiled run (:class:`~goblin_assets.contracts.RunMetrics`)
and the parsed config into what a person reads:

* where and when non-finite values first appear: the site, the operand
  (``lhs``, ``rhs`` = the weight, ``out``), the training step, the counts of
  NaN, +inf and -inf, and how it happened (an overflow inside the matmul, a
  weight written by the previous update, an input made elsewhere);
* whether the model's output, hence its loss, is NaN, and from which step;
* the precision cause, when there is one: fp16 weights (``model.half()``)
  trained without ``torch.autocast`` and ``GradScaler``; fp16 autocast without
  loss scaling; or, in bf16/fp32, a divergence that is not a format's range;
* the fix, with its sources.

Steps: the sketch run records ``steps`` optimizer steps after ``warmup``
unrecorded ones (:func:`goblin_assets.opscope.record.record_sketches`, 1 by
default).  Recorded step ``s`` is the forward pass of training step
``warmup + s + 1`` (1-based), i.e. after ``warmup + s`` optimizer updates.

Nothing here imports torch: the report renders from warehouse rows.

Sources: IEEE 754 binary16 (largest finite value 65504); Micikevicius et al.,
"Mixed Precision Training", ICLR 2018 (fp32 master weights, loss scaling);
PyTorch docs, "Automatic Mixed Precision package - torch.amp" (autocast,
GradScaler: fp16 gradients underflow or overflow without it; bfloat16 has
float32's range and needs no scaler).
"""
from __future__ import annotations

import ast
import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from goblin_assets.contracts import ConfigDict, RunMetrics

#: The miner's finding name (goblin_assets.opscope.miner.NONFINITE; not imported: the miner needs torch).
FINDING = "nonfinite"
#: Largest finite IEEE 754 binary16 (fp16) value: a value past it rounds to inf.
FP16_MAX = 65504.0
#: Sketch warm-up steps of :func:`goblin_assets.opscope.record.record_sketches` (its default).
SKETCH_WARMUP = 1
#: At most this many (site, role) rows in the section's table (ranked, first first).
TABLE_ROWS = 8

#: Where the fixes come from (title, section, url), cited under the section.
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("Micikevicius et al., Mixed Precision Training (ICLR 2018)",
     "sec. 3.1 FP32 master copy of weights, sec. 3.2 loss scaling", "https://arxiv.org/abs/1710.03740"),
    ("PyTorch: Automatic Mixed Precision package - torch.amp", "Autocasting; Gradient Scaling",
     "https://pytorch.org/docs/stable/amp.html"),
)

_ORIGIN_TEXT = {
    "overflow": "both operands were finite: the product left the number format's range inside this matmul",
    "propagated": "its operands were already non-finite",
    "mask": "only -inf: an additive attention mask writes these on purpose (not a divergence by itself)",
    "weight": "the weight itself: the previous optimizer update wrote a non-finite value into it",
    "input": "the operand arrived non-finite (from the data, or from an op that is not a matmul)",
}


@dataclass
class Cause:
    """The precision cause of non-finite values, when one is found.

    ``kind``: ``fp16_weights_without_amp`` (``model.half()`` and no
    autocast/GradScaler), ``fp16_autocast_without_scaler``,
    ``fp16_with_scaler``, ``bf16``, ``fp32`` or ``unknown``; ``text`` and
    ``fix`` are sentences for the report.
    """

    kind: str
    text: str
    fix: str = ""


@dataclass
class NonfiniteEvidence:
    """Everything the report says about non-finite values (:func:`nonfinite_evidence`).

    ``sites``: one dict per non-finite (site, role), ranked (first first):
    ``site``, ``role``, ``first_step`` (recorded step), ``train_step``
    (1-based training step), ``counts`` (``nan``, ``posinf``, ``neginf``; None
    when not recorded), ``share``, ``origin``, ``output_layer``,
    ``absmax_before`` and ``sample_format``.  ``loss_step``: the training step
    from which the model's output (the forward's last matmul) is non-finite,
    so its loss is NaN (None when the output stayed finite or is unknown).
    ``param_step``/``params``: the harness's first optimizer step after which
    a parameter was non-finite (RunMetrics ``nonfinite_step``).
    """

    sites: list[dict[str, Any]]
    cause: Cause
    loss_step: int | None = None
    param_step: int | None = None
    params: list[str] = field(default_factory=list)
    sketch_warmup: int = SKETCH_WARMUP
    headline: str = ""
    markdown: list[str] = field(default_factory=list)
    html: str = ""

    @property
    def first(self) -> dict[str, Any] | None:
        """The (site, role) where non-finite values appear first (None when only the harness saw them)."""
        return self.sites[0] if self.sites else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (for ``goblin audit --json``): first site, role and step, loss step, cause."""
        f = self.first
        return {"first": None if f is None else {k: f[k] for k in ("site", "role", "first_step", "train_step",
                                                                   "counts", "origin")},
                "loss_step": self.loss_step, "param_step": self.param_step, "params": self.params,
                "cause": self.cause.kind, "cause_text": self.cause.text, "fix": self.cause.fix,
                "sites": len(self.sites), "headline": self.headline}


def train_step(recorded_step: int, sketch_warmup: int = SKETCH_WARMUP) -> int:
    """The 1-based training step whose forward pass was recorded as sketch step ``recorded_step`` (module docstring)."""
    return sketch_warmup + int(recorded_step) + 1


def _findings(patterns: pd.DataFrame | None) -> list[dict[str, Any]]:
    """The ``nonfinite`` rows of a ``patterns`` frame as dicts (evidence unpacked), ranked; [] when none."""
    if patterns is None or not len(patterns) or "finding" not in patterns.columns:
        return []
    rows = []
    for r in patterns[patterns["finding"] == FINDING].itertuples(index=False):
        ev = json.loads(r.evidence_json) if isinstance(r.evidence_json, str) else dict(r.evidence_json or {})
        rows.append({"run_id": r.run_id, "site": str(r.site), "role": str(r.role), **ev})
    return sorted(rows, key=lambda e: (e.get("origin") == "mask", e.get("rank", 0), e.get("first_step", 0)))


def code_names(config: ConfigDict | None) -> set[str]:
    """Names used in the config file's code (Python: every ``Name`` and attribute; docstrings are not code).

    A file that is not Python (or does not parse) gives the words of its
    lines that are not comments.  Empty without a config.
    """
    if config is None or not config.raw_source:
        return set()
    try:
        tree = ast.parse(config.raw_source)
    except (SyntaxError, ValueError):
        words = " ".join(line for line in config.raw_source.splitlines() if not line.lstrip().startswith("#"))
        return set(re.findall(r"[A-Za-z_]\w*", words))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def precision_cause(first: dict[str, Any] | None, sites: list[dict[str, Any]], config: ConfigDict | None) -> Cause:
    """Why the values turned non-finite, from the config's precision and the sketches' number formats.

    fp16 is recognised from the parsed config (``precision`` fp16, e.g. from
    ``model.half()``, with the file and line it came from) or from the
    sketches (an operand's sampled values are exact float16 values:
    ``sample_format``).  ``autocast`` and ``GradScaler`` are looked for in
    the config file's code (:func:`code_names`).  An fp16 that comes from a
    framework's flag (HF ``fp16=True``, Lightning ``16-mixed``, axolotl
    ``fp16: true``), not from a cast, is mixed precision with loss scaling:
    those frameworks run autocast and a GradScaler themselves.  The overflow
    sentence needs the first site's origin (``overflow``) and its largest
    value one recorded step before.
    """
    prec = config.precision if config is not None else None
    prov = config.provenance.get("precision") if config is not None else None
    where = f" ({prov.detail}, {prov.file}:{prov.line})" if prov is not None and prov.line else ""
    formats = {s.get("sample_format") for s in sites}
    fp16_seen = "fp16" in formats
    detail = prov.detail if prov is not None else ""
    half_cast = prec == "fp16" and (".half()" in detail or ".to(" in detail)
    names = code_names(config)
    autocast, scaler = "autocast" in names or "autocast" in detail, "GradScaler" in names or "GradScaler" in detail
    scaler = scaler or (prec == "fp16" and prov is not None and not half_cast and not autocast)   # a framework flag
    lr = f" (learning rate {config.lr:g})" if config is not None and config.lr is not None else ""
    overflow = ""
    if first is not None and first.get("origin") == "overflow" and first.get("absmax_before") is not None:
        overflow = (f" At `{first['site']}` the largest |value| one recorded step earlier was "
                    f"{first['absmax_before']:,.4g}; the next step's product passed fp16's largest finite value "
                    f"({FP16_MAX:,.0f}) and became inf, and inf - inf gives NaN in the ops after it.")
    if (half_cast or (fp16_seen and prec in (None, "fp16"))) and not autocast and not scaler:
        at = f" at {prov.file}:{prov.line}" if prov is not None and prov.line else ""
        evidence = ((f"`model.half()`{at}" if ".half()" in detail else f"{detail}{at}") if half_cast else
                    "the sketched operands hold exact float16 values")
        return Cause(
            "fp16_weights_without_amp",
            f"fp16 weights trained without autocast or GradScaler: {evidence}.  The weights themselves are "
            f"float16 (largest finite value {FP16_MAX:,.0f}, about 3 significant digits), the optimizer updates "
            f"them in float16{lr}, and nothing scales the loss or keeps an fp32 copy.{overflow}",
            "Keep the model in float32 (drop the `.half()` cast) and run the forward pass under "
            "`torch.autocast(device_type, dtype=torch.float16)` with a `torch.amp.GradScaler` (fp32 master "
            "weights and loss scaling), or train in bfloat16, which has float32's range, where the hardware "
            "supports it; lower the learning rate if the loss still diverges.")
    if (prec == "fp16" or fp16_seen) and autocast and not scaler:
        return Cause(
            "fp16_autocast_without_scaler",
            f"fp16 autocast without GradScaler{where}: fp16 gradients overflow or underflow without loss "
            f"scaling{lr}.{overflow}",
            "Add `torch.amp.GradScaler` (scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()), "
            "or autocast to bfloat16.")
    if prec == "fp16" or fp16_seen:
        return Cause(
            "fp16_with_scaler",
            f"fp16 with loss scaling{where}: GradScaler skips steps whose gradients overflow, but the values "
            f"here turned non-finite anyway{lr}.{overflow}",
            "Check the ops autocast keeps in float16 and the learning rate; bfloat16 has float32's range.")
    if prec == "bf16" or "bf16" in formats:
        return Cause("bf16", f"bfloat16 has float32's range: an overflow here is a divergence, not the "
                             f"format{lr}.", "Lower the learning rate or clip gradients "
                                            "(`torch.nn.utils.clip_grad_norm_`).")
    if prec == "fp32" or "fp32 or wider" in formats:
        return Cause("fp32", f"float32 training diverged{lr}: no narrow number format is involved.",
                     "Lower the learning rate or clip gradients (`torch.nn.utils.clip_grad_norm_`), and check "
                     "the data for NaN or inf.")
    return Cause("unknown", f"no precision cause found in the config or the sketches{lr}.")


def _count_cell(c: dict | None, k: str) -> str:
    return "?" if c is None else f"{c[k]:,}"


def _site_line(s: dict[str, Any]) -> str:
    c = s.get("counts")
    what = ("NaN/inf (counts not recorded)" if c is None else
            ", ".join(f"{c[k]:,} {n}" for k, n in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf")) if c[k]))
    share = f" of {s['numel']:,} elements" if s.get("numel") else ""
    return (f"`{s['site']}` ({s['role']}) at training step {s['train_step']} (recorded step {s['first_step']}): "
            f"{what}{share}; {_ORIGIN_TEXT.get(s.get('origin', ''), s.get('origin', ''))}")


def nonfinite_evidence(patterns: pd.DataFrame | None, metrics: RunMetrics | None = None,
                       config: ConfigDict | None = None, sketch_warmup: int = SKETCH_WARMUP
                       ) -> NonfiniteEvidence | None:
    """The "Non-finite values" evidence of one audit, or None when nothing was non-finite.

    Parameters
    ----------
    patterns
        Rows of the ``patterns`` table (the session's ``mined_patterns``):
        its ``nonfinite`` findings are read (evidence keys of
        :func:`goblin_assets.opscope.miner.nonfinite_finding`); None or
        empty for a replay.
    metrics
        The profiled run; its ``nonfinite_step``/``nonfinite_params`` (the
        harness's parameter check) are reported when set.
    config
        The parsed config: precision, its provenance, the file's source
        (autocast, GradScaler) and the learning rate, for the cause.
    sketch_warmup
        Unrecorded warm-up steps of the sketch run (to number training steps).

    Returns
    -------
    NonfiniteEvidence or None
        With ``markdown`` (lines, starting with the ``## Non-finite values``
        heading) and ``html`` (one ``<section>``) filled in.  A run whose only
        non-finite values are ``-inf`` in matmul outputs (attention masks) is
        reported too, with that said.
    """
    sites = []
    for s in _findings(patterns):
        sites.append({**s, "train_step": train_step(s.get("first_step", 0), sketch_warmup)})
    param_step = metrics.nonfinite_step if metrics is not None else None
    if not sites and param_step is None:
        return None
    real = [s for s in sites if s.get("origin") != "mask"]
    first = real[0] if real else (sites[0] if sites else None)
    out_steps = [s["train_step"] for s in real if s.get("output_layer") and s["role"] == "out"]
    ev = NonfiniteEvidence(sites=sites, cause=precision_cause(first, real, config) if real or param_step
                           else Cause("mask", _ORIGIN_TEXT["mask"]),
                           loss_step=min(out_steps) if out_steps else None, param_step=param_step,
                           params=list(metrics.nonfinite_params) if metrics is not None else [],
                           sketch_warmup=sketch_warmup)
    ev.headline = _headline(ev, first, bool(real))
    ev.markdown = _markdown(ev, first, bool(real))
    ev.html = _html(ev, first, bool(real))
    return ev


def _nan_word(first: dict[str, Any] | None) -> str:
    c = first.get("counts") if first else None
    if c is None:
        return "NaN/inf"
    return "NaN" if c["nan"] else "inf (NaN follows)"


def _headline(ev: NonfiniteEvidence, first: dict[str, Any] | None, real: bool) -> str:
    if not real and ev.param_step is None:
        return "Non-finite values: only -inf in matmul outputs (attention masks); no NaN."
    parts = []
    if ev.loss_step is not None:
        parts.append(f"the loss is NaN from training step {ev.loss_step}")
    if first is not None:
        parts.append(f"{_nan_word(first)} first appears at `{first['site']}` ({first['role']}), training step "
                     f"{first['train_step']}")
    elif ev.param_step is not None:
        parts.append(f"a parameter is NaN/inf after optimizer step {ev.param_step}")
    cause = {"fp16_weights_without_amp": "fp16 weights (`model.half()`) trained without autocast/GradScaler"}.get(
        ev.cause.kind, ev.cause.kind.replace("_", " "))
    return f"Non-finite values (NaN): {'; '.join(parts)}. Cause: {cause}."


def _markdown(ev: NonfiniteEvidence, first: dict[str, Any] | None, real: bool) -> list[str]:
    out = ["## Non-finite values", "", f"**{ev.headline}**", ""]
    if first is not None:
        out += [f"First: {_site_line(first)}."]
        if first.get("finite_steps_before") == [] and first.get("first_step") == 0:
            out += [f"Already at the first recorded step: it may have started during the {ev.sketch_warmup} "
                    f"unrecorded warm-up step(s)."]
        out.append("")
    if ev.loss_step is not None:
        out += [f"The model's output (the forward's last matmul) is non-finite from training step {ev.loss_step}, "
                "so the loss computed from it is NaN: the steps after it train on nothing.", ""]
    if ev.param_step is not None:
        names = f" ({', '.join(ev.params[:5])}{', ...' if len(ev.params) > 5 else ''})" if ev.params else ""
        out += [f"The harness found a parameter non-finite after optimizer step {ev.param_step}{names}.", ""]
    if ev.sites:
        out += ["| site | role | training step | NaN | +inf | -inf | share | how |",
                "|---|---|---|---|---|---|---|---|"]
        for s in ev.sites[:TABLE_ROWS]:
            c = s.get("counts")
            share = f"{s['share']:.1%}" if s.get("share") is not None else "?"
            out.append(f"| `{s['site']}` | {s['role']} | {s['train_step']} | {_count_cell(c, 'nan')} | "
                       f"{_count_cell(c, 'posinf')} | {_count_cell(c, 'neginf')} | {share} | {s.get('origin', '')} |")
        if len(ev.sites) > TABLE_ROWS:
            out.append(f"| ... | | | | | | | {len(ev.sites) - TABLE_ROWS} more |")
        out.append("")
    if real or ev.param_step is not None:
        out += [f"**Cause:** {ev.cause.text}", ""]
        if ev.cause.fix:
            out += [f"**Fix:** {ev.cause.fix}", ""]
        out += ["Sources: " + "; ".join(f"[{t}]({u}), {sec}" for t, sec, u in SOURCES) + ".", ""]
    return out


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _html(ev: NonfiniteEvidence, first: dict[str, Any] | None, real: bool) -> str:
    def code(text: str) -> str:  # `x` -> <code>x</code>, the rest escaped
        bits = text.split("`")
        return "".join(f"<code>{_e(b)}</code>" if i % 2 else _e(b) for i, b in enumerate(bits))

    parts = ['<section class="nonfinite">', "<h2>Non-finite values</h2>",
             f'<p class="headline"><b>{code(ev.headline)}</b></p>']
    if first is not None:
        parts.append(f"<p>First: {code(_site_line(first))}.</p>")
    if ev.loss_step is not None:
        parts.append(f"<p>The model's output (the forward's last matmul) is non-finite from training step "
                     f"{ev.loss_step}, so the loss computed from it is NaN.</p>")
    if ev.param_step is not None:
        parts.append(f"<p>The harness found a parameter non-finite after optimizer step {ev.param_step}"
                     f"{' (' + _e(', '.join(ev.params[:5])) + ')' if ev.params else ''}.</p>")
    if ev.sites:
        parts.append("<table><tr><th>site</th><th>role</th><th>training step</th><th>NaN</th><th>+inf</th>"
                     "<th>-inf</th><th>share</th><th>how</th></tr>")
        for s in ev.sites[:TABLE_ROWS]:
            c = s.get("counts")
            share = f"{s['share']:.1%}" if s.get("share") is not None else "?"
            parts.append(f"<tr><td><code>{_e(s['site'])}</code></td><td>{_e(s['role'])}</td>"
                         f"<td>{s['train_step']}</td><td>{_count_cell(c, 'nan')}</td>"
                         f"<td>{_count_cell(c, 'posinf')}</td><td>{_count_cell(c, 'neginf')}</td><td>{share}</td>"
                         f"<td>{_e(s.get('origin', ''))}</td></tr>")
        parts.append("</table>")
    if real or ev.param_step is not None:
        parts.append(f"<p><b>Cause:</b> {code(ev.cause.text)}</p>")
        if ev.cause.fix:
            parts.append(f"<p><b>Fix:</b> {code(ev.cause.fix)}</p>")
        parts.append('<p class="muted">Sources: ' + "; ".join(
            f'<a href="{_e(u)}">{_e(t)}</a>, {_e(sec)}' for t, sec, u in SOURCES) + ".</p>")
    parts.append("</section>")
    return "\n".join(parts)


def nonfinite_section(patterns: pd.DataFrame | None, metrics: RunMetrics | None = None,
                      config: ConfigDict | None = None, sketch_warmup: int = SKETCH_WARMUP) -> tuple[list[str], str]:
    """``(markdown lines, html)`` of the report's "Non-finite values" section; ``([], "")`` when there is none.

    What report.py calls (see :func:`nonfinite_evidence` for the parameters).
    """
    ev = nonfinite_evidence(patterns, metrics, config, sketch_warmup)
    return ([], "") if ev is None else (ev.markdown, ev.html)
