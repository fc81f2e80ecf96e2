"""The goblin_assets import graph: no cycles, and the heavy integrations stay in their layers.

Every module of the package is parsed with :mod:`ast` (nothing is imported),
and every ``import``/``from ... import`` statement is read wherever it is:
module level, inside functions (lazy imports), relative (``from . import x``,
``from ..runners import base``) and ``from pkg import submodule`` (an edge to
the submodule, not only to the package).  Imports under ``if TYPE_CHECKING:``
are skipped: they never run.  Importing ``a.b.c`` also initialises the packages
``a`` and ``a.b``; those implicit edges are left out, as import linters do,
since a package ``__init__`` that re-exports its submodules would otherwise
form a cycle with each of them.
"""
from __future__ import annotations

import ast
from pathlib import Path

import goblin_assets

PACKAGE = Path(goblin_assets.__file__).resolve().parent
ROOT = PACKAGE.name

#: Where dagster (or a dagster_* integration) may be imported: the Dagster layer and the demo.
DAGSTER_ALLOWED = ("defs/", "definitions.py", "demo.py")
#: Where duckdb or dagster_duckdb may be imported: the warehouse and the DuckDB resource.
DUCKDB_ALLOWED = ("warehouse/", "defs/resources.py")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _imported_names(module: str, path: Path, modules: dict[str, Path] | None = None) -> list[str]:
    """Absolute dotted names a module imports, wherever the import statement is.

    ``from M import n`` gives ``M.n`` when that is a module of ``modules``
    (a submodule), else ``M`` (a name defined in M); relative imports are made
    absolute against the module's package.
    """
    modules = modules or {}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            names.append(sub if sub in modules else base)
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The goblin_assets module an imported name lands in: the longest existing prefix, or None."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of goblin_assets it imports`` (self-imports dropped)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        targets = {_resolve(n, modules) for n in _imported_names(mod, path, modules) if n.split(".")[0] == ROOT}
        graph[mod] = {t for t in targets if t and t != mod}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted): Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sccs: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        # Iterative Tarjan: a deep recursion would hit Python's limit on long chains.
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return [sorted(comp) for comp in sccs]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a closed path ``a -> b -> ... -> a``) per strongly connected component."""
    return [_cycle_in(comp, graph) for comp in strongly_connected(graph)]


def _cycle_in(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A closed path through ``comp``'s first module, found by breadth-first search inside the component."""
    members = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp  # pragma: no cover - a strongly connected component always has a cycle


def _importers_of(is_banned, allowed: tuple[str, ...]) -> list[str]:
    """``file: packages`` for each goblin_assets file outside ``allowed`` that imports a banned top-level package."""
    bad = []
    for mod, path in _modules().items():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(allowed):
            continue
        hits = sorted({n.split(".")[0] for n in _imported_names(mod, path) if is_banned(n.split(".")[0])})
        if hits:
            bad.append(f"{rel}: {', '.join(hits)}")
    return bad


def test_the_graph_reads_every_kind_of_import():
    """Lazy, relative and ``from pkg import submodule`` imports all become edges."""
    g = import_graph()
    assert "goblin_assets.runners.local" in g["goblin_assets.runners.factory"]  # a lazy import in a function
    assert "goblin_assets.runners.base" in g["goblin_assets.runners.factory"]
    assert all(t.startswith(ROOT) for targets in g.values() for t in targets)
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    comps = strongly_connected(graph)
    assert not comps, "import cycles:\n" + "\n".join(
        f"{' -> '.join(_cycle_in(c, graph))}   (modules in the cycle: {', '.join(c)})" for c in comps)


def test_only_the_dagster_layer_imports_dagster():
    bad = _importers_of(lambda top: top == "dagster" or top.startswith("dagster_"), DAGSTER_ALLOWED)
    assert not bad, "dagster imported outside defs/, definitions.py and demo.py:\n" + "\n".join(bad)


def test_only_the_warehouse_opens_duckdb():
    bad = _importers_of(lambda top: top in ("duckdb", "dagster_duckdb"), DUCKDB_ALLOWED)
    assert not bad, "duckdb imported outside warehouse/ and defs/resources.py:\n" + "\n".join(bad)


#: The layers of docs/architecture.md, lowest first: a package (or top-level module) imports only from
#: its own layer or the layers below it, so the rooms' imports point one way.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("goblin_assets", "contracts", "errors", "settings", "host", "redact", "ids", "lockcheck"),  # shared
    ("warehouse",),     # storage
    ("runners",),       # running a workload, the harness, the trace reader, device facts
    ("config",),        # reading a training setup
    ("measure",),       # profile, waste budget, signals, benchmark, calibration, evidence
    ("opscope",),       # sketches, miner, plan, tensor findings
    ("kb",),            # the rules, their matching and search
    ("patch",),         # change sets and the writers that edit the user's file
    ("report",),        # the report model and its renderings
    ("trace",),         # recorded-trace analyses
    ("audit",),         # the audit session and its stages, the synthetic corpus
    ("tracking",),      # an audit logged to the experiment tracker (MLflow)
    ("agent",),         # the conversational agent
    ("cli", "cli_common", "cli_kb", "cli_chat", "cli_trace", "cli_opscope", "cli_opscope_mine", "cli_memory",
     "cli_mcp", "mcp_server", "cli_fit"),  # front doors (the MCP server's tools are the agent's and the commands' own)
    ("defs", "definitions", "demo", "stack", "ui"),  # orchestration
)


def _room(module: str) -> str:
    """The package (or top-level module) of ``module`` directly under goblin_assets."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_rooms_import_downward_only():
    rank = {room: i for i, layer in enumerate(LAYERS) for room in layer}
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(rank), f"rooms missing from LAYERS (and docs/architecture.md): {sorted(rooms - set(rank))}"
    upward = sorted(f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                    if rank[_room(t)] > rank[_room(m)])
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_no_room_holds_more_than_a_quarter_of_the_code():
    """Rooms that say what they hold: no package of goblin_assets has more than ~25 % of its lines."""
    lines = {room: 0 for room in {_room(m) for m in _modules()}}
    for mod, path in _modules().items():
        lines[_room(mod)] += len(path.read_text(encoding="utf-8").splitlines())
    total = sum(lines.values())
    big = {room: f"{n / total:.0%}" for room, n in lines.items() if n > 0.25 * total}
    assert not big, f"packages over a quarter of the {total} lines: {big}"


def test_the_dagster_definitions_load_without_torch():
    """Every Dagster step process, code server and CLI audit imports the definitions or the session; torch is
    the training program's (it runs in the harness's child) and costs about 1.2 s per process to import, so
    the orchestration side never loads it at import time (a module that needs it imports it where it runs)."""
    import subprocess
    import sys

    code = ("import sys, goblin_assets.definitions, goblin_assets.cli, goblin_assets.audit.session\n"
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
