"""The ``goblin`` command: the audit session's stages (the same as the asset graph's), without Dagster.

    goblin audit --trace TRACE [CONFIG] [--json] [--html OUT]
    goblin audit PATH [--steps N] [--bench-steps N] [--repeats N] [--timeout S] [--json | --plain]
                      [--fail-on unhealthy|hazard] [--html OUT] [--mlflow URI]
    goblin profile PATH [--steps N] [--runner local|rocprof|replay] [--json]
    goblin parse FILE [--json]
    goblin chat PATH [--question TEXT] [--base-url URL] [--model NAME] [--json]
    goblin sql "SELECT ..." [--json]
    goblin trace PATH [PATH_B] [--json] [--html OUT]
    goblin fit PATH [--device mi300x|h100|...] [--json]
    goblin memory SNAPSHOT.pickle [--json] [--html OUT]
    goblin mcp [--http] [--port N]

Errors are printed as one clear line naming the file and the problem (exit
code 2); no traceback from deep inside.  ``goblin audit`` exits 0 when the
audit completed, whatever it found (a failed or non-finite run included), and 3
when ``--fail-on`` names a condition that holds.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.table import Table

from goblin_assets.cli_common import add_settings_options, complete_audit, console, open_session, out
from goblin_assets.errors import GoblinError


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _metrics_table(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    return t


def _fmt(v, unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v * scale:.{digits}f}{unit}"


#: Exit status of ``goblin audit``: 0 the audit completed (whatever it found, a failed or non-finite run
#: included), 2 an error stopped it (bad input, a typed Goblin error), 3 the condition named by ``--fail-on``
#: holds (``unhealthy``: the run failed or went non-finite; ``hazard``: that, or a hazard fired).
EXIT_FAIL_ON = 3


def _fails_on(verdict, fail_on: str | None) -> bool:
    if fail_on is None:
        return False
    kinds = {i.kind for i in verdict.items}
    return not verdict.healthy or (fail_on == "hazard" and "hazard" in kinds)


def _plain_summary(s, html_path) -> list[str]:
    """The summary as plain lines (``--plain``, and the first lines of the rich one): the verdict first."""
    v = s.verdict()
    lines = [f"verdict: {v.headline}", *[f"  {line}" for line in v.lines()[2:]]]
    fix = s.results.get("oom_fix")
    if fix:  # the out-of-memory fix, validated under the same memory limit (audit/fit.py oom_fix)
        ch = ", ".join(f"{k}={v}" for k, v in fix["change"].items())
        sps = f"{fix['samples_per_sec']:.2f} samples/s" if fix.get("samples_per_sec") else "throughput not observable"
        lines.append(f"fix: {ch} (global batch {fix['global_batch_before']} -> {fix['global_batch_after']}): "
                     + (f"ran under the same memory limit, {sps}" if fix["ok"] else f"failed too: {fix['failure']}"))
    if not s.results.get("failure"):
        p = s.patch()
        lines.append(f"rules: {', '.join(a.rule_id for a in p.applied) or 'none'}"
                     + (f"; not applied: {len(p.dropped)}" if p.dropped else ""))
        diff = s.out_dir / "patch.diff"
        lines.append("patch: " + (str(diff) if v.patch_offered and diff.is_file()
                                  else "none offered" + (f" ({v.not_recommended})" if v.not_recommended else "")))
    lines.append(f"report: {s.report_path}" + (f" (HTML: {html_path})" if html_path else ""))
    return lines


def cmd_audit(args) -> int:
    from goblin_assets.report.markdown import speedup_text

    frames, trace_note = {}, ""
    if args.trace:
        from goblin_assets.trace.analysis import trace_frames
        from goblin_assets.trace.workload import trace_workload

        wl, trep = trace_workload(args.trace, args.path)
        s = open_session(args, workload=wl)
        frames = trace_frames(trep, audit_id=s.audit_id, with_run=False)
        trace_note = f"audited from the recorded trace {trep.path}: nothing was run"
    elif args.path is None:
        raise GoblinError("goblin audit needs a workload PATH, or --trace TRACE")
    else:
        s = open_session(args)
    completed, mlflow_run = complete_audit(s, frames, args.mlflow)
    tracked = {"mlflow_run_id": mlflow_run} if mlflow_run else {}
    if not completed:
        v = s.verdict()
        if args.json:
            _print_json({**s.failure_json(), **tracked})
        else:
            out.print("\n".join(_plain_summary(s, None)), highlight=False, markup=False)
        return EXIT_FAIL_ON if _fails_on(v, args.fail_on) else 0
    html_path = s.write_html(args.html) if args.html else None
    if html_path:
        console.print(f"[dim]HTML report: {html_path}[/dim]")
    v = s.verdict()
    code = EXIT_FAIL_ON if _fails_on(v, args.fail_on) else 0
    if args.json:
        _print_json({**s.to_json(), **({"html_path": str(html_path)} if html_path else {}),
                     **({"trace": trace_note} if trace_note else {}),
                     **tracked})
        return code
    if args.plain:
        out.print("\n".join(([trace_note] if trace_note else []) + _plain_summary(s, html_path)), highlight=False,
                  markup=False)
        return code
    out.print(f"[bold]verdict: {v.headline}[/bold]", highlight=False)
    for line in v.lines()[2:]:
        out.print(f"  {line}", highlight=False, markup=False)
    if trace_note:
        out.print(trace_note, highlight=False)
    r, wl = s.audit_report(), s.workload
    if s.replay or s.benchmarks() is None:
        m = s.profile_run()
        rows = [("step time", _fmt(m.step_time_s, " ms", 1e3, 1)), (m.throughput_unit, _fmt(m.throughput, digits=1)),
                *[(f"  {k} ({b.status})", _fmt(b.seconds, " ms", 1e3)) for k, b in m.waste_budget.items()]]
        out.print(_metrics_table(f"goblin audit: {wl.name} ({r.provenance}: nothing benchmarked)", rows))
        out.print(f"measured speedup: not observable ({s.not_observable.get('benchmarks', '')})", highlight=False)
        out.print(f"predicted {r.predicted_low:.2f}x–{r.predicted_high:.2f}x (confidence {r.confidence:.2f}); "
                  f"rules: {', '.join(a.rule_id for a in s.patch().applied) or 'none'}", highlight=False)
    else:
        t = Table(title=f"goblin audit: {wl.name}")
        for c in ("", "original", "patched"):
            t.add_column(c)
        t.add_row(f"{r.throughput_unit or r.unit + '/s'} (median, measured)", f"{r.baseline_throughput:.1f}",
                  f"{r.patched_throughput:.1f}")
        t.add_row("step time (profiled)", _fmt(r.before_step_time_s, " ms", 1e3, 1),
                  _fmt(r.after_step_time_s, " ms", 1e3, 1))
        for bc in r.buckets:
            t.add_row(f"  {bc.bucket} ({bc.before_status})", f"{bc.before_share:.0%}", f"{bc.after_share:.0%}")
        out.print(t)
        out.print(f"measured speedup [bold]{speedup_text(r)}[/bold] (predicted {r.predicted_low:.2f}x–"
                  f"{r.predicted_high:.2f}x, confidence {r.confidence:.2f}); rules: "
                  f"{', '.join(a.rule_id for a in r.applied) or 'none'}", highlight=False)
        if v.not_recommended:
            out.print(f"patch not recommended ({v.not_recommended}): no patch.diff is offered", highlight=False)
    out.print(f"report: {s.report_path}" + (f" (HTML: {html_path})" if html_path else ""), highlight=False)
    return code


def cmd_profile(args) -> int:
    m = open_session(args, with_kb=False).profile_run()
    if args.json:
        _print_json(json.loads(m.model_dump_json()))
        return 0
    rows = [("steps", str(m.steps)), ("step_time_s (median)", _fmt(m.step_time_s, " s", digits=4)),
            (f"{m.unit}/s", _fmt(m.throughput, digits=1)), ("padding_share", _fmt(m.padding_share, digits=3)),
            ("mfu_pct", _fmt(m.mfu_pct, " %", digits=3)),
            ("mem_peak_gb", _fmt(m.mem_peak_gb, " GB", digits=3)), ("mem_avg_gb", _fmt(m.mem_avg_gb, " GB", digits=3)),
            ("memory_headroom_gb", _fmt(m.memory_headroom_gb, " GB", digits=2)),
            ("headroom_batch (estimated)", "-" if m.headroom_batch is None else str(m.headroom_batch)),
            ("util_pct", _fmt(m.util_pct, " %", digits=1)),
            ("attention_kernel_loaded", str(m.attention_kernel_loaded))]
    rows += [(f"waste.{k} ({b.status})", _fmt(b.seconds, " ms", 1e3)) for k, b in m.waste_budget.items()]
    rows += [(f"top op {i + 1}", f"{k.name} {k.pct_time:.1f}%") for i, k in enumerate(m.top_kernels)]
    rows += [(f"{k} (not observable)", v) for k, v in m.not_observable.items()]
    out.print(_metrics_table(f"goblin profile: {m.workload} ({m.provenance.kind} on {m.provenance.device})", rows))
    out.print(f"trace: {m.trace_path}")
    return 0


def cmd_parse(args) -> int:
    from goblin_assets.config.parse import config_to_json, parse_config, render_config_table

    cfg = parse_config(args.file)
    if args.json:
        _print_json(config_to_json(cfg))
    else:
        out.print(render_config_table(cfg))
    return 0


def cmd_sql(args) -> int:
    from goblin_assets.warehouse.db import query

    df = query(args.query)
    if args.json:
        _print_json(json.loads(df.to_json(orient="records", date_format="iso")))
        return 0
    t = Table(show_header=True)
    for c in df.columns:
        t.add_column(str(c))
    for row in df.itertuples(index=False):
        t.add_row(*[("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)) for v in row])
    out.print(t)
    out.print(f"[dim]{len(df)} rows[/dim]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="goblin", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    a = sub.add_parser("audit", help="audit a workload end to end and write the report")
    a.add_argument("path", nargs="?", help="workload folder (with workload.yaml), a replay folder "
                                           "(cached_metrics.json) or a training script; with --trace, the run's "
                                           "config file (default: the config beside the trace)")
    a.add_argument("--trace", metavar="TRACE", default=None,
                   help="audit a run recorded elsewhere from its trace (Kineto .json/.json.gz or rocprofv3 "
                        "JSON/CSV): nothing is executed")
    add_settings_options(a)
    a.add_argument("--json", action="store_true", help="print the audit as one JSON object (its verdict first)")
    a.add_argument("--plain", action="store_true", help="print the summary as plain lines, for pipes and logs")
    a.add_argument("--fail-on", dest="fail_on", choices=["unhealthy", "hazard"], default=None,
                   help="exit 3 when the run failed or went non-finite (unhealthy), or also when a hazard fired "
                        "(hazard); without it an audit that completed exits 0 whatever it found")
    a.add_argument("--html", metavar="OUT.html", help="also write the self-contained HTML report to this file")
    a.add_argument("--mlflow", metavar="URI", default=None,
                   help="log the audit as one MLflow run to this tracking URI (e.g. sqlite:///mlflow.db; default "
                        "$GOBLIN_MLFLOW_TRACKING_URI; nested under $GOBLIN_MLFLOW_PARENT_RUN_ID when set)")
    a.set_defaults(fn=cmd_audit)

    pr = sub.add_parser("profile", help="profile a workload and print RunMetrics")
    pr.add_argument("path")
    add_settings_options(pr, bench=False)
    pr.add_argument("--runner", dest="kind", choices=["local", "rocprof", "replay"], default=None,
                    help="local: installed torch; rocprof: wrapped in rocprofv3 + amd-smi; replay: cached_metrics.json "
                         "(default $GOBLIN_RUNNER_KIND, else local)")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(fn=cmd_profile)

    pa = sub.add_parser("parse", help="parse a training config and print the ConfigDict with provenance")
    pa.add_argument("file")
    pa.add_argument("--json", action="store_true")
    pa.set_defaults(fn=cmd_parse)

    from goblin_assets.cli_chat import add_chat_parser
    from goblin_assets.cli_fit import add_fit_parser
    from goblin_assets.cli_kb import add_kb_parser
    from goblin_assets.cli_mcp import add_mcp_parser
    from goblin_assets.cli_memory import add_memory_parser
    from goblin_assets.cli_opscope import add_opscope_parser
    from goblin_assets.cli_opscope_mine import add_mining_parsers
    from goblin_assets.cli_trace import add_trace_parser

    add_kb_parser(sub)
    add_chat_parser(sub)
    add_mining_parsers(add_opscope_parser(sub))
    add_trace_parser(sub)
    add_fit_parser(sub)
    add_memory_parser(sub)
    add_mcp_parser(sub)

    s = sub.add_parser("sql", help="run a SQL query on the warehouse")
    s.add_argument("query")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_sql)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except GoblinError as exc:
        console.print(f"goblin {args.cmd}: error: {exc}", style="bold red", highlight=False, markup=False,
                      soft_wrap=True)  # a path in the message stays whole in a log (no wrapping at 80 columns)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
