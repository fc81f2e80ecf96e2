"""The DuckDB warehouse: validated frames written through Arrow in one transaction."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pandas as pd
import pandera.errors
import pyarrow as pa

from goblin_assets import warehouse_path
from goblin_assets.errors import WarehouseError
from goblin_assets.warehouse import storage
from goblin_assets.warehouse.tables import (
    ADDED_COLUMNS, RENAMED_COLUMNS, TABLES, column_type, ddl, dtypes, relax_not_null, schema,
)


#: How long to wait for another process's write lock on the DuckDB file (seconds).
LOCK_WAIT_S = 120.0


@contextlib.contextmanager
def connect(path: str | Path | None = None, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the warehouse (default ``$GOBLIN_HOME/warehouse.duckdb``) and create missing tables.

    Waits up to :data:`LOCK_WAIT_S` seconds while another process holds
    DuckDB's write lock.

    Raises
    ------
    WarehouseError
        The file cannot be opened (the lock was held longer than that, or it is
        not a DuckDB database).
    """
    p = Path(path) if path else warehouse_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(p), read_only=read_only and p.exists())
            break
        except duckdb.IOException as exc:
            # DuckDB allows one read-write process per file: wait for the other writer
            # (https://duckdb.org/docs/stable/connect/concurrency), then give up clearly.
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise WarehouseError(f"{p}: cannot open the warehouse: {exc}") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except duckdb.Error as exc:
            raise WarehouseError(f"{p}: cannot open the warehouse: {exc}") from None
    try:
        if not read_only:
            ensure_tables(con)
        yield con
    finally:
        con.close()


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table of :data:`TABLES` that does not exist yet; rename and add columns in place.

    A warehouse written before a column gained its unit suffix
    (:data:`~goblin_assets.warehouse.tables.RENAMED_COLUMNS`) keeps its rows: the column is renamed
    (``ALTER TABLE ... RENAME COLUMN``), never dropped.  A table created before a column was added
    (:data:`~goblin_assets.warehouse.tables.ADDED_COLUMNS`) gains it (``ALTER TABLE ... ADD COLUMN``,
    NULL in the rows already there), so its columns stay in declaration order.  A column that now
    takes NULL for a NaN (:data:`~goblin_assets.warehouse.tables.NAN_AS_NULL`) loses an old NOT NULL.
    A table stored in another layout (:data:`goblin_assets.warehouse.storage.STORED_AS`: ``sketches``
    as per-tensor lists in ``sketch_stats``) gets its physical table and the view under its own name;
    a warehouse that still has it as a physical tidy table is migrated in place, rows kept
    (:func:`goblin_assets.warehouse.storage.migrate`).

    Raises
    ------
    WarehouseError
        The migration of an old tidy table failed (rolled back: the old table is left as it was).
    """
    kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                             "WHERE table_schema = current_schema()").fetchall())
    have: dict[str, set[str]] = {}
    not_null: set[tuple[str, str]] = set()
    for table, col, nullable in con.execute("SELECT table_name, column_name, is_nullable FROM "
                                            "information_schema.columns WHERE table_schema = current_schema()"
                                            ).fetchall():
        if kinds.get(table) != "BASE TABLE":       # views (the stored-as tables' tidy names) have nothing to alter
            continue
        have.setdefault(table, set()).add(col)
        if nullable == "NO":
            not_null.add((table, col))
    for sql in relax_not_null(not_null):  # columns that now hold NaN as NULL (an old tidy sketches.value)
        con.execute(sql)
    for table, old, new in RENAMED_COLUMNS:
        cols = have.get(table, set())
        if old in cols and new not in cols:
            con.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{old}" TO "{new}"')
    for table, col in ADDED_COLUMNS:
        cols = have.get(table)
        if cols is not None and col not in cols:
            con.execute(f'ALTER TABLE "{table}" ADD COLUMN "{col}" {column_type(table, col)[0]}')
            cols.add(col)
    for t in TABLES:
        phys = storage.STORED_AS.get(t)
        if phys is None:
            if t not in kinds:
                con.execute(ddl(t))
        elif kinds.get(t) == "BASE TABLE":         # the tidy table of a warehouse from before the list layout
            try:
                storage.migrate(con, t)
            except Exception as exc:
                raise WarehouseError(f"migrating table {t} to {phys} failed (rolled back): {exc}") from None
        else:
            if phys not in kinds:
                con.execute(storage.physical_ddl(phys))
            if t not in kinds:
                con.execute(storage.view_sql(t))


def validate(table: str, df: pd.DataFrame) -> pd.DataFrame:
    """Validate ``df`` against ``table``'s pandera schema; return the coerced frame.

    The checks are the whole schema (column set and order, dtypes,
    nullability, value checks), collected lazily so that the error lists every
    failing column.  Only columns whose dtype differs from the table's
    (:func:`goblin_assets.warehouse.tables.dtypes`) are coerced, and the frame
    is not copied: the result shares the unchanged columns with ``df``, which
    is left as it was.

    Raises
    ------
    WarehouseError
        Unknown table, or the frame fails the schema (message names the table,
        the column and the first failing check).
    """
    if table not in TABLES:
        raise WarehouseError(f"unknown warehouse table {table!r}")
    have = df.dtypes.to_dict()
    need = frozenset(c for c, dt in dtypes(table).items() if have.get(c) != dt)
    try:
        # a shallow copy validated in place: pandera replaces coerced columns in the copy, never in ``df``
        return schema(table, need).validate(df.copy(deep=False), lazy=True, inplace=True)
    except pandera.errors.SchemaErrors as exc:
        fc = exc.failure_cases.head(3).to_dict("records")
        raise WarehouseError(f"table {table}: frame failed its schema: {fc}") from None


def write_frames(con: duckdb.DuckDBPyConnection, frames: dict[str, pd.DataFrame]) -> dict[str, int]:
    """Validate every frame, then insert them all through Arrow in one transaction.

    Either every frame's rows land or none do (a failure rolls back).  A table
    stored in another layout (:data:`goblin_assets.warehouse.storage.STORED_AS`:
    ``sketches``) is validated tidy, as its producers build it, and converted
    after validation (:func:`goblin_assets.warehouse.storage.to_physical`).

    Returns
    -------
    dict
        Rows written per table (tidy rows: what ``SELECT count(*)`` on the table
        or view returns for them).

    Raises
    ------
    WarehouseError
        A frame failed validation (nothing written) or the insert failed
        (rolled back).
    """
    checked = {t: validate(t, df) for t, df in frames.items()}
    counts: dict[str, int] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for t, df in checked.items():
            if df.empty:
                counts[t] = 0
                continue
            if t in storage.STORED_AS:
                target, arrow = storage.to_physical(t, df)
            else:   # validated: the table's columns, in order
                target, arrow = t, pa.Table.from_pandas(df, preserve_index=False)
            con.register("_goblin_ingest", arrow)
            cols = ", ".join(f'"{c}"' for c in arrow.column_names)
            con.execute(f'INSERT INTO "{target}" ({cols}) SELECT {cols} FROM _goblin_ingest')
            con.unregister("_goblin_ingest")
            counts[t] = len(df)
        con.execute("COMMIT")
    except Exception as exc:
        con.execute("ROLLBACK")
        raise WarehouseError(f"warehouse write rolled back: {exc}") from None
    return counts


def write(frames: dict[str, pd.DataFrame], path: str | Path | None = None) -> dict[str, int]:
    """Open the warehouse, :func:`write_frames`, close."""
    with connect(path) as con:
        return write_frames(con, frames)


def run_query(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pd.DataFrame:
    """Run ``sql`` (``?`` placeholders bound to ``params``) on an open connection; the result as a DataFrame.

    Raises
    ------
    WarehouseError
        The SQL failed (message carries DuckDB's error).
    """
    try:
        return con.execute(sql, params or []).df()
    except duckdb.Error as exc:
        raise WarehouseError(f"query failed: {exc}") from None


def query(sql: str, path: str | Path | None = None, params: list | None = None) -> pd.DataFrame:
    """Open the warehouse, :func:`run_query`, close.  Raises WarehouseError."""
    with connect(path) as con:
        return run_query(con, sql, params)
