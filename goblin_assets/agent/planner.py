"""The offline planner: a Backend that needs no model.

It calls the tools in the canonical order (parse_config, profile_run,
query_rocm_kb, propose_patch, benchmark, compare_runs), then, when the
question is a what-if it understands ("what if I double the batch", "batch
size 128", "with 4 workers"), propose_patch and benchmark with those
overrides.  Its thoughts and final answer are filled-in templates over the
same redacted tool results a model would read, so a conversation with it is
deterministic and tests can be exact.  It stops at the first failed tool and
says where.
"""
from __future__ import annotations

import json
import re
from typing import Any

from goblin_assets.agent.backend import ToolCallRequest, Turn
from goblin_assets.agent.tools import CANONICAL_ORDER

#: What-if fields the planner recognises in a question: (ConfigDict field, regex of the words that name it).
WHAT_IF_FIELDS: tuple[tuple[str, str], ...] = (
    ("batch_size", r"batch(?:[ _-]?size)?"),
    ("dataloader_workers", r"(?:data[ _-]?loader[ _-]?)?workers?"),
    ("intra_op_threads", r"(?:intra[ _-]?op[ _-]?)?threads?"),
    ("seq_len", r"seq(?:uence)?[ _-]?len(?:gth)?"),
)

#: Words that scale the current value: (regex, factor).
SCALES: tuple[tuple[str, float], ...] = (
    (r"\b(?:double|twice)\b|\b2\s*x\b|\bx\s*2\b", 2.0),
    (r"\btriple\b|\b3\s*x\b", 3.0),
    (r"\b(?:halve|half)\b", 0.5),
)


def what_if(question: str, config: dict[str, Any]) -> dict[str, int] | None:
    """The overrides a what-if question asks for, or None.

    ``"what if I double the batch"`` with ``batch_size=64`` gives
    ``{"batch_size": 128}``; ``"batch size 256"`` gives ``{"batch_size":
    256}``; a field whose current value is unknown cannot be scaled.
    """
    q = question.lower()
    for fld, words in WHAT_IF_FIELDS:
        if not re.search(rf"\b{words}\b", q):
            continue
        num = (re.search(rf"\b{words}\b\D{{0,16}}?\b(\d+)\b(?!\s*x\b)", q)
               or re.search(rf"\b(\d+)\s+(?:{words})\b", q))
        if num:
            return {fld: int(num.group(1))}
        cur = config.get(fld)
        factor = next((f for pat, f in SCALES if re.search(pat, q)), None)
        if factor is not None and isinstance(cur, int) and not isinstance(cur, bool):
            return {fld: max(1, int(cur * factor))}
    return None


def _v(x: Any) -> str:
    return "unset" if x is None else str(x)


def _top_bucket(budget: dict[str, dict[str, Any]], share_key: str = "share") -> tuple[str, dict[str, Any]] | None:
    """The non-useful waste bucket with the largest share."""
    rest = [(k, b) for k, b in budget.items() if k != "useful" and (b.get(share_key) or 0) > 0]
    return max(rest, key=lambda kb: kb[1][share_key]) if rest else None


def _rules(items: list[dict[str, Any]]) -> str:
    return ", ".join(i["rule"] for i in items) or "none"


def _template(fill, fallback: str) -> str:
    """``fill()``, or ``fallback`` when a result lacks a field the template reads (a cut or odd result)."""
    try:
        return fill()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return fallback


