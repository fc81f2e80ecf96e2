"""Warehouse tables: one declaration gives both the DuckDB DDL and the pandera schema.

Each table is a list of ``(column, duckdb_type, nullable)``; :func:`schema`
builds the pandera ``DataFrameSchema`` every frame is validated against before
it is written, and :func:`ddl` the ``CREATE TABLE`` statement.

Text columns are Arrow strings (:data:`TEXT`), not Python ``str`` objects:
pandera checks an object column's type element by element (one Python call
per cell, ~0.13 of DuckDB's raw Arrow ingest rate on tidy sketch rows), while
an Arrow string column is checked by its dtype, checked with Arrow kernels
(``isin``, ``isna``) and handed to DuckDB without conversion (measured with
``benchmarks/ingest_rate.py``).  Writers that build large frames emit
:data:`TEXT` columns directly (:func:`goblin_assets.warehouse.frames.text`);
small frames of Python strings are coerced by the schema.

A table may be *stored* in another layout than the tidy one declared here:
``sketches`` is written and validated tidy, stored as one row per tensor and
statistic with the values as lists (``sketch_stats``), and read through a view
named ``sketches`` with exactly these columns
(:mod:`goblin_assets.warehouse.storage`).  :func:`ddl` of such a table is its
tidy ``CREATE TABLE``: the layout warehouses had before, which
:func:`goblin_assets.warehouse.db.ensure_tables` migrates.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow

#: pandas dtype of every VARCHAR column: Arrow-backed strings (nulls allowed where the column is nullable).
TEXT = pd.ArrowDtype(pyarrow.string())

#: DuckDB type -> pandas dtype of the validated frame
_PA_TYPES = {
    "VARCHAR": TEXT,
    "DOUBLE": np.dtype("float64"),
    "BIGINT": np.dtype("int64"),
    "INTEGER": np.dtype("int64"),
    "BOOLEAN": np.dtype("bool"),
    "TIMESTAMP": np.dtype("datetime64[ns]"),
}

TABLES: dict[str, list[tuple[str, str, bool]]] = {
    "configs": [
        ("audit_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("field", "VARCHAR", False),
        ("value_json", "VARCHAR", False), ("status", "VARCHAR", False), ("file", "VARCHAR", True),
        ("line", "BIGINT", True), ("key", "VARCHAR", True), ("detail", "VARCHAR", False),
        ("source_format", "VARCHAR", False),
    ],
    # the settings the program ran with, per field (issue 27; config/observed.py), beside the file's value
    "observed_settings": [
        ("audit_id", "VARCHAR", False), ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False),
        ("field", "VARCHAR", False), ("value_json", "VARCHAR", False), ("parsed_value_json", "VARCHAR", False),
        ("status", "VARCHAR", False), ("parsed_status", "VARCHAR", False), ("file", "VARCHAR", True),
        ("line", "BIGINT", True), ("key", "VARCHAR", True), ("detail", "VARCHAR", False),
        ("agrees", "BOOLEAN", False),
        # added after the first warehouses (ADDED_COLUMNS): for a field that disagrees, the statement of the
        # program that sets the run's value (``file:line: text``, NULL when none was found: an argument, a value
        # computed at run time) and whether the patch writer can edit it (NULL for a field that agrees)
        ("set_at", "VARCHAR", True), ("patchable", "BOOLEAN", True),
    ],
    "audits": [
        ("audit_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("created_at", "TIMESTAMP", False),
        ("profile_run_id", "VARCHAR", False), ("baseline_run_id", "VARCHAR", True),
        ("patched_run_id", "VARCHAR", True), ("baseline_throughput_per_s", "DOUBLE", True),
        ("patched_throughput_per_s", "DOUBLE", True), ("unit", "VARCHAR", False),
        ("measured_speedup", "DOUBLE", True), ("predicted_speedup_low", "DOUBLE", True),
        ("predicted_speedup_high", "DOUBLE", True), ("confidence", "DOUBLE", True),
        ("rules", "VARCHAR", False), ("diff", "VARCHAR", False), ("report_path", "VARCHAR", True),
        # added after the first warehouses (ADDED_COLUMNS): the measured speedup's interval, and the
        # prediction scaled by the rules' measured record (measure/benchmark.py, measure/calibration.py)
        ("speedup_low", "DOUBLE", True), ("speedup_high", "DOUBLE", True), ("speedup_level", "DOUBLE", True),
        ("speedup_pairs", "BIGINT", True), ("speedup_verdict", "VARCHAR", True),
        ("calibrated_speedup_low", "DOUBLE", True), ("calibrated_speedup_high", "DOUBLE", True),
        ("calibrated_confidence", "DOUBLE", True), ("calibration_audits", "BIGINT", True),
        # the verdict (report/verdict.py): its kind, whether the run was healthy, whether the patch is offered
        ("verdict", "VARCHAR", True), ("healthy", "BOOLEAN", True), ("patch_offered", "BOOLEAN", True),
        # the pairs' sign test beside the interval, and the measurement's time against its budget
        ("speedup_pairs_faster", "BIGINT", True), ("speedup_pairs_slower", "BIGINT", True),
        ("speedup_sign_test_p", "DOUBLE", True), ("speedup_budget_s", "DOUBLE", True),
        ("speedup_elapsed_s", "DOUBLE", True),
    ],
    "runs": [
        ("run_id", "VARCHAR", False), ("audit_id", "VARCHAR", True), ("workload", "VARCHAR", False),
        ("label", "VARCHAR", False), ("created_at", "TIMESTAMP", False), ("ok", "BOOLEAN", False),
        ("provenance", "VARCHAR", False), ("device", "VARCHAR", False), ("torch_version", "VARCHAR", True),
        ("steps", "BIGINT", False), ("step_time_s", "DOUBLE", True), ("samples_per_sec", "DOUBLE", True),
        ("tokens_per_sec", "DOUBLE", True), ("mfu_pct", "DOUBLE", True), ("mem_peak_gb", "DOUBLE", True),
        ("util_pct", "DOUBLE", True), ("trace_path", "VARCHAR", True), ("metrics_json", "VARCHAR", False),
    ],
    "kernels": [
        ("run_id", "VARCHAR", False), ("rank", "BIGINT", False), ("name", "VARCHAR", False),
        ("pct_time", "DOUBLE", False),
    ],
    "waste_budget": [
        ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("label", "VARCHAR", False),
        ("bucket", "VARCHAR", False), ("time_per_step_s", "DOUBLE", False), ("share", "DOUBLE", False),
        ("status", "VARCHAR", False), ("note", "VARCHAR", False),
    ],
    "sketches": [
        ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("model", "VARCHAR", False),
        ("step", "BIGINT", False), ("backend", "VARCHAR", False), ("dist", "VARCHAR", False),
        ("M", "BIGINT", False), ("K", "BIGINT", False), ("N", "BIGINT", False), ("numel", "BIGINT", False),
        ("site", "VARCHAR", False), ("role", "VARCHAR", False), ("stat", "VARCHAR", False),
        ("idx", "BIGINT", False), ("value", "DOUBLE", True),
    ],
    "patterns": [
        ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("site", "VARCHAR", False),
        ("role", "VARCHAR", False), ("finding", "VARCHAR", False), ("score", "DOUBLE", False),
        ("evidence_json", "VARCHAR", False),
    ],
    "kb_matches": [
        ("audit_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("rule_id", "VARCHAR", False),
        ("fired", "BOOLEAN", False), ("detect_score", "DOUBLE", False), ("retrieval_score", "DOUBLE", True),
        ("reason", "VARCHAR", False), ("evidence_json", "VARCHAR", False),
    ],
    "kb_embeddings": [
        ("kb_sha256", "VARCHAR", False), ("model", "VARCHAR", False), ("rule_id", "VARCHAR", False),
        ("rule_pos", "BIGINT", False), ("text", "VARCHAR", False), ("dim", "BIGINT", False),
        ("embedding_json", "VARCHAR", False), ("created_at", "TIMESTAMP", False),
    ],
    "benchmarks": [
        ("audit_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("label", "VARCHAR", False),
        ("repeat", "BIGINT", False), ("throughput_per_s", "DOUBLE", False), ("unit", "VARCHAR", False),
        ("median_per_s", "DOUBLE", False), ("spread_per_s", "DOUBLE", False), ("steps", "BIGINT", False),
        ("cache_key", "VARCHAR", False), ("cache_hit", "BOOLEAN", False), ("provenance", "VARCHAR", False),
    ],
    # ---- recorded traces (goblin_assets/trace/): one row set per analysis, keyed by trace_id
    "trace_runs": [
        ("trace_id", "VARCHAR", False), ("audit_id", "VARCHAR", True), ("created_at", "TIMESTAMP", False),
        ("path", "VARCHAR", False), ("source_format", "VARCHAR", False), ("device", "VARCHAR", True),
        ("steps", "BIGINT", False), ("device_events", "BIGINT", False), ("elapsed_s", "DOUBLE", False),
        ("flags_json", "VARCHAR", False), ("not_observable_json", "VARCHAR", False),
    ],
    "trace_temporal": [
        ("trace_id", "VARCHAR", False), ("timing", "VARCHAR", False), ("device", "BIGINT", True), ("idle_time_us", "DOUBLE", False),
        ("compute_time_us", "DOUBLE", False), ("non_compute_time_us", "DOUBLE", False),
        ("kernel_time_us", "DOUBLE", False), ("idle_time_pct", "DOUBLE", True), ("compute_time_pct", "DOUBLE", True),
        ("non_compute_time_pct", "DOUBLE", True),
    ],
    "trace_idle": [
        ("trace_id", "VARCHAR", False), ("device", "BIGINT", True), ("stream", "BIGINT", True),
        ("host_wait_us", "DOUBLE", False), ("kernel_wait_us", "DOUBLE", False), ("other_wait_us", "DOUBLE", False),
        ("idle_us", "DOUBLE", False), ("host_wait_pct", "DOUBLE", True), ("kernel_wait_pct", "DOUBLE", True),
        ("other_wait_pct", "DOUBLE", True),
    ],
    "trace_kernel_categories": [
        ("trace_id", "VARCHAR", False), ("category", "VARCHAR", False), ("group", "VARCHAR", False),
        ("count", "BIGINT", False), ("total_us", "DOUBLE", False), ("mean_us", "DOUBLE", False),
        ("share_pct", "DOUBLE", False),
    ],
    "trace_launch": [
        ("trace_id", "VARCHAR", False), ("correlation", "BIGINT", True), ("api", "VARCHAR", True),
        ("name", "VARCHAR", False), ("device", "BIGINT", True), ("stream", "BIGINT", True),
        ("launch_ts_us", "DOUBLE", True), ("cpu_launch_us", "DOUBLE", True), ("gpu_dur_us", "DOUBLE", True),
        ("launch_delay_us", "DOUBLE", True),
    ],
    "trace_short_kernels": [
        ("trace_id", "VARCHAR", False), ("name", "VARCHAR", False), ("category", "VARCHAR", False),
        ("count", "BIGINT", False), ("total_us", "DOUBLE", False), ("mean_us", "DOUBLE", False),
        ("share_pct", "DOUBLE", False),
    ],
    "trace_ops": [
        ("trace_id", "VARCHAR", False), ("op", "VARCHAR", False), ("kind", "VARCHAR", False),
        ("input_dims", "VARCHAR", True), ("dtype", "VARCHAR", True), ("count", "BIGINT", False),
        ("gpu_time_us", "DOUBLE", True), ("flops", "DOUBLE", True), ("bytes", "DOUBLE", True),
        ("arithmetic_intensity_flop_per_byte", "DOUBLE", True), ("achieved_tflops", "DOUBLE", True),
        ("peak_tflops", "DOUBLE", True), ("pct_of_peak", "DOUBLE", True), ("bound", "VARCHAR", True),
        ("status", "VARCHAR", False),
    ],
    "trace_recompute": [
        ("trace_id", "VARCHAR", False), ("step", "BIGINT", False), ("step_us", "DOUBLE", False),
        ("recompute_us", "DOUBLE", False), ("recompute_pct", "DOUBLE", False), ("recompute_ops", "BIGINT", False),
        ("method", "VARCHAR", False), ("severity", "VARCHAR", False),
    ],
    "trace_critical_path": [
        ("trace_id", "VARCHAR", False), ("step", "BIGINT", False), ("window_us", "DOUBLE", False),
        ("device_busy_us", "DOUBLE", False), ("device_idle_us", "DOUBLE", False), ("host_busy_us", "DOUBLE", False),
        ("sync_wait_us", "DOUBLE", False), ("loader_wait_us", "DOUBLE", False),
        ("idle_after_sync_us", "DOUBLE", False), ("idle_loader_us", "DOUBLE", False),
        ("idle_launch_us", "DOUBLE", False), ("verdict", "VARCHAR", False), ("ops_on_path", "VARCHAR", False),
    ],
    "trace_sync_root_causes": [
        ("trace_id", "VARCHAR", False), ("step", "BIGINT", False), ("gap_start_us", "DOUBLE", False),
        ("gap_us", "DOUBLE", False), ("sync_call", "VARCHAR", False), ("sync_ts_us", "DOUBLE", False),
        ("sync_us", "DOUBLE", False), ("python_frame", "VARCHAR", True), ("cpu_op", "VARCHAR", True),
    ],
    # the ranks of one job (goblin trace DIR; trace_id is the job's): trace/ranks.py
    "trace_ranks": [
        ("trace_id", "VARCHAR", False), ("rank", "BIGINT", False), ("file", "VARCHAR", False),
        ("device", "VARCHAR", True), ("backend", "VARCHAR", True), ("steps", "BIGINT", False),
        ("step_us", "DOUBLE", False), ("compute_us", "DOUBLE", False), ("collective_us", "DOUBLE", False),
        ("collective_wait_us", "DOUBLE", False), ("loader_us", "DOUBLE", False), ("host_us", "DOUBLE", False),
        ("idle_us", "DOUBLE", False), ("straggler", "BOOLEAN", False), ("cause", "VARCHAR", True),
    ],
    "trace_collectives": [
        ("trace_id", "VARCHAR", False), ("seq", "BIGINT", False), ("collective", "VARCHAR", False),
        ("step", "BIGINT", False), ("ranks", "BIGINT", False), ("size_bytes", "DOUBLE", True),
        ("dtype", "VARCHAR", True), ("group_size", "BIGINT", False), ("latency_us", "DOUBLE", False),
        ("max_dur_us", "DOUBLE", False), ("skew_us", "DOUBLE", False), ("first_rank", "BIGINT", False),
        ("last_rank", "BIGINT", False), ("algbw_GBps", "DOUBLE", True), ("busbw_GBps", "DOUBLE", True),
        ("link_peak_GBps", "DOUBLE", True), ("busbw_pct_of_link", "DOUBLE", True),
        ("bandwidth_status", "VARCHAR", False), ("per_rank", "VARCHAR", False),
    ],
    # every profiled step of one trace, outliers past 1.5x the median marked: trace/steps.py
    "trace_steps": [
        ("trace_id", "VARCHAR", False), ("step", "BIGINT", False), ("start_us", "DOUBLE", False),
        ("step_us", "DOUBLE", False), ("ratio_to_median", "DOUBLE", False), ("outlier", "BOOLEAN", False),
        ("cause", "VARCHAR", True), ("compute_us", "DOUBLE", False), ("loader_us", "DOUBLE", False),
        ("sync_us", "DOUBLE", False), ("collective_us", "DOUBLE", False), ("host_us", "DOUBLE", False),
        ("top_ops", "VARCHAR", False), ("events", "VARCHAR", False),
    ],
    "trace_findings": [
        ("trace_id", "VARCHAR", False), ("analysis", "VARCHAR", False), ("kind", "VARCHAR", False),
        ("severity", "VARCHAR", False), ("message", "VARCHAR", False), ("value", "DOUBLE", True),
        ("unit", "VARCHAR", False), ("threshold", "VARCHAR", False), ("threshold_source", "VARCHAR", False),
        ("status", "VARCHAR", False), ("evidence_json", "VARCHAR", False),
    ],
    # ---- memory snapshots (goblin_assets/trace/memory_snapshot.py): keyed by snapshot_id, sizes in bytes
    "memory_snapshots": [
        ("snapshot_id", "VARCHAR", False), ("created_at", "TIMESTAMP", False), ("path", "VARCHAR", False),
        ("origin", "VARCHAR", False), ("segments", "BIGINT", False), ("reserved_bytes", "BIGINT", False),
        ("allocated_bytes", "BIGINT", False), ("active_bytes", "BIGINT", False),
        ("reserved_minus_allocated_bytes", "BIGINT", False), ("free_internal_bytes", "BIGINT", False),
        ("free_external_bytes", "BIGINT", False), ("largest_free_block_bytes", "BIGINT", False),
        ("oom_events", "BIGINT", False), ("trace_entries", "BIGINT", False), ("oom_request_bytes", "BIGINT", True),
        ("oom_device_free_bytes", "BIGINT", True), ("diagnosis", "VARCHAR", False),
    ],
    "memory_snapshot_segments": [
        ("snapshot_id", "VARCHAR", False), ("segment", "BIGINT", False), ("device", "BIGINT", True),
        ("stream", "BIGINT", True), ("segment_type", "VARCHAR", True), ("total_size_bytes", "BIGINT", False),
        ("allocated_bytes", "BIGINT", False), ("active_bytes", "BIGINT", False), ("free_bytes", "BIGINT", False),
        ("largest_free_block_bytes", "BIGINT", False), ("blocks", "BIGINT", False),
        ("fits_failed_request", "BOOLEAN", True),
    ],
    "memory_snapshot_frames": [
        ("snapshot_id", "VARCHAR", False), ("frame", "VARCHAR", False), ("category", "VARCHAR", False),
        ("category_source", "VARCHAR", False), ("live_bytes", "BIGINT", False), ("blocks", "BIGINT", False),
    ],
    "memory_snapshot_events": [
        ("snapshot_id", "VARCHAR", False), ("device", "BIGINT", False), ("event_index", "BIGINT", False),
        ("action", "VARCHAR", False), ("size_bytes", "BIGINT", True), ("allocated_bytes", "BIGINT", False),
        ("reserved_bytes", "BIGINT", False), ("time_us", "DOUBLE", True), ("frame", "VARCHAR", False),
    ],
}

#: Extra checks per (table, column) beyond type and nullability.
_CHECKS: dict[tuple[str, str], list[pa.Check]] = {
    ("configs", "status"): [pa.Check.isin(["literal", "default", "variable", "env", "inferred", "unset",
                                           "observed"])],
    ("runs", "provenance"): [pa.Check.isin(["measured", "replayed", "modelled"])],
    ("waste_budget", "status"): [pa.Check.isin(["measured", "estimated", "not_observable"])],
    ("waste_budget", "time_per_step_s"): [pa.Check.ge(0)],
    ("waste_budget", "share"): [pa.Check.in_range(0, 1)],
    ("sketches", "role"): [pa.Check.isin(["lhs", "rhs", "out", "probs", "route"])],
    ("sketches", "numel"): [pa.Check.ge(0)],
    ("kernels", "pct_time"): [pa.Check.in_range(0, 100)],
    ("trace_findings", "severity"): [pa.Check.isin(["ok", "moderate", "high"])],
    ("trace_findings", "status"): [pa.Check.isin(["measured", "estimated", "not_observable"])],
    ("trace_critical_path", "verdict"): [pa.Check.isin(["cpu_launch_bound", "sync_bound", "loader_bound",
                                                         "device_bound"])],
    ("trace_kernel_categories", "share_pct"): [pa.Check.in_range(0, 100)],
    ("memory_snapshot_frames", "category_source"): [pa.Check.isin(["recorded", "estimated"])],
    ("memory_snapshot_frames", "live_bytes"): [pa.Check.ge(0)],
    ("benchmarks", "throughput_per_s"): [pa.Check.gt(0)],
    ("benchmarks", "label"): [pa.Check.isin(["baseline", "patched"])],
    ("audits", "speedup_verdict"): [pa.Check.isin(["faster", "slower", "no significant change", "no interval"])],
    ("audits", "speedup_level"): [pa.Check.in_range(0, 1, include_min=False, include_max=False)],
    ("audits", "speedup_pairs"): [pa.Check.ge(1)],
    ("audits", "calibration_audits"): [pa.Check.ge(0)],
    # report/verdict.py Kind (tests/test_warehouse.py checks they agree)
    ("audits", "verdict"): [pa.Check.isin(["failed", "hung", "unhealthy", "hazard", "faster", "slower",
                                           "no significant change", "no patch", "not measured"])],
    ("audits", "speedup_pairs_faster"): [pa.Check.ge(0)],
    ("audits", "speedup_pairs_slower"): [pa.Check.ge(0)],
    ("audits", "speedup_sign_test_p"): [pa.Check.in_range(0, 1)],
    ("audits", "speedup_budget_s"): [pa.Check.gt(0)],
    ("audits", "speedup_elapsed_s"): [pa.Check.ge(0)],
}


def schema(table: str, coerce: frozenset[str] | None = None) -> pa.DataFrameSchema:
    """The pandera schema of ``table`` (strict and ordered: no missing, extra or reordered columns).

    ``coerce``: the columns converted to their dtype (:func:`dtypes`) before
    they are checked; ``None`` (default) coerces every column.  A column that
    already has its dtype needs no coercion (pandera's would only copy it):
    :func:`goblin_assets.warehouse.db.validate` passes the others only.
    Schemas are built once per ``(table, coerce)`` and shared: do not mutate one.

    Raises
    ------
    KeyError
        Unknown table.
    """
    return _schema(table, frozenset(columns(table)) if coerce is None else frozenset(coerce))


def _dtype(typ: str, nullable: bool):
    """pandas dtype of a column: a nullable integer column is pandas' ``Int64`` (numpy int64 has no null)."""
    return pd.Int64Dtype() if nullable and typ in ("BIGINT", "INTEGER") else _PA_TYPES[typ]


@functools.lru_cache(maxsize=256)
def _schema(table: str, coerce: frozenset[str]) -> pa.DataFrameSchema:
    cols = {
        name: pa.Column(_dtype(typ, nullable), nullable=nullable, checks=_CHECKS.get((table, name), []),
                        coerce=name in coerce)
        for name, typ, nullable in TABLES[table]
    }
    return pa.DataFrameSchema(cols, strict=True, ordered=True, name=table)


def dtypes(table: str) -> dict[str, object]:
    """Column -> the pandas dtype it has after validation (:data:`TEXT` for VARCHAR).

    Raises
    ------
    KeyError
        Unknown table.
    """
    return {name: _dtype(typ, nullable) for name, typ, nullable in TABLES[table]}


#: Non-finite values are data where a column holds measured tensor statistics (``sketches.value``: the
#: sketches of a diverged run, opscope/sketches.py).  ``+inf``/``-inf`` are read as they are; a NaN is
#: read as NULL: pandas NaN becomes NULL on its way through Arrow (``pa.Table.from_pandas``) and DuckDB's
#: pandas scan alike, so these columns are nullable and NULL there *means NaN* (the ``nonfinite`` statistic
#: of the same tensor counts them).  The ``sketch_stats`` lists behind the ``sketches`` view hold the NaN
#: itself; the view reads it as NULL (warehouse/storage.py).  ``(table, column)``; an old tidy table
#: created while the column was ``NOT NULL`` needs ``ALTER TABLE ... ALTER COLUMN ... DROP NOT NULL``
#: (:func:`relax_not_null`) before it is migrated.
NAN_AS_NULL: tuple[tuple[str, str], ...] = (("sketches", "value"),)


def relax_not_null(have_not_null: set[tuple[str, str]]) -> list[str]:
    """``ALTER TABLE`` statements that drop ``NOT NULL`` from the :data:`NAN_AS_NULL` columns that still have it.

    ``have_not_null``: the ``(table, column)`` pairs an existing warehouse
    declares ``NOT NULL`` (``information_schema.columns.is_nullable = 'NO'``).
    Rows are kept; only the constraint goes.
    """
    return [f'ALTER TABLE "{t}" ALTER COLUMN "{c}" DROP NOT NULL' for t, c in NAN_AS_NULL if (t, c) in have_not_null]


#: Columns renamed since a warehouse may have been created: ``(table, old name, new name)``, applied in
#: place by :func:`goblin_assets.warehouse.db.ensure_tables` (names gained their unit suffix; docs/naming.md).
RENAMED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("waste_budget", "seconds", "time_per_step_s"),
    ("benchmarks", "throughput", "throughput_per_s"),
    ("benchmarks", "median", "median_per_s"),
    ("benchmarks", "spread", "spread_per_s"),
    ("audits", "baseline_throughput", "baseline_throughput_per_s"),
    ("audits", "patched_throughput", "patched_throughput_per_s"),
)


