"""The DuckDB warehouse: validated frames written through Arrow in one transaction.

Two backends, chosen by :class:`goblin_assets.settings.WarehouseSettings` (``GOBLIN_WAREHOUSE``):
the embedded DuckDB file (default; one writing process at a time, DuckDB's file lock) and a
DuckLake catalog (:func:`connect_ducklake`: metadata in PostgreSQL, data as Parquet files under a
path; each write is a snapshot, so writers in many processes and hosts commit concurrently).  Both
hold the same tables and views, written and read by the same functions below.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pandas as pd
import pandera.errors
import pyarrow as pa

from goblin_assets import warehouse_path
from goblin_assets.errors import WarehouseError
from goblin_assets.settings import WarehouseSettings
from goblin_assets.warehouse import storage
from goblin_assets.warehouse.sql_models import ensure_views
from goblin_assets.warehouse.tables import (
    ADDED_COLUMNS, RENAMED_COLUMNS, TABLES, column_type, ddl, dtypes, relax_not_null, schema,
)


#: How long to wait for another process's write lock on the DuckDB file (seconds).
LOCK_WAIT_S = 120.0


#: The DuckLake catalog's name inside the connection (``USE``d, so queries name tables bare).
LAKE = "goblin_lake"
#: The DuckDB extensions a DuckLake on PostgreSQL needs: (the PyPI wheel's module, the extension's name).
LAKE_EXTENSIONS = (("duckdb_extension_postgres_scanner", "postgres_scanner"), ("duckdb_extension_ducklake", "ducklake"))
#: Attempts at attaching a DuckLake and creating its tables (writers starting together race on the first DDL).
LAKE_ATTEMPTS = 8


def extension_path(module: str, name: str) -> Path:
    """The ``.duckdb_extension`` file that the wheel ``module`` ships for this DuckDB version.

    Raises
    ------
    WarehouseError
        The wheel is missing, or it was built for another DuckDB release (its folder names the version).
    """
    try:
        root = Path(importlib.import_module(module).__file__).parent / "extensions"
    except ImportError:
        raise WarehouseError(f"the DuckLake backend needs the {module.replace('_', '-')} wheel (pip install it)") from None
    want = root / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not want.is_file():
        have = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise WarehouseError(f"{module} has no {name} extension for DuckDB {duckdb.__version__} (it has {have}): "
                             f"install the wheel release that matches duckdb")
    return want


def connect_ducklake(catalog: str, data: str) -> duckdb.DuckDBPyConnection:
    """A connection with the DuckLake ``catalog`` (PostgreSQL DSN) attached as :data:`LAKE` and in use.

    The postgres and ducklake extensions are loaded from their wheels (:func:`extension_path`);
    extension auto-install is off, so nothing is downloaded.  ``data`` is where the Parquet files go
    (a local path or an object-store URL DuckDB can write).

    Raises
    ------
    WarehouseError
        An extension is missing, or the catalog cannot be attached (message carries DuckDB's error).
    """
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
    try:
        for module, name in LAKE_EXTENSIONS:
            con.execute(f"LOAD '{extension_path(module, name)}'")
        dsn, path = catalog.replace("'", "''"), data.replace("'", "''")
        # the first writers of a new catalog race on creating its metadata tables: retried
        _retrying(lambda: con.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS {LAKE} (DATA_PATH '{path}')"))
        con.execute(f"USE {LAKE}")
    except duckdb.Error as exc:
        con.close()
        raise WarehouseError(f"cannot attach the DuckLake {catalog!r} (data {data!r}): {exc}") from None
    except BaseException:
        con.close()
        raise
    return con


def _retrying(fn) -> None:
    """Call ``fn`` up to :data:`LAKE_ATTEMPTS` times while it raises a DuckDB error (backing off 0.1 s, doubling)."""
    delay = 0.1
    for attempt in range(LAKE_ATTEMPTS):
        try:
            fn()
            return
        except duckdb.Error:
            if attempt == LAKE_ATTEMPTS - 1:
                raise
            time.sleep(delay)
            delay *= 2


def ensure_tables_retrying(con: duckdb.DuckDBPyConnection) -> None:
    """:func:`ensure_tables`, retried when another writer created the same table first (a DuckLake commit conflict)."""
    _retrying(lambda: ensure_tables(con))


#: (process id, catalog, data) -> [the process's attached DuckLake connection, whether its tables were ensured].
_LAKES: dict[tuple[int, str, str], list] = {}


@contextlib.contextmanager
def ducklake_connection(catalog: str, data: str, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on this process's one attached DuckLake (:func:`connect_ducklake`), tables ensured once.

    Attaching the catalog costs about 0.25 s (the extensions loaded, the catalog read from PostgreSQL;
    measured on the local stack), a quarter of a replayed step on a Celery worker: a worker runs many
    steps, so the attached database is kept per process (the key includes the process id: a forked
    child attaches its own) and each use gets its own cursor, whose transactions start at the
    catalog's latest snapshot.  ``read_only`` skips creating missing tables.

    Raises
    ------
    WarehouseError
        As :func:`connect_ducklake`; a cached connection that fails is dropped and attached again once.
    """
    key = (os.getpid(), catalog, data)
    for attempt in (0, 1):
        entry = _LAKES.get(key)
        if entry is None:
            entry = _LAKES[key] = [connect_ducklake(catalog, data), False]
        try:
            if not read_only and not entry[1]:
                ensure_tables_retrying(entry[0])
                entry[1] = True
            cur = entry[0].cursor()
            cur.execute(f"USE {LAKE}")
            break
        except duckdb.Error as exc:
            _LAKES.pop(key, None)
            with contextlib.suppress(duckdb.Error):
                entry[0].close()
            if attempt:
                raise WarehouseError(f"the DuckLake {catalog!r} failed: {exc}") from None
    try:
        yield cur
    finally:
        cur.close()


@contextlib.contextmanager
def connect(path: str | Path | None = None, read_only: bool = False,
            settings: WarehouseSettings | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the warehouse and create missing tables.

    ``path`` names a DuckDB file.  Without it, ``settings`` (default :meth:`WarehouseSettings.from_env`)
    choose: the file ``$GOBLIN_HOME/warehouse.duckdb`` or the DuckLake catalog (:func:`connect_ducklake`).
    On the file, waits up to :data:`LOCK_WAIT_S` seconds while another process holds DuckDB's write lock.

    Raises
    ------
    WarehouseError
        The file cannot be opened (the lock was held longer than that, or it is
        not a DuckDB database), or the DuckLake cannot be attached.
    """
    if path is None:
        ws = settings or WarehouseSettings.from_env()
        if ws.backend == "ducklake":
            with ducklake_connection(ws.catalog, ws.data, read_only=read_only) as con:
                yield con
            return
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
    (:func:`goblin_assets.warehouse.storage.migrate`).  Then every SQL model that is a view
    (``dbt_like_sql/``) is created where missing or built from older SQL
    (:func:`goblin_assets.warehouse.sql_models.ensure_views`), so the models summarising audits read
    the rows of every audit as soon as they are written.

    Raises
    ------
    WarehouseError
        The migration of an old tidy table failed (rolled back: the old table is left as it was), or
        DuckDB rejected a view model's SQL.
    """
    kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                             "WHERE table_schema = current_schema() AND table_catalog = current_database()").fetchall())
    have: dict[str, set[str]] = {}
    not_null: set[tuple[str, str]] = set()
    for table, col, nullable in con.execute("SELECT table_name, column_name, is_nullable FROM "
                                            "information_schema.columns WHERE table_schema = current_schema() "
                                            "AND table_catalog = current_database()"
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
    ensure_views(con, kinds)


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
