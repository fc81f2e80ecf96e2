"""The opscope mining driver: one function per miner, shared by the CLI verbs and the Dagster assets.

``goblin opscope <verb>`` (:mod:`goblin_assets.cli_opscope_mine`) and the
mining assets (:mod:`goblin_assets.defs.mining`) call the function of the same
name here and nothing else; the names are the concepts' names
(``docs/naming.md``):

==================  ===========================  ==========================================
function / verb     asset                        tables written
==================  ===========================  ==========================================
:func:`mine`        ``opscope_patterns``         ``patterns`` (and ``sketches`` it recorded)
:func:`infer`       ``inference_dynamics``       ``patterns`` (and ``sketches`` it recorded)
:func:`probes`      ``probes``                   ``probes``, ``patterns``
:func:`roofline`    ``roofline``                 ``roofline``, ``patterns``
:func:`dataflow`    ``dataflow``                 ``patterns``
:func:`plan`        ``plan``                     ``plan``, ``patterns``
:func:`online_sketches`  ``online_sketches``     ``online_sketches``
==================  ===========================  ==========================================

Inputs are explicit.  A miner that reads recorded rows takes a ``query``
function, ``query(sql, params=[...]) -> DataFrame`` (the CLI passes
:func:`goblin_assets.warehouse.db.query`, an asset its ``WarehouseResource.query``),
and the run ids to read: the CLI's ``--run-id``, or the ``run_id`` its
upstream recording assets reported (lineage).  Where no run id is given,
:func:`latest_run` is the one definition of "the latest run".  A miner that
makes its own data takes the run id to label its rows with (:func:`label`).

Outputs are frames: a :class:`Mined` holds the findings (``patterns`` rows)
and every frame to write (table -> rows); the caller writes them in one
transaction.  Nothing here opens the warehouse, and torch is imported only
when a miner runs.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from goblin_assets.errors import GoblinError
from goblin_assets.warehouse.storage import STORED_AS
from goblin_assets.warehouse.tables import columns

#: ``query(sql, params=[...])``: run SQL with ``?`` placeholders on the warehouse, rows as a DataFrame.
Query = Callable[..., pd.DataFrame]
#: A progress line sink (``print``-like): the CLI's console, an asset's ``context.log.info``.
Log = Callable[[str], None]

#: Sketch roles of matmul operands (read by :func:`mine` and :func:`plan`).
MATMUL_ROLES: tuple[str, ...] = ("lhs", "rhs", "out")
#: Sketch roles of softmax / top-k taps (read by :func:`infer`).
DYNAMICS_ROLES: tuple[str, ...] = ("probs", "route")
#: How to record rows the miners read, for error messages.
_RECORD_HINT = "record some first (goblin opscope sweep|seq|digits|minilm, or goblin audit)"


class MiningInputError(GoblinError):
    """The warehouse holds no rows for a miner (unknown run id, nothing recorded); the message names the fix."""


@dataclass
class Mined:
    """What one miner produced.

    Attributes
    ----------
    miner : the driver function's name (= the CLI verb).
    run_ids : the runs read (or, for a miner that makes its own data, the label of the rows it wrote).
    findings : ``patterns`` rows (what ``--json`` prints and the asset shows); for
        :func:`online_sketches`, one row per sketch that is not written to ``patterns``.
    frames : table -> rows to write, in one transaction (findings included where they are written).
    source : how the runs were chosen: ``given`` (run ids passed in), ``latest``
        (:func:`latest_run`) or ``made`` (the miner recorded or computed its own data).
    """

    miner: str
    run_ids: list[str]
    findings: pd.DataFrame
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    source: str = "given"

    @property
    def title(self) -> str:
        """``<miner>: <run ids>``, for a table title or a log line."""
        return f"{self.miner}: {', '.join(self.run_ids)}"

    def findings_json(self) -> list[dict]:
        """The findings as the ``--json`` contract: objects with site, role, finding, score, evidence, run_id."""
        return [{"run_id": r.run_id, "site": r.site, "role": r.role, "finding": r.finding, "score": float(r.score),
                 "evidence": json.loads(r.evidence_json)} for r in self.findings.itertuples()]


def label(miner: str, token: str | None = None) -> str:
    """A run id for rows a miner makes itself: ``<miner>-<8 chars of token>`` (default a fresh uuid4).

    Assets pass their Dagster run id as ``token``, so the rows name the run that made them.
    """
    return f"{miner}-{(token or uuid.uuid4().hex)[:8]}"


def _in(values: Sequence[str]) -> str:
    return ", ".join("?" for _ in values)


def latest_run(query: Query, table: str, where: str = "TRUE", params: Sequence | None = None) -> str:
    """The one definition of "the latest run" of ``table`` among its rows matching ``where``.

    The newest ``runs.created_at`` of the run when ``runs`` knows its id;
    runs that ``runs`` does not know (opscope recordings, audit sketch runs)
    come after those, by their newest insertion into ``table`` (DuckDB
    ``rowid`` of the table that stores it: ``sketch_stats`` for the view
    ``sketches``).  ``where`` is trusted SQL written here (``?`` placeholders
    bound to ``params``), never user input.

    Raises
    ------
    MiningInputError
        ``table`` has no rows matching ``where``.
    """
    stored = STORED_AS.get(table, table)   # a view (sketches over sketch_stats) has no rowid: its stored table's
    df = query(f"""
        WITH t AS (SELECT run_id, max(rowid) AS last_row FROM "{stored}" WHERE {where} GROUP BY run_id)
        SELECT t.run_id FROM t LEFT JOIN (SELECT run_id, max(created_at) AS created_at FROM runs GROUP BY run_id) r
        USING (run_id) ORDER BY r.created_at DESC NULLS LAST, t.last_row DESC LIMIT 1""", params=list(params or []))
    if df.empty:
        shown = where
        for v in params or []:
            shown = shown.replace("?", repr(v), 1)
        raise MiningInputError(f"table {table}: no recorded rows ({shown}); {_RECORD_HINT}")
    return str(df["run_id"].iat[0])


def resolve_runs(query: Query, table: str, run_ids: str | Sequence[str] | None = None,
                 roles: Sequence[str] = ()) -> tuple[list[str], str]:
    """The runs to read from ``table``: ``run_ids`` (each checked) or :func:`latest_run`; and ``given``/``latest``.

    ``roles`` (sketch roles) restricts both the check and the choice to rows of those roles.

    Raises
    ------
    MiningInputError
        A given run has no rows (of ``roles``) in ``table``, or none is given and the table has none.
    """
    where, params = (f"role IN ({_in(roles)})", list(roles)) if roles else ("TRUE", [])
    if run_ids is None:
        return [latest_run(query, table, where, params)], "latest"
    ids = [run_ids] if isinstance(run_ids, str) else list(dict.fromkeys(run_ids))
    if not ids:
        raise MiningInputError(f"table {table}: no run ids given to read")
    have = set(query(f'SELECT DISTINCT run_id FROM "{table}" WHERE run_id IN ({_in(ids)}) AND {where}',
                     params=[*ids, *params])["run_id"].astype(str))
    for rid in ids:
        if rid not in have:
            kind = f" of role {'/'.join(roles)}" if roles else ""
            raise MiningInputError(f"table {table}: no rows for run_id {rid!r}{kind}; list the recorded runs with "
                                   f"goblin sql \"SELECT DISTINCT run_id FROM {table}\", or {_RECORD_HINT}")
    return ids, "given"


def read_sketches(query: Query, run_ids: str | Sequence[str] | None,
                  roles: Sequence[str]) -> tuple[list[str], str, pd.DataFrame]:
    """The runs :func:`resolve_runs` picks among sketch rows of ``roles``, how, and every ``sketches`` row of them.

    Raises
    ------
    MiningInputError
        As :func:`resolve_runs`.
    """
    ids, source = resolve_runs(query, "sketches", run_ids, roles)
    return ids, source, query(f"SELECT * FROM sketches WHERE run_id IN ({_in(ids)})", params=ids)


def _say(log: Log | None, line: str) -> None:
    if log is not None:
        log(line)


# ------------------------------------------------------------------------- miners of recorded rows

def mine(query: Query, run_ids: str | Sequence[str] | None = None, sketches: pd.DataFrame | None = None,
         log: Log | None = None) -> Mined:
    """Mined patterns (sparse GEMM, int quantisation, LUT, delta, positional, stationarity) of matmul sketches.

    Reads the ``sketches`` rows (roles lhs/rhs/out) of ``run_ids`` (default
    :func:`latest_run`), or mines ``sketches`` given directly (rows just
    recorded; they are written too).  Thresholds: :mod:`goblin_assets.opscope.miner`.

    Raises
    ------
    MiningInputError
        Unknown run id, or no matmul sketches recorded.
    """
    from goblin_assets.opscope.miner import mine_patterns  # torch: imported when a miner runs

    frames: dict[str, pd.DataFrame] = {}
    if sketches is not None:
        ids, source = sorted(sketches["run_id"].astype(str).unique()), "made"
        frames["sketches"] = sketches
    else:
        ids, source, sketches = read_sketches(query, run_ids, MATMUL_ROLES)
    pat = mine_patterns(sketches)
    _say(log, f"mine: {len(pat)} findings over {pat['site'].nunique()} sites of {', '.join(ids)}")
    return Mined("mine", ids, pat, {**frames, "patterns": pat}, source)


def infer(query: Query, run_ids: str | Sequence[str] | None = None, token: str | None = None,
          log: Log | None = None) -> Mined:
    """Attention concentration, attention sinks and cold/hot experts of softmax / top-k sketches.

    Reads the ``probs`` / ``route`` rows of ``run_ids`` (default
    :func:`latest_run`).  With no run ids and none recorded, taps the packaged
    MiniLM (eager attention) on real text instead, labelled ``label("infer", token)``,
    and writes those sketch rows too.  Thresholds: :mod:`goblin_assets.opscope.infer`.

    Raises
    ------
    MiningInputError
        A given run has no probs/route rows.
    goblin_assets.opscope.inject.InjectionError
        The MiniLM fallback's correctness gate failed.
    """
    from goblin_assets.opscope.infer import infer_dynamics, record_minilm_attention

    frames: dict[str, pd.DataFrame] = {}
    try:
        ids, source, sk = read_sketches(query, run_ids, DYNAMICS_ROLES)
    except MiningInputError:
        if run_ids is not None:
            raise
        _say(log, "infer: no softmax/top-k sketches recorded: tapping MiniLM (eager attention) on real text")
        sk = frames["sketches"] = record_minilm_attention(run_id=label("infer", token))
        ids, source = [str(sk["run_id"].iat[0])], "made"
    pat = infer_dynamics(sk)
    _say(log, f"infer: {len(pat)} findings of {', '.join(ids)}")
    return Mined("infer", ids, pat, {**frames, "patterns": pat}, source)


def plan(query: Query, run_ids: str | Sequence[str] | None = None, measure: bool = True,
         log: Log | None = None, e2e: bool = False) -> Mined:
    """The actuation plan of recorded matmul sketches: exploit, guard, guard stability, speedups per site.

    Mines the runs' sketches (:func:`mine`'s rules), then plans each finding
    with an exploit (:func:`goblin_assets.opscope.plan.plan`); ``measure``
    runs the A/B micro-benchmarks (median of repeats; False: estimates only).
    ``e2e`` (with ``measure``): the kept candidates of runs of a packaged
    workload with an end-to-end model (``digits_mlp``, ``minilm_lora_cls``:
    :func:`goblin_assets.opscope.plan_e2e.workload_target`, built at its
    initial weights on its own data, sites resolved by name) are also timed on
    the whole forward and a training step
    (:func:`goblin_assets.opscope.plan_e2e.measure_e2e`), into ``evidence_json``;
    other runs' rows say why not.

    Raises
    ------
    MiningInputError
        Unknown run id, or no matmul sketches recorded.
    """
    from goblin_assets.opscope.miner import mine_patterns
    from goblin_assets.opscope.plan import plan as plan_sites
    from goblin_assets.opscope.plan import plan_findings

    ids, source, sk = read_sketches(query, run_ids, MATMUL_ROLES)
    found = mine_patterns(sk)
    _say(log, f"plan: {len(found)} findings over {found['site'].nunique()} sites of {', '.join(ids)}; "
              + ("guards and A/B micro-benchmarks (median of repeats) next" if measure else "estimates only"))
    pl = plan_sites(found, sk, measure=measure)
    if e2e and measure and not pl.empty:
        pl = _plan_e2e(pl, sk, log)
    pat = plan_findings(pl)
    _say(log, f"plan: {len(pl)} sites planned, {int(pl['measured_speedup'].notna().sum())} measured")
    return Mined("plan", ids, pat, {"plan": pl, "patterns": pat}, source)


def _plan_e2e(pl: pd.DataFrame, sk: pd.DataFrame, log: Log | None) -> pd.DataFrame:
    """:func:`plan`'s end-to-end step, per run: the workload's model when there is one, else a reason per row."""
    from goblin_assets.opscope.plan_e2e import measure_e2e, workload_target

    parts = []
    for (run_id, workload), rows in pl.groupby(["run_id", "workload"], sort=False):
        if workload not in ("digits_mlp", "minilm_lora_cls"):
            reason = f"no end-to-end model for workload {workload!r} (known: digits_mlp, minilm_lora_cls)"
            rows = rows.assign(evidence_json=[json.dumps({**json.loads(e), "e2e_not_measured": reason})
                                              for e in rows["evidence_json"]])
            parts.append(rows)
            continue
        _say(log, f"plan: {run_id}: timing the kept candidates on the {workload} forward and training step")
        done, _ = measure_e2e(rows, workload_target(workload), sk[sk["run_id"] == run_id], log=log)
        parts.append(done)
    return pd.concat(parts).loc[pl.index]


def roofline(query: Query, run_id: str | None = None, trace: str | Path | None = None, token: str | None = None,
             log: Log | None = None) -> Mined:
    """Roofline of a run's GEMMs (FLOPs, bytes by real dtype, intensity, bound per device) and its hot shapes.

    The trace: ``trace`` if given (rows labelled ``run_id``, else
    ``label("roofline", token)``); else the Chrome trace of run ``run_id`` in
    ``runs`` (default: :func:`latest_run` among runs with a trace); with
    neither and no profiled run, one MiniLM forward on real text is profiled
    into ``$GOBLIN_HOME/traces/``.  Peaks: :data:`goblin_assets.runners.peaks.PEAKS`.

    Raises
    ------
    MiningInputError
        ``run_id`` has no run with a trace in ``runs``.
    goblin_assets.opscope.roofline.TraceShapeError
        The trace is unreadable or was recorded without shapes.
    """
    from goblin_assets import goblin_home
    from goblin_assets.opscope import roofline as rl

    workload, source = "trace", "given"
    if trace is None and run_id is None:
        try:
            run_id, source = latest_run(query, "runs", "trace_path IS NOT NULL"), "latest"
        except MiningInputError:
            _say(log, "roofline: no profiled run with a trace: profiling one MiniLM forward on real text")
            run_id, workload, source = label("roofline", token), "minilm", "made"
            trace = rl.profile_minilm_trace(goblin_home() / "traces" / f"{run_id}.json")
    if trace is None:
        row = query("SELECT workload, trace_path FROM runs WHERE run_id = ? AND trace_path IS NOT NULL "
                    "ORDER BY created_at DESC LIMIT 1", params=[run_id])
        if row.empty:
            raise MiningInputError(f"table runs: no run {run_id!r} with a trace; list them with goblin sql "
                                   f"\"SELECT run_id FROM runs WHERE trace_path IS NOT NULL\", or pass a trace file")
        workload, trace = str(row["workload"].iat[0]), str(row["trace_path"].iat[0])
    run_id = run_id or label("roofline", token)
    gemms, gpu = rl.trace_gemms(trace)
    roof = rl.roofline(gemms, run_id=run_id, source=str(trace))
    pat = rl.roofline_findings(roof, rl.run_device_name(gpu), run_id=run_id, workload=workload)
    _say(log, f"roofline: {len(gemms)} GEMM calls, {len(pat)} shapes of {run_id} ({trace})")
    return Mined("roofline", [run_id], pat, {"roofline": roof, "patterns": pat}, source)


# ------------------------------------------------------------------------- miners that make their own data

def probes(run_id: str, file: str | Path | None = None, dump: str | Path | None = None,
           log: Log | None = None) -> Mined:
    """Host probes (2:4, cardinality, effective/stable rank, 3/4/6/8-bit quantisation error) on real tensors.

    The tensors of a safetensors ``file`` (workload ``dump``), else the
    packaged MiniLM's weights and activations (workload ``minilm``); ``dump``
    also saves them to a safetensors file.  Rows are labelled ``run_id``.
    Thresholds: :mod:`goblin_assets.opscope.probe`.

    Raises
    ------
    goblin_assets.opscope.probe.ProbeError
        ``file`` cannot be read, or ``dump`` cannot be written.
    """
    from goblin_assets.opscope.probe import (
        load_tensor,
        minilm_tensors,
        probe_findings,
        probe_frame,
        probe_tensors,
        save_tensor,
    )

    if file:
        tensors = load_tensor(file)
    else:
        _say(log, "probes: probing the packaged MiniLM's real weights and activations")
        tensors = minilm_tensors()
    if dump:
        save_tensor(dump, tensors)
        _say(log, f"probes: tensors dumped to {dump}")
    results = probe_tensors(tensors)
    pat = probe_findings(results, run_id=run_id, workload="dump" if file else "minilm")
    return Mined("probes", [run_id], pat, {"probes": probe_frame(results, run_id), "patterns": pat}, "made")


def dataflow(run_id: str, file: str | Path | None = None, log: Log | None = None) -> Mined:
    """Repeated dataflow sub-DAGs (merkle cones grown in lockstep) named as fusion candidates.

    The graph: an edge-list ``file`` (format: :mod:`goblin_assets.opscope.dataflow`;
    workload = the file name), else the packaged MiniLM exported with
    ``torch.export`` on real text (workload ``minilm``).  Rows are labelled ``run_id``.

    Raises
    ------
    goblin_assets.opscope.dataflow.GraphFormatError
        ``file`` is missing or malformed.
    """
    from goblin_assets.opscope.dataflow import dataflow as cones
    from goblin_assets.opscope.dataflow import dataflow_findings, graph, minilm_graph

    if file:
        g, workload = graph(file), str(file)
    else:
        _say(log, "dataflow: exporting the packaged MiniLM (torch.export) on real text")
        g, workload = minilm_graph(), "minilm"
    pat = dataflow_findings(cones(g), run_id=run_id, workload=workload)
    return Mined("dataflow", [run_id], pat, {"patterns": pat}, "made")


def online_sketches(run_id: str, requests: int = 4, per_request: int = 8, seed: int = 0,
                    log: Log | None = None) -> Mined:
    """Bounded one-pass recorders (Apache DataSketches KLL, HLL, var-opt) of MiniLM's FFN input activations.

    ``requests`` sampled requests of ``per_request`` standard-library
    docstrings each stream through the packaged MiniLM; every FFN linear's
    input feeds one recorder per site (:func:`goblin_assets.opscope.online.record_online`).
    ``findings`` lists one row per sketch (finding ``online_sketch``, score = values
    seen, evidence = its summary); only ``online_sketches`` rows are written.
    """
    from goblin_assets.opscope.infer import stdlib_texts
    from goblin_assets.opscope.online import record_online
    from goblin_assets.opscope.probe import minilm_tensors

    streams: dict[str, list] = {}
    pool = stdlib_texts(requests * per_request)
    for req in range(requests):
        for name, t in minilm_tensors(pool[req * per_request:(req + 1) * per_request]).items():
            if name.endswith(".input"):
                streams.setdefault(name, []).append(t)
    rows = record_online(streams, run_id=run_id, seed=seed)
    _say(log, f"online_sketches: {len(streams)} sites x {requests} requests")
    found = pd.DataFrame([{"run_id": r.run_id, "workload": "minilm", "site": r.name, "role": r.kind,
                           "finding": "online_sketch", "score": float(r.n), "evidence_json": r.summary_json}
                          for r in rows.itertuples()], columns=columns("patterns"))
    return Mined("online_sketches", [run_id], found, {"online_sketches": rows}, "made")
