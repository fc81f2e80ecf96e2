"""Tables stored in another layout than the tidy one they are written and queried in.

``sketches`` is declared tidy in :data:`goblin_assets.warehouse.tables.TABLES`
(one row per ``(run, step, site, role, stat, idx)`` with a scalar ``value``):
producers build that frame, pandera validates it, and every query reads it.
It is *stored* as :data:`SKETCH_STATS` (``sketch_stats``): one row per tensor
and statistic, the statistic's values as a ``DOUBLE[]`` list, their ``idx``
as a ``BIGINT[]`` list that is NULL when it is ``0, 1, ..., n-1`` (scalars,
``hist`` bins, ``chan_maxabs`` channels, ``nonfinite`` kinds, ``probs`` /
``route`` positions: nearly every list).  ``sketches`` is a SQL view over it
(:func:`view_sql`) with exactly the old columns and rows, so ``goblin sql``,
the SQL models, the asset checks and the report's reproducing SQL read it
unchanged.

Why one row per (tensor, statistic) and not one row per tensor with a column
per statistic, or a scalar table plus a vector table:

* the set of statistics is open: it has grown (``far_sumsq``), differs by
  role (``probs``: ``peak_prob``, ``key_mass``; ``route``: ``expert_load``)
  and by recorder (``stats=`` picks a subset).  A column per statistic would
  need a schema migration for every new statistic and be mostly NULL for the
  probs/route roles; here a new statistic is a new ``stat`` value, as in the
  tidy table;
* one layout for scalars (a list of one) and vectors keeps the view a single
  ``unnest`` with no join, and writing a frame one ``INSERT``;
* the row count per tensor is the number of statistics (about 15, whatever
  the tensor's size) instead of ``15 + 32 + channels + 2 x rows + 16 + 3``
  (measured with ``benchmarks/ingest_rate.py``, 3 recorded steps: 30x fewer
  rows per step on digits_mlp, 68x on MiniLM, 2,217 rows per step instead of
  150,962); DuckDB stores the repeated key columns of a tensor's ~15 rows in
  dictionary/RLE-compressed segments, so repeating the key costs a few bytes
  per row, not a copy.  Bytes drop less (1.5x on MiniLM: 1.3 MB per step
  instead of 2.0 MB): the values themselves, 8-byte doubles, dominate.

Non-finite values are data.  The lists hold NaN as NaN and +-inf as
themselves (Arrow carries a float NaN as a value when the list is built from
numpy, never as a null); the view turns a NaN back into NULL, which is what
``sketches.value`` has always held for a NaN
(:data:`goblin_assets.warehouse.tables.NAN_AS_NULL`), so ``max(abs(value))``
and the like give the same results as on the tidy table.

A warehouse created before this layout has a physical tidy ``sketches``
table; :func:`migrate` converts it in place when the warehouse is opened
(:func:`goblin_assets.warehouse.db.ensure_tables`), in one transaction, and
checks that the view returns exactly the old rows before the old table is
dropped.

Conversion on write (:func:`sketch_stats_arrow`) cuts the validated tidy frame
into runs of consecutive rows with the same tensor and statistic (producers
emit each statistic's values contiguously, in ``idx`` order), so the view
returns the rows in the order they were written.  A tensor and statistic
whose rows are not adjacent becomes two stored rows: nothing is merged or
reordered, so nothing can be lost.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from goblin_assets.warehouse.tables import columns

if TYPE_CHECKING:   # the opscope miners import this module and never open DuckDB themselves
    import duckdb

#: The tidy table -> the physical table that stores it (the tidy name is a view over it).
STORED_AS: dict[str, str] = {"sketches": "sketch_stats"}

#: Columns that identify one tensor of one recorded step (the physical table's key, with ``stat``).
TENSOR_KEY: tuple[str, ...] = ("run_id", "workload", "model", "step", "backend", "dist", "M", "K", "N", "numel",
                               "site", "role")

#: ``sketch_stats``: one row per (tensor, statistic).  ``idx`` NULL means ``range(len(value))``.
SKETCH_STATS: list[tuple[str, str, bool]] = [
    ("run_id", "VARCHAR", False), ("workload", "VARCHAR", False), ("model", "VARCHAR", False),
    ("step", "BIGINT", False), ("backend", "VARCHAR", False), ("dist", "VARCHAR", False),
    ("M", "BIGINT", False), ("K", "BIGINT", False), ("N", "BIGINT", False), ("numel", "BIGINT", False),
    ("site", "VARCHAR", False), ("role", "VARCHAR", False), ("stat", "VARCHAR", False),
    ("idx", "BIGINT[]", True), ("value", "DOUBLE[]", False),
]

#: Physical table -> its columns ``(name, duckdb type, nullable)``.
PHYSICAL: dict[str, list[tuple[str, str, bool]]] = {"sketch_stats": SKETCH_STATS}

#: The key columns of the tidy table, in its column order (every column but ``idx`` and ``value``).
_GROUP = tuple(c for c in columns("sketches") if c not in ("idx", "value"))
assert _GROUP == TENSOR_KEY + ("stat",), _GROUP
assert [c for c, _, _ in SKETCH_STATS] == columns("sketches"), "sketch_stats keeps the tidy column names and order"


def physical_ddl(physical: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a physical table of :data:`PHYSICAL`."""
    cols = ", ".join(f'"{n}" {t}{"" if nullable else " NOT NULL"}' for n, t, nullable in PHYSICAL[physical])
    return f'CREATE TABLE IF NOT EXISTS "{physical}" ({cols})'