#: Columns added since a warehouse may have been created: ``(table, column)``, in declaration order (each is
#: the last columns of its table in :data:`TABLES`).  :func:`goblin_assets.warehouse.db.ensure_tables` adds
#: the ones an existing table lacks (``ALTER TABLE ... ADD COLUMN``, type from :data:`TABLES`); old rows get
#: NULL, so every added column must be nullable (checked when this module is imported).
ADDED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("audits", "speedup_low"), ("audits", "speedup_high"), ("audits", "speedup_level"), ("audits", "speedup_pairs"),
    ("audits", "speedup_verdict"), ("audits", "calibrated_speedup_low"), ("audits", "calibrated_speedup_high"),
    ("audits", "calibrated_confidence"), ("audits", "calibration_audits"),
    ("audits", "verdict"), ("audits", "healthy"), ("audits", "patch_offered"),
    ("audits", "speedup_pairs_faster"), ("audits", "speedup_pairs_slower"), ("audits", "speedup_sign_test_p"),
    ("audits", "speedup_budget_s"), ("audits", "speedup_elapsed_s"),
    ("observed_settings", "set_at"), ("observed_settings", "patchable"),
)


def column_type(table: str, column: str) -> tuple[str, bool]:
    """``(duckdb type, nullable)`` of one column.  Raises KeyError for an unknown table or column."""
    for name, typ, nullable in TABLES[table]:
        if name == column:
            return typ, nullable
    raise KeyError(f"{table}.{column}")


