"""SQL models over the warehouse: plain DuckDB SQL files in layers (``dbt_like_sql/``).

Each ``.sql`` file under ``staging/`` or ``marts/`` is one model named after the
file.  A header comment ``-- materialized: view`` or ``-- materialized: table``
says how it is built.  A view is always current: the warehouse creates every view model when it
opens for writing (:func:`ensure_views`, called by :func:`goblin_assets.warehouse.db.ensure_tables`), so
rows an audit writes show in the models at once, whichever front door wrote them; a ``table`` is a
snapshot, rebuilt only when its Dagster asset is materialized, so models over audit tables are views
(tests/test_sql_models.py checks it).  Its upstream tables are read from the SQL itself with
sqlglot (every table referenced, minus the query's own CTE names), never from
a hand-written list.  The files ship as package data and are read through
``importlib.resources``, so an installed wheel finds them from any directory.
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

import duckdb
import sqlglot
from sqlglot import exp

from goblin_assets.errors import WarehouseError

#: The packaged models: ``dbt_like_sql/{staging,marts}/*.sql``.
SQL_ROOT: Traversable = files("goblin_assets.dbt_like_sql")
LAYERS = ("staging", "marts")
_MATERIALIZED = re.compile(r"^\s*--\s*materialized:\s*(view|table)\s*$", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class SqlModel:
    """One SQL file: its name, layer, how it is materialized, its SQL and upstream tables."""

    name: str
    layer: str
    path: Traversable
    materialized: str
    sql: str
    upstream: tuple[str, ...]
    description: str

    @property
    def version(self) -> str:
        """The first 12 hex digits of the SQL's sha256: the Dagster asset's code version, and the view's comment."""
        return hashlib.sha256(self.sql.encode()).hexdigest()[:12]

    @property
    def comment(self) -> str:
        """The comment a built view carries: says which SQL it was built from (:func:`ensure_views`)."""
        return f"goblin model {self.version}"


def upstream_tables(sql: str, file: str = "<sql>") -> tuple[str, ...]:
    """Tables a query reads (sorted), found by parsing it with sqlglot (DuckDB dialect).

    Raises
    ------
    WarehouseError
        The SQL does not parse (message names the file).
    """
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as exc:
        raise WarehouseError(f"{file}: SQL does not parse: {exc}") from None
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    return tuple(sorted({t.name for t in tree.find_all(exp.Table) if t.name and t.name not in ctes}))


def load_models(root: Traversable = SQL_ROOT) -> list[SqlModel]:
    """Every model under ``root/staging`` and ``root/marts``, in dependency order.

    ``root`` is a ``pathlib.Path`` or an ``importlib.resources`` traversable; it
    defaults to the packaged models.  A missing layer folder holds no models.

    Raises
    ------
    WarehouseError
        A file lacks the ``-- materialized:`` header, does not parse, two files
        share a name, or models depend on each other in a cycle.
    """
    models: dict[str, SqlModel] = {}
    for layer in LAYERS:
        folder = root / layer
        paths = [p for p in folder.iterdir() if p.name.endswith(".sql") and p.is_file()] if folder.is_dir() else []
        for path in sorted(paths, key=lambda p: p.name):
            stem = path.name.removesuffix(".sql")
            sql = path.read_text(encoding="utf-8")
            m = _MATERIALIZED.search(sql)
            if not m:
                raise WarehouseError(f"{path}: missing header comment '-- materialized: view|table'")
            if stem in models:
                raise WarehouseError(f"{path}: a model named {stem!r} already exists")
            comments = [ln.strip()[2:].strip() for ln in sql.splitlines() if ln.strip().startswith("--")]
            desc = " ".join(c for c in comments if not c.lower().startswith("materialized:"))
            models[stem] = SqlModel(stem, layer, path, m.group(1).lower(), sql,
                                    upstream_tables(sql, str(path)), desc)
    order: list[SqlModel] = []
    state: dict[str, int] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise WarehouseError(f"SQL models form a cycle: {' -> '.join(chain + (name,))}")
        state[name] = 1
        for up in models[name].upstream:
            if up in models:
                visit(up, chain + (name,))
        state[name] = 2
        order.append(models[name])

    for name in models:
        visit(name, ())
    return order


@functools.cache
def packaged_models() -> tuple[SqlModel, ...]:
    """:func:`load_models` of the packaged models, read and parsed once per process."""
    return tuple(load_models())


def _create(con: duckdb.DuckDBPyConnection, model: SqlModel) -> None:
    body = model.sql.strip().rstrip(";")
    if model.materialized == "view":
        con.execute(f'CREATE OR REPLACE VIEW "{model.name}" AS {body}')
        con.execute(f"""COMMENT ON VIEW "{model.name}" IS '{model.comment}'""")
    else:
        con.execute(f'CREATE OR REPLACE TABLE "{model.name}" AS {body}')


def build_model(con: duckdb.DuckDBPyConnection, model: SqlModel) -> int:
    """``CREATE OR REPLACE`` the model's view or table; returns its row count.

    Raises
    ------
    WarehouseError
        DuckDB rejected the SQL (message names the file).
    """
    try:
        _create(con, model)
        return int(con.execute(f'SELECT count(*) FROM "{model.name}"').fetchone()[0])
    except duckdb.Error as exc:
        raise WarehouseError(f"{model.path}: {exc}") from None


def ensure_views(con: duckdb.DuckDBPyConnection, kinds: dict[str, str],
                 models: tuple[SqlModel, ...] | None = None) -> list[str]:
    """Create every view model that is missing or stale; the names created, in dependency order.

    ``kinds`` maps the relations in the current schema to ``BASE TABLE`` or ``VIEW`` (as
    ``information_schema.tables`` says, read before the call); ``models`` defaults to
    :func:`packaged_models`.  A view is stale when its comment names other SQL than the file's
    (:attr:`SqlModel.comment`: the SQL changed since it was built); a *table* under a view model's
    name (a mart built as a table before it became a view) is dropped and replaced: its rows are
    derived, nothing is lost.  The tables the views read must exist.

    Raises
    ------
    WarehouseError
        DuckDB rejected a model's SQL (message names the file).
    """
    views = [m for m in (packaged_models() if models is None else models) if m.materialized == "view"]
    comments = dict(con.execute(
        "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal AND schema_name = current_schema() "
        "AND database_name = current_database()").fetchall())
    made = []
    for m in views:
        if kinds.get(m.name) == "VIEW" and comments.get(m.name) == m.comment:
            continue
        try:
            if kinds.get(m.name) == "BASE TABLE":
                con.execute(f'DROP TABLE "{m.name}"')
            _create(con, m)
        except duckdb.Error as exc:
            raise WarehouseError(f"{m.path}: {exc}") from None
        made.append(m.name)
    return made
