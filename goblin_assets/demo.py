"""``make demo``: materialize every asset for the bundled workloads, headlessly, with Dagster.

``python -m goblin_assets.demo [WORKLOAD ...] [--all] [--verbose]``: ``--all`` adds the
opscope lab assets (recording drivers, miners, probes, plan); ``--verbose``
shows Dagster's event log (DEBUG) and library warnings, which are quiet
otherwise.  Without
workload names it audits the runnable workloads only; a replay partition of the
synthetic corpus is audited when named (``synthetic/fp32_on_mi300x``).

Uses the instance at ``$DAGSTER_HOME`` (the Makefile sets ``./.goblin/dagster``)
so the runs show up later in ``make ui``; adds one dynamic partition per
workload folder, materializes the unpartitioned assets once and then every
partitioned asset per workload, and prints where the reports and the
warehouse are.
"""
from __future__ import annotations

import os
import sys
import textwrap
import time
import warnings
from pathlib import Path

import dagster as dg
from rich.console import Console

from goblin_assets import warehouse_path, workloads_root
from goblin_assets.definitions import defs
from goblin_assets.defs.partitions import workload_names, workloads_partitions
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse.db import query


#: Asset groups of the opscope lab: their unpartitioned assets are materialized with ``--all``.
LAB_GROUPS = {"opscope", "mining"}
#: The summary's width: it fits a 100-column terminal, and paths are never folded inside.
WIDTH = 100
#: Dagster's console log level in the demo: its DEBUG event lines only with ``--verbose``.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _short_path(path: str | None) -> str:
    """``path`` relative to the working directory when it lies under it (shorter, still a valid path)."""
    if not path:
        return "none"
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def summary_lines(reports: list[tuple[str, str | None, str | None]], seconds: float) -> list[str]:
    """The demo's closing summary, at most :data:`WIDTH` columns a line: per workload its verdict (wrapped
    between words) and its report's path (never folded)."""
    out = [f"done in {seconds:.0f} s"]
    for name, path, verdict in reports:
        out += textwrap.wrap(f"{name}: {verdict or 'no verdict'}", WIDTH, subsequent_indent="    ")
        out.append(f"    report: {_short_path(path)}")
    return out


def _ancestors(graph, key) -> set:
    seen, todo = set(), list(graph.get(key).parent_keys)
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo.extend(graph.get(k).parent_keys)
    return seen


def default_workloads() -> list[str]:
    """The runnable workload partitions; a replay of the synthetic corpus is audited only when named."""
    return [n for n in workload_names() if not load_workload(workloads_root() / n).replay]


def demo_selection(graph, lab: bool = False) -> tuple[list, list, set]:
    """The demo's asset keys: unpartitioned ones first, the audit's workload-partitioned stages, then the
    unpartitioned assets downstream of the audits (the SQL models).  Assets partitioned otherwise (the
    ``recorded_trace`` partitions, one per trace file) are left out: the demo ships no trace, and Dagster
    runs only assets of one partitions definition together.  The opscope lab's groups only with ``lab``."""
    keys = [k for k in graph.get_all_asset_keys() if graph.get(k).is_materializable
            and graph.get(k).partitions_def in (None, workloads_partitions)
            and (lab or graph.get(k).partitions_def is not None or graph.get(k).group_name not in LAB_GROUPS)]
    partitioned = [k for k in keys if graph.get(k).partitions_def is not None]
    after = {k for k in keys if graph.get(k).partitions_def is None and _ancestors(graph, k) & set(partitioned)}
    before = [k for k in keys if graph.get(k).partitions_def is None and k not in after]
    return before, partitioned, after


def main(argv: list[str] | None = None) -> int:
    """Audit the named workloads (default: every runnable one) through Dagster; 0 on success, 1 on a failed run."""
    console = Console()
    args = list(argv if argv is not None else sys.argv[1:])
    lab = "--all" in args  # also the opscope lab: recording drivers and miners (several more minutes)
    verbose = "--verbose" in args  # Dagster's DEBUG event lines and library warnings too
    run_config = {} if verbose else QUIET
    if not verbose:
        warnings.filterwarnings("ignore")
    names = [a for a in args if not a.startswith("--")] or default_workloads()
    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()
    known = set(instance.get_dynamic_partitions(workloads_partitions.name))
    instance.add_dynamic_partitions(workloads_partitions.name, [n for n in names if n not in known])
    graph = defs.resolve_asset_graph()
    assets = list(defs.assets)
    resources = defs.resources
    before, partitioned, after = demo_selection(graph, lab)
    t0 = time.perf_counter()
    with console.status("observing rocm_image; materializing the knowledge base"):
        defs.resolve_job_def("observe_rocm_image").execute_in_process(instance=instance, run_config=run_config)
        res = dg.materialize(assets, selection=before, instance=instance, resources=resources, run_config=run_config)
    if not res.success:
        console.print("[red]unpartitioned assets failed[/red]")
        return 1
    reports = []
    for name in names:
        with console.status(f"workload {name}: materializing {len(partitioned)} assets"):
            res = dg.materialize(assets, selection=partitioned, partition_key=name, instance=instance,
                                 resources=resources, raise_on_error=False, run_config=run_config)
        if not res.success:
            console.print(f"[red]workload {name}: the run failed (run {res.run_id}); rerun with "
                          f"DEMO_ARGS=--verbose for Dagster's logs, or open it in make ui[/red]")
            return 1
        mats = res.asset_materializations_for_node("audit_report")
        path = mats[-1].metadata["report_path"].value if mats else None
        verdict = mats[-1].metadata["verdict"].value if mats else None
        console.print(f"workload {name}: audited", highlight=False)
        reports.append((name, path, verdict))
    if after:
        with console.status("building the SQL models"):
            if not dg.materialize(assets, selection=list(after), instance=instance, resources=resources,
                                  run_config=run_config).success:
                console.print("[red]SQL models failed[/red]")
                return 1
    for line in summary_lines(reports, time.perf_counter() - t0):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"warehouse: {_short_path(str(warehouse_path()))}", highlight=False, soft_wrap=True)
    counts = query("SELECT 'runs' t, count(*) n FROM runs UNION ALL SELECT 'sketches', count(*) FROM sketches "
                   "UNION ALL SELECT 'benchmarks', count(*) FROM benchmarks UNION ALL SELECT 'audits', count(*) "
                   "FROM audits")
    console.print("rows: " + ", ".join(f"{r.t}={r.n}" for r in counts.itertuples()))
    console.print("browse them with: make ui   (or: .venv/bin/goblin sql \"SELECT * FROM audits\")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