def ddl(table: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``table``, tidy as declared.

    For a table stored in another layout (``sketches``,
    :data:`goblin_assets.warehouse.storage.STORED_AS`) the warehouse does not
    run this: it creates the physical table and the view
    (:func:`goblin_assets.warehouse.db.ensure_tables`); this statement is the
    tidy layout of older warehouses (what the migration reads, and the
    "before" of ``benchmarks/ingest_rate.py``).
    """
    cols = ", ".join(f'"{n}" {t}{"" if nullable else " NOT NULL"}' for n, t, nullable in TABLES[table])
    return f'CREATE TABLE IF NOT EXISTS "{table}" ({cols})'


def columns(table: str) -> list[str]:
    """Column names of ``table`` in DDL order (``KeyError`` for an unknown table)."""
    return [c for c, _, _ in TABLES[table]]


# --- opscope mining outputs (issue 7); findings themselves go to ``patterns`` ---
TABLES.update({
    "probes": [
        ("run_id", "VARCHAR", False), ("tensor", "VARCHAR", False), ("shape", "VARCHAR", False),
        ("dtype", "VARCHAR", False), ("probe", "VARCHAR", False), ("metric", "VARCHAR", False),
        ("value", "DOUBLE", False),
    ],
    "roofline": [
        ("run_id", "VARCHAR", False), ("source", "VARCHAR", False), ("op", "VARCHAR", False),
        ("batch", "BIGINT", False), ("M", "BIGINT", False), ("K", "BIGINT", False), ("N", "BIGINT", False),
        ("dtype", "VARCHAR", False), ("count", "BIGINT", False), ("flops", "DOUBLE", False),
        ("bytes", "DOUBLE", False), ("intensity_flop_per_byte", "DOUBLE", False), ("dur_us", "DOUBLE", True),
        ("achieved_tflops", "DOUBLE", True), ("device", "VARCHAR", False),
        ("ridge_flop_per_byte", "DOUBLE", False), ("bound", "VARCHAR", False), ("peak_source", "VARCHAR", False),
    ],
    "plan": [
        ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("site", "VARCHAR", False),
        ("role", "VARCHAR", False), ("finding", "VARCHAR", False), ("exploit", "VARCHAR", False),
        ("guard", "VARCHAR", False), ("guard_stat", "VARCHAR", False), ("guard_mean", "DOUBLE", True),
        ("guard_sigma", "DOUBLE", True), ("guard_stable", "BOOLEAN", True), ("est_speedup", "DOUBLE", True),
        ("measured_speedup", "DOUBLE", True), ("dense_median_s", "DOUBLE", True),
        ("special_median_s", "DOUBLE", True), ("repeats", "BIGINT", False), ("M", "BIGINT", False),
        ("K", "BIGINT", False), ("N", "BIGINT", False), ("device", "VARCHAR", False),
        ("provenance", "VARCHAR", False), ("evidence_json", "VARCHAR", False),
    ],
    "online_sketches": [
        ("run_id", "VARCHAR", False), ("name", "VARCHAR", False), ("kind", "VARCHAR", False),
        ("seed", "BIGINT", False), ("n", "BIGINT", False), ("k", "BIGINT", False),
        ("blob_b64", "VARCHAR", False), ("summary_json", "VARCHAR", False),
    ],
})
_CHECKS.update({
    ("roofline", "bound"): [pa.Check.isin(["compute", "memory"])],
    ("plan", "provenance"): [pa.Check.isin(["measured", "estimated"])],
    ("plan", "measured_speedup"): [pa.Check.gt(0)],
    ("online_sketches", "kind"): [pa.Check.isin(["kll", "hll", "varopt"])],
})


# --- "will it fit?" (issue 26): one row per term of the step's memory and per lever tried (audit/fit.py) ---
TABLES.update({
    "memory_fit": [
        ("fit_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("device", "VARCHAR", True),
        ("kind", "VARCHAR", False), ("name", "VARCHAR", False), ("change_json", "VARCHAR", True),
        ("bytes", "DOUBLE", True), ("provenance", "VARCHAR", False), ("basis", "VARCHAR", False),
        ("micro_batch", "BIGINT", False), ("grad_accum", "BIGINT", False), ("global_batch", "BIGINT", False),
        ("fits", "VARCHAR", False), ("budget_bytes", "DOUBLE", True), ("budget_basis", "VARCHAR", False),
    ],
})
_CHECKS.update({
    ("memory_fit", "kind"): [pa.Check.isin(["term", "total", "lever"])],
    ("memory_fit", "fits"): [pa.Check.isin(["fits", "does not fit", "undetermined"])],
    ("memory_fit", "provenance"): [pa.Check.isin(["measured", "estimated", "modelled", "not_observable",
                                                  "undetermined"])],
})


for _t, _c in ADDED_COLUMNS:  # an added column must be nullable: the rows already there have no value for it
    assert column_type(_t, _c)[1], f"ADDED_COLUMNS: {_t}.{_c} must be nullable"


# --- torch.compile's record of a run (issue 26; goblin_assets/measure/compile_counters.py) ---
TABLES.update({
    "compile_events": [
        ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("event", "VARCHAR", False),
        ("file", "VARCHAR", True), ("line", "BIGINT", True), ("function", "VARCHAR", True),
        ("reason", "VARCHAR", False), ("guard_class", "VARCHAR", True), ("count", "BIGINT", False),
        ("step", "BIGINT", False),
    ],
})


# --- a run of the original that failed as written (issue 26): the failure is the audit's finding ---
TABLES.update({
    "run_failures": [
        ("audit_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("created_at", "TIMESTAMP", False),
        ("stage", "VARCHAR", False), ("failure_class", "VARCHAR", False), ("label", "VARCHAR", False),
        ("failure", "VARCHAR", False), ("evidence", "VARCHAR", False), ("hung", "BOOLEAN", False),
        ("exit_status", "BIGINT", True), ("last_step", "BIGINT", True), ("signals", "VARCHAR", False),
        ("fired_rules", "VARCHAR", False), ("oom_kind", "VARCHAR", True), ("oom_request_bytes", "DOUBLE", True),
        ("oom_phase", "VARCHAR", True), ("oom_step", "BIGINT", True), ("fix_change_json", "VARCHAR", True),
        ("fix_ran", "BOOLEAN", True), ("fix_samples_per_sec", "DOUBLE", True), ("report_path", "VARCHAR", True),
    ],
})
_CHECKS.update({
    ("run_failures", "oom_request_bytes"): [pa.Check.ge(0)],
})