class OfflinePlanner:
    """A deterministic Backend: the canonical audit plus a what-if, thoughts and answer from templates."""

    name = "offline planner (no model)"

    def __init__(self) -> None:
        self.question = ""
        self.plan: list[tuple[str, str, dict[str, Any]]] = [(t, t, {}) for t in CANONICAL_ORDER]
        self.results: dict[str, dict[str, Any]] = {}
        self.failed: tuple[str, str] | None = None
        self._sent: dict[str, str] = {}

    def add_user_message(self, text: str) -> None:
        """Remember the question (what-if overrides are worked out once the config is known)."""
        self.question = f"{self.question}\n{text}".strip()

    def add_tool_result(self, call_id: str, name: str, content: str) -> None:
        """Read a result as a model would: the redacted JSON text."""
        key = self._sent.get(call_id, name)
        try:
            data = json.loads(content)
        except json.JSONDecodeError:
            data = {"ok": False, "error": "unreadable result"}
        self.results[key] = data
        if not data.get("ok", False):
            self.failed = self.failed or (name, str(data.get("error", "failed")))
        elif key == "parse_config":
            overrides = what_if(self.question, data.get("config", {}))
            if overrides:
                self.plan += [(f"{t}:whatif", t, {"overrides": overrides}) for t in ("propose_patch", "benchmark")]

    def next_turn(self, tools: list[dict[str, Any]]) -> Turn:
        """The next planned tool call with its thought, or the final answer (no tools offered, a failure, or done)."""
        offered = {t["function"]["name"] for t in tools}
        while self.plan and self.plan[0][1] not in offered and offered:
            self.plan.pop(0)
        if not offered or self.failed or not self.plan:
            return Turn(text=_template(self.final_text, "The results could not be summarised; see the report."))
        key, tool, args = self.plan.pop(0)
        call_id = f"call_{len(self._sent) + 1}"
        self._sent[call_id] = key
        return Turn(text=_template(lambda: self.thought(key, args), f"Next: {tool}."),
                    tool_calls=[ToolCallRequest(id=call_id, name=tool, arguments=json.dumps(args))])

    # -- templates

    def thought(self, key: str, args: dict[str, Any]) -> str:
        """What the planner says before calling ``key`` (a tool name, ``:whatif`` for the question's overrides)."""
        r = self.results
        if key == "parse_config":
            return "I start from the training setup in your own file (parse_config)."
        if key == "profile_run":
            c = r["parse_config"]["config"]
            warn = len(r["parse_config"].get("warnings", []))
            return (f"Your file sets batch_size {_v(c.get('batch_size'))}, dataloader_workers "
                    f"{_v(c.get('dataloader_workers'))}, intra_op_threads {_v(c.get('intra_op_threads'))}, precision "
                    f"{_v(c.get('precision'))}" + (f"; the parser left {warn} warning(s)" if warn else "") +
                    ". Next: a few profiled steps to see where the step time goes (profile_run).")
        if key == "query_rocm_kb":
            p = r["profile_run"]
            top = _top_bucket(p.get("waste_budget", {}))
            where = (f"besides useful work the largest bucket is {top[0]}: {top[1]['share']:.0%} of the step "
                     f"({top[1]['status']})" if top else "nearly all of it is useful work")
            return (f"A step takes {p.get('step_time_ms')} ms ({p.get('throughput')} {p.get('throughput_unit')}, "
                    f"{p.get('provenance')}); {where}. Next: check every cited rule against this run (query_rocm_kb).")
        if key == "propose_patch":
            fired = r["query_rocm_kb"].get("fired", [])
            if not fired:
                return "No rule fired on this run; propose_patch should find nothing to change."
            return (f"{len(fired)} rule(s) fired: {_rules(fired)}. Next: turn them into a patch of your file "
                    "(propose_patch).")
        if key == "benchmark":
            p = r["propose_patch"]
            lo, hi = p.get("predicted_speedup", [1.0, 1.0])
            return (f"The patch applies {_rules(p.get('applied', []))}, predicted {lo:.2f}x-{hi:.2f}x (modelled from "
                    "the waste budget, not measured). Next: measure original vs patched (benchmark).")
        if key == "compare_runs":
            b = r["benchmark"]
            if b.get("status") == "not_observable":
                return (f"Nothing can be measured here: {b.get('reason')}. Next: the report of the recorded run "
                        "(compare_runs).")
            cached = [a for a in ("baseline", "patched") if b[a].get("cache_hit")]
            return (f"Measured {b['baseline']['median']} -> {b['patched']['median']} {b.get('unit')} "
                    f"({b['speedup']:.2f}x, {b.get('verdict', 'no interval')}" + (f"; {' and '.join(cached)} from the benchmark cache" if cached else "")
                    + "). Next: the two profiles and the benchmark side by side (compare_runs).")
        fld, value = next(iter(args["overrides"].items()))
        if key == "propose_patch:whatif":
            cur = r["parse_config"]["config"].get(fld)
            return (f"Your question: what if {fld} = {value} (your file has {_v(cur)})? I write that into a copy of "
                    "your file and re-check the rules on a profiled run of it (propose_patch with overrides).")
        applied = r.get("propose_patch:whatif", {}).get("applied", [])
        return (f"With {fld} = {value}, the rules that apply: {_rules(applied)}. Next: measure that config as-is and "
                "patched (benchmark with overrides); your original's numbers stay in the benchmark cache.")

    def final_text(self) -> str:
        """The final answer: measured result, why, the rule that matters most, the what-if, and where it holds."""
        r = self.results
        out: list[str] = []
        if self.failed:
            tool, err = self.failed
            out.append(f"The audit stopped at {tool}: {err}. Nothing after that step ran; fix it and ask again.")
        rep = r.get("compare_runs") if r.get("compare_runs", {}).get("ok") else None
        if rep and rep.get("status") == "not_observable":
            lo, hi = rep["predicted_speedup"]
            out.append(f"Measured speedup: not observable ({rep.get('reason')}). From the {rep.get('provenance')} "
                       f"waste budget the patch is predicted at {lo:.2f}x-{hi:.2f}x, confidence "
                       f"{rep['confidence']:.2f}; applied: {_rules(rep.get('applied', []))}.")
            rep = None
        elif rep:
            t = rep["throughput"]
            lo, hi = rep["predicted_speedup"]
            hits = ", ".join(t.get("cache_hits") or [])
            cached = f" (replayed from the benchmark cache: {hits})" if hits else ""
            iv = rep.get("measured_speedup_interval") or [None, None]
            how = (f" ({rep.get('interval_level', 0.95):.0%} interval {iv[0]:.2f}x-{iv[1]:.2f}x)"
                   if None not in iv else "")
            head = (f"No significant change: {rep['measured_speedup']:.2f}x{how}" if
                    rep.get("verdict") == "no significant change" else f"Measured speedup {rep['measured_speedup']:.2f}x{how}")
            out.append(f"{head}: {t['original']} -> {t['patched']} "
                       f"{t['unit']}{cached}; predicted {lo:.2f}x-{hi:.2f}x, confidence {rep['confidence']:.2f}.")
            top = _top_bucket(rep.get("waste_budget_ms", {}), "original_share")
            if top:
                out.append(f"Why: before the patch {top[0]} took {top[1]['original_share']:.0%} of the step "
                           f"({top[1]['original']} ms; {top[1]['patched']} ms after).")
            applied = sorted(rep.get("applied", []), key=lambda a: -(a.get("predicted_share_of_step") or 0))
            if applied:
                a = applied[0]
                out.append(f"The rule that matters most: {a['rule']}, predicted to recover "
                           f"{a['predicted_share_of_step']:.0%} of the step (source: {a['source']})."
                           + (f" Also applied: {_rules(applied[1:])}." if applied[1:] else ""))
            else:
                out.append("No rule fired: there is nothing to change for this run.")
            changes = [f"{k} {_v(v.get('from'))} -> {_v(v.get('to'))}" for a in r.get("propose_patch", {})
                       .get("applied", []) for k, v in a.get("changes", {}).items()]
            if changes:
                out.append("Change in your file: " + "; ".join(changes) + " (the diff is in the report).")
        wb, wp = r.get("benchmark:whatif", {}), r.get("propose_patch:whatif", {})
        if wb.get("ok") and wb.get("status") != "not_observable":   # a replay's what-if benchmarks nothing
            (fld, value), = wb["overrides"].items()
            vs = wb.get("vs_original")
            rel = (f" ({vs['as_is']:.2f}x and {vs['with_patch']:.2f}x your original)" if vs else "")
            out.append(f"What if {fld} = {value}: {wb['baseline']['median']} {wb.get('unit')} as-is, "
                       f"{wb['patched']['median']} with its patch ({_rules(wp.get('applied', []))}){rel}.")
        elif wp.get("ok"):
            (fld, value), = wp["overrides"].items()
            out.append(f"What if {fld} = {value}: the rules that apply: {_rules(wp.get('applied', []))}.")
        if rep:
            h = rep["holds_for"]
            out.append(f"These numbers hold only for workload {h['workload']} ({h['model'] or 'model unknown'}) on "
                       f"{h['device']}, {h['accelerator']}, torch {h['torch']}, {h['shape']}; they say nothing about "
                       "another model, dataset or machine.")
        return "\n\n".join(out) or "Nothing was measured."