def view_sql(table: str) -> str:
    """``CREATE VIEW`` of the tidy ``table`` over its physical table: the tidy columns, one row per value.

    ``idx`` is the stored list or, where that is NULL, the value's position
    (0-based); a NaN value reads as NULL (as the tidy table stored it).
    """
    phys = STORED_AS[table]
    keys = ", ".join(f'"{c}"' for c in _GROUP)
    return (f'CREATE VIEW "{table}" AS\n'
            f'SELECT {keys}, "idx", CASE WHEN isnan("value") THEN NULL ELSE "value" END AS "value"\n'
            f'FROM (SELECT {keys}, unnest(coalesce("idx", range(len("value")))) AS "idx", '
            f'unnest("value") AS "value" FROM "{phys}")')


def to_physical(table: str, df: pd.DataFrame) -> tuple[str, pa.Table]:
    """``(physical table, its rows as Arrow)`` for a *validated* tidy frame of ``table`` (see :data:`STORED_AS`)."""
    if table == "sketches":
        return "sketch_stats", sketch_stats_arrow(df)
    raise KeyError(table)


def _arrow(col: pd.Series) -> pa.Array | pa.ChunkedArray:
    """A validated column as Arrow: the text columns' own Arrow data (no copy), numbers from numpy."""
    if isinstance(col.dtype, pd.ArrowDtype):
        return pa.array(col)
    return pa.array(col.to_numpy())


def _changes(col: pd.Series) -> np.ndarray:
    """``(n - 1,)`` bool: row ``i + 1`` differs from row ``i`` in ``col`` (``n >= 2``; no nulls: validated)."""
    if isinstance(col.dtype, pd.ArrowDtype):
        a = pa.array(col)
        n = len(a)
        return np.asarray(pc.not_equal(a.slice(1, n - 1), a.slice(0, n - 1)), dtype=bool)
    v = col.to_numpy()
    return v[1:] != v[:-1]


def sketch_stats_arrow(df: pd.DataFrame) -> pa.Table:
    """The ``sketch_stats`` rows of a validated tidy ``sketches`` frame (non-empty), as an Arrow table.

    One row per run of consecutive rows with the same tensor key and ``stat``;
    ``value`` the run's values in order (NaN kept as NaN), ``idx`` NULL where
    the run's ``idx`` is ``0..n-1``, the list otherwise.

    Shapes: ``df`` ``(n, 15)`` -> ``(g, 15)`` with ``g`` the number of runs.
    """
    n = len(df)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for c in _GROUP:
        if n > 1:
            change[1:] |= _changes(df[c])
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, n))
    big = n >= 2**31                                   # list offsets past int32: Arrow's large lists
    lists, off = (pa.LargeListArray, np.int64) if big else (pa.ListArray, np.int32)
    values = df["value"].to_numpy(dtype=np.float64)
    idx = df["idx"].to_numpy(dtype=np.int64)
    expected = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    irregular = np.logical_or.reduceat(idx != expected, starts)          # (g,) this run's idx is not 0..n-1
    kept = np.repeat(irregular, lengths)
    idx_offsets = np.concatenate([[0], np.cumsum(np.where(irregular, lengths, 0))]).astype(off)
    idx_list = lists.from_arrays(pa.array(idx_offsets), pa.array(idx[kept], pa.int64()), mask=pa.array(~irregular))
    # from numpy, a NaN stays a float value (never a null): the list keeps it as data
    value_list = lists.from_arrays(pa.array(np.append(starts, n).astype(off)), pa.array(values, pa.float64()))
    take = pa.array(starts)
    cols = {c: _arrow(df[c]).take(take) for c in _GROUP}
    cols["idx"] = idx_list
    cols["value"] = value_list
    return pa.table(cols)


def migrate(con: duckdb.DuckDBPyConnection, table: str) -> int:
    """Convert an old physical tidy ``table`` into its physical layout and replace it by the view; rows kept.

    Runs in one transaction: the old table is renamed, its rows grouped per
    (tensor, statistic) in their stored order (a NULL value, the tidy table's
    NaN, becomes NaN), the view created, and the view checked to return
    exactly the old rows (same count, every old row found by ``EXCEPT ALL``)
    before the old table is dropped.  Anything else rolls back and raises.

    Returns
    -------
    int
        Tidy rows migrated.
    """
    phys = STORED_AS[table]
    legacy = f"_{table}_tidy_legacy"
    keys = ", ".join(f'"{c}"' for c in _GROUP)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f'ALTER TABLE "{table}" RENAME TO "{legacy}"')
        con.execute(physical_ddl(phys))
        before = con.execute(f'SELECT coalesce(sum(len("value")), 0) FROM "{phys}"').fetchone()[0]  # normally 0
        con.execute(
            f'INSERT INTO "{phys}" SELECT {keys},\n'
            f'  CASE WHEN list("idx" ORDER BY rowid) = range(count(*)) THEN NULL ELSE list("idx" ORDER BY rowid) END,\n'
            f'  list(coalesce("value", \'NaN\'::DOUBLE) ORDER BY rowid)\n'
            f'FROM "{legacy}" GROUP BY {keys} ORDER BY min(rowid)')
        con.execute(view_sql(table))
        old = con.execute(f'SELECT count(*) FROM "{legacy}"').fetchone()[0]
        new = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] - before
        cols = ", ".join(f'"{c}"' for c in columns(table))
        lost = con.execute(f'SELECT count(*) FROM (SELECT {cols} FROM "{legacy}" EXCEPT ALL '
                           f'SELECT {cols} FROM "{table}")').fetchone()[0]
        if old != new or lost:
            raise RuntimeError(f"{table}: the migrated view has {new} new rows for {old} ({lost} not found)")
        con.execute(f'DROP TABLE "{legacy}"')
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return int(old)
