"""Dataflow structure of a model graph: op-chain motifs and repeated sub-DAGs (fusion candidates).

Three entry points:

* :func:`motifs` — linear op-subsequence motifs on an op chain (n-grams that
  repeat, counted without overlap, kept when no longer motif has the same count);
* :func:`dataflow` — repeated dataflow sub-DAGs: every node's input cone is hashed
  merkle-style at bounded depths; nodes whose cones hash alike seed a class,
  whose cones are then grown in lockstep (every instance takes the same op at
  the same input position, no node is shared between instances) up to a depth
  bound.  Classes are scored ``count x (cone size + 1)`` and named from a table
  of fusion templates (:data:`FUSION_TEMPLATES`);
* :func:`graph` — load a graph another program dumped as a plain edge list, so
  models that cannot be imported here can still be mined.

Edge-list format (``goblin op graph v1``), one node per line, whitespace
separated, ``#`` starts a comment::

    # id   op                     inputs (comma-separated ids, '-' for none)
    x      input                  -
    w0     param                  -
    n1     aten.linear.default    x,w0
    n2     aten.relu.default      n1

``op`` is any token without whitespace; ``input`` and ``param`` (also
``placeholder``, ``get_attr``, ``const``) mark leaves.  Nodes may appear in any
order; every input id must be defined in the file.  :func:`dump_graph` writes
this format.

No-op canonicalisation: eval-mode dropout, ``contiguous``, ``clone``,
``alias``, ``detach`` and ``lift_fresh_copy`` are replaced by their input and
side-effect-only nodes (``_assert_*``) are dropped before hashing, since they
move no data a fused kernel would keep.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from goblin_assets.errors import GoblinError
from goblin_assets.warehouse.tables import columns

LEAF_OPS = {"input", "param", "placeholder", "get_attr", "const"}
#: ops canonicalised away (replaced by their first input)
_NOOP_KINDS = {"contiguous", "clone", "alias", "detach", "lift_fresh_copy", "identity", "dropout"}
_MATMUL_KINDS = {"linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "einsum", "_int_mm", "conv1d", "conv2d"}
_ACT_KINDS = {"relu", "gelu", "silu", "tanh", "sigmoid", "relu_", "gelu_", "silu_", "leaky_relu", "hardswish"}
_NORM_KINDS = {"layer_norm", "rms_norm", "native_layer_norm", "group_norm", "layernorm", "rmsnorm"}

#: Fusion templates, first match names the class: (name, kind groups that must
#: all be present, minimum matmul-family ops, maximum cone size or None, kinds
#: the cone's root must have or None).
#: Attention with softmax -> fused attention block (FlashAttention, Dao et al. 2022);
#: matmul + bias + activation -> a GEMM epilogue (cuBLASLt / hipBLASLt epilogues);
#: top-k gating + grouped matmuls -> a fused MoE block (MegaBlocks, Gale et al. 2023).
FUSION_TEMPLATES: list[tuple[str, list[set[str]], int, int | None, set[str] | None]] = [
    ("fused_moe_block", [{"topk"}], 2, None, None),
    ("fused_transformer_layer", [{"softmax"}, _ACT_KINDS, _NORM_KINDS], 4, None, None),
    ("fused_attention_block", [{"softmax"}], 2, None, None),
    ("fused_matmul_bias_act", [_ACT_KINDS], 1, 4, _ACT_KINDS),
    ("fused_add_norm", [{"add"}, _NORM_KINDS], 0, 3, _NORM_KINDS),
]


class GraphFormatError(GoblinError):
    """An edge-list graph file is malformed (message names the file, line and problem)."""


@dataclass(frozen=True)
class Node:
    """One op: ``id``, ``op`` (full name), ``inputs`` (ids, positional), ``attrs`` (non-tensor args)."""

    id: str
    op: str
    inputs: tuple[str, ...] = ()
    attrs: str = ""

    @property
    def kind(self) -> str:
        return op_kind(self.op)

    @property
    def is_leaf(self) -> bool:
        return self.op in LEAF_OPS

    @property
    def label(self) -> str:
        """What must be equal for two nodes to be the same op: op, arity and non-tensor args."""
        return f"{self.op}/{len(self.inputs)}/{self.attrs}"


@dataclass
class OpGraph:
    """A dataflow DAG: nodes in topological order (inputs before users)."""

    nodes: dict[str, Node] = field(default_factory=dict)

    def ops(self) -> list[Node]:
        """Non-leaf nodes in topological order."""
        return [n for n in self.nodes.values() if not n.is_leaf]

    def chain(self) -> list[str]:
        """The op kinds in topological order: the op chain :func:`motifs` reads."""
        return [n.kind for n in self.ops()]


def op_kind(op: str) -> str:
    """Short op kind: ``aten.linear.default`` -> ``linear``; ``Linear`` -> ``linear``; ``method:topk`` -> ``topk``."""
    s = op.split(":")[-1]
    s = re.sub(r"^<built-in (function|method) (\w+)>$", r"\2", s)
    parts = s.split(".")
    if parts[0] in ("aten", "prims", "quantized") and len(parts) >= 2:
        s = parts[1]
    elif len(parts) > 1:
        s = parts[-1]
    return {"softmax": "softmax", "_softmax": "softmax"}.get(s.lower(), s.lower())


# --------------------------------------------------------------------------- loading

def _attr_repr(a) -> str:
    if isinstance(a, float):
        return f"{a:.6g}"
    if isinstance(a, (list, tuple)):
        return "[" + ",".join(_attr_repr(x) for x in a) + "]"
    return str(a)


def graph_from_fx(gm_or_graph, param_names: Iterable[str] = ()) -> OpGraph:
    """An :class:`OpGraph` from a ``torch.fx`` graph (an exported program's graph or a traced module).

    Placeholders named in ``param_names`` (and ``get_attr`` nodes) become
    ``param`` leaves, other placeholders ``input`` leaves.  Tensor arguments
    become edges; other arguments (ints, floats, shapes) become ``attrs``.
    No-ops are canonicalised away (see module docstring).
    """
    import torch.fx as fx

    graph = gm_or_graph.graph if hasattr(gm_or_graph, "graph") else gm_or_graph
    modules = dict(gm_or_graph.named_modules()) if hasattr(gm_or_graph, "named_modules") else {}
    params = set(param_names)
    alias: dict[str, str] = {}
    out = OpGraph()
    for n in graph.nodes:
        if n.op == "output":
            continue
        if n.op == "placeholder":
            out.nodes[n.name] = Node(n.name, "param" if n.name in params else "input")
            continue
        if n.op == "get_attr":
            out.nodes[n.name] = Node(n.name, "param")
            continue
        if n.op == "call_module":
            op = f"module:{type(modules.get(n.target)).__name__}" if n.target in modules else f"module:{n.target}"
        elif n.op == "call_method":
            op = f"method:{n.target}"
        else:
            op = str(n.target) if hasattr(n.target, "_schema") else getattr(n.target, "__name__", str(n.target))
        ins: list[str] = []
        attrs: list[str] = []

        def visit(a):
            if isinstance(a, fx.Node):
                ins.append(alias.get(a.name, a.name))
            elif isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
                for x in a:
                    visit(x)
            else:
                attrs.append(_attr_repr(a))

        for a in list(n.args) + [v for _, v in sorted(n.kwargs.items())]:
            visit(a)
        kind = op_kind(op)
        if kind.startswith("_assert") or (not n.users and kind not in _MATMUL_KINDS):
            continue
        if kind in _NOOP_KINDS and ins:
            alias[n.name] = ins[0]
            continue
        out.nodes[n.name] = Node(n.name, op, tuple(i for i in ins if i in out.nodes), ",".join(attrs))
    return out


def graph_from_module(model, args: tuple, kwargs: dict | None = None) -> OpGraph:
    """Export ``model`` with ``torch.export`` (falling back to ``torch.fx.symbolic_trace``) and load its graph.

    Raises
    ------
    GraphFormatError
        Neither export nor symbolic tracing worked (both errors in the message).
    """
    import torch

    try:
        ep = torch.export.export(model, args, kwargs or {})
        sig = ep.graph_signature
        params = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers) | \
            set(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
        return graph_from_fx(ep.graph, params)
    except Exception as exc_export:  # noqa: BLE001 - export fails in many ways; fall back and report both
        try:
            return graph_from_fx(torch.fx.symbolic_trace(model))
        except Exception as exc_fx:  # noqa: BLE001
            raise GraphFormatError(f"{type(model).__name__}: torch.export failed ({exc_export}); "
                                   f"torch.fx failed ({exc_fx})") from None


def graph(path: str | Path) -> OpGraph:
    """Load an edge-list graph (format in the module docstring).

    Raises
    ------
    GraphFormatError
        A line does not have 3 fields, an id repeats, an input id is undefined,
        or the graph has a cycle (message: ``file:line: problem``).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise GraphFormatError(f"{p}: cannot read: {exc}") from None
    return parse_graph(text, str(p))


def parse_graph(text: str, source: str = "<text>") -> OpGraph:
    """Parse edge-list ``text`` (see :func:`graph`); ``source`` names it in errors."""
    raw: dict[str, tuple[str, tuple[str, ...], int]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        f = line.split()
        if len(f) != 3:
            raise GraphFormatError(f"{source}:{lineno}: expected 'id op inputs', got {len(f)} fields")
        nid, op, ins = f
        if nid in raw:
            raise GraphFormatError(f"{source}:{lineno}: node id {nid!r} defined twice")
        raw[nid] = (op, tuple() if ins == "-" else tuple(i for i in ins.split(",") if i), lineno)
    for nid, (op, ins, lineno) in raw.items():
        for i in ins:
            if i not in raw:
                raise GraphFormatError(f"{source}:{lineno}: node {nid!r} reads undefined input {i!r}")
    # topological order (Kahn), stable in file order
    indeg = {n: len(set(ins)) for n, (_, ins, _) in raw.items()}
    users = defaultdict(list)
    for n, (_, ins, _) in raw.items():
        for i in set(ins):
            users[i].append(n)
    ready = deque(n for n in raw if indeg[n] == 0)
    out = OpGraph()
    while ready:
        n = ready.popleft()
        op, ins, _ = raw[n]
        out.nodes[n] = Node(n, op, ins)
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(out.nodes) != len(raw):
        bad = sorted(set(raw) - set(out.nodes))[:5]
        raise GraphFormatError(f"{source}: the graph has a cycle through {bad}")
    return out


def dump_graph(g: OpGraph) -> str:
    """The edge-list text of ``g`` (non-tensor ``attrs`` are not part of the format and are dropped)."""
    lines = ["# goblin op graph v1", "# id op inputs"]
    lines += [f"{n.id} {n.op} {','.join(n.inputs) or '-'}" for n in g.nodes.values()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- motifs

def motifs(chain: Sequence[str], min_len: int = 2, max_len: int = 32, min_count: int = 2) -> pd.DataFrame:
    """Repeated linear op-subsequences of an op chain.

    Occurrences are counted without overlap (greedy, left to right); a motif is
    kept when it occurs at least ``min_count`` times and no longer kept motif
    containing it has the same count (maximal motifs only).

    Returns
    -------
    DataFrame
        ``motif`` (ops joined by ``' > '``), ``length``, ``count``, ``score``
        (count x length), ``first_pos``; sorted by score.
    """
    chain = list(chain)
    found: list[tuple[tuple[str, ...], int, int]] = []
    for n in range(min_len, min(max_len, len(chain) // 2) + 1):
        pos: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i in range(len(chain) - n + 1):
            pos[tuple(chain[i:i + n])].append(i)
        for gram, ps in pos.items():
            if len(ps) < min_count:
                continue
            cnt, last = 0, -n
            for p in ps:
                if p >= last + n:
                    cnt, last = cnt + 1, p
            if cnt >= min_count:
                found.append((gram, cnt, ps[0]))
    found.sort(key=lambda t: (-len(t[0]), -t[1]))
    kept: list[tuple[tuple[str, ...], int, int]] = []
    for gram, cnt, first in found:
        s = " > ".join(gram)
        if any(c == cnt and s in " > ".join(g) for g, c, _ in kept):
            continue
        kept.append((gram, cnt, first))
    df = pd.DataFrame([{"motif": " > ".join(g), "length": len(g), "count": c, "score": c * len(g), "first_pos": f}
                       for g, c, f in kept], columns=["motif", "length", "count", "score", "first_pos"])
    return df.sort_values(["score", "length"], ascending=False, ignore_index=True)


# --------------------------------------------------------------------------- repeated cones

def _merkle(g: OpGraph, depth: int) -> dict[str, str]:
    """Hash of every node's input cone cut at ``depth`` (frontier nodes are opaque)."""
    h = {nid: "*" for nid in g.nodes}
    for _ in range(depth):
        h = {nid: hashlib.sha1((n.label + "|" + ",".join(h[i] for i in n.inputs)).encode()).hexdigest()[:16]
             for nid, n in g.nodes.items()}
    return h


def _grow(g: OpGraph, roots: Sequence[str], max_depth: int) -> list[tuple[str, ...]]:
    """Grow the roots' cones in lockstep; returns the matched node tuples (one entry per instance)."""
    claimed: dict[str, tuple[int, int]] = {r: (i, 0) for i, r in enumerate(roots)}
    tuples: list[tuple[str, ...]] = [tuple(roots)]
    queue = deque([(0, 0)])
    while queue:
        ti, dist = queue.popleft()
        if dist >= max_depth:
            continue
        t = tuples[ti]
        for j in range(len(g.nodes[t[0]].inputs)):
            cand = tuple(g.nodes[x].inputs[j] for x in t)
            nodes = [g.nodes[c] for c in cand]
            if any(n.is_leaf for n in nodes) or len(set(cand)) < len(cand):
                continue  # leaves and shared inputs are the cone's frontier
            owners = [claimed.get(c) for c in cand]
            if all(o is not None for o in owners):
                continue  # reconvergence inside the instances, or someone else's node: frontier either way
            if any(o is not None for o in owners) or len({n.label for n in nodes}) != 1:
                continue
            tuples.append(cand)
            for i, c in enumerate(cand):
                claimed[c] = (i, len(tuples) - 1)
            queue.append((len(tuples) - 1, dist + 1))
    return tuples


def fusion_name(kinds: Sequence[str]) -> list[str]:
    """Names of the fusion templates a cone matches (first = primary); ``kinds[0]`` is the cone's root."""
    ks = set(kinds)
    n_mm = sum(1 for k in kinds if k in _MATMUL_KINDS)
    names = [name for name, groups, min_mm, max_size, root in FUSION_TEMPLATES
             if all(ks & grp for grp in groups) and n_mm >= min_mm and (max_size is None or len(kinds) <= max_size)
             and (root is None or (kinds and kinds[0] in root))]
    return names or ["repeated_subgraph"]


def dataflow(g: OpGraph, max_depth: int = 32, seed_depths: Sequence[int] = (1, 2, 3, 4, 6, 8),
         min_size: int = 2, top: int = 20) -> pd.DataFrame:
    """Repeated dataflow sub-DAGs of ``g`` and the fusion candidates they name.

    Seeds: nodes whose merkle cone hashes agree at each of ``seed_depths``.
    Each seed class is grown in lockstep at depth bounds 1, 2, 3, 4, 6, 8, ...
    up to ``max_depth``; each distinct result is a class with ``count``
    disjoint instances of ``size`` op nodes.

    Ranking: score ``count x (size + 1)`` (the +1 favours the repeated unit
    over a concatenation of units), ties broken by size and then by the later
    root.  A class whose every instance lies inside one instance of a
    higher-ranked top-level class is reported ``within`` it, only when it
    matches a named template other than the parent's, one per parent and
    template (the smallest cone for size-bounded templates such as
    MatMulBiasAct, the best score otherwise); a class overlapping a
    higher-ranked one by half or more of its nodes is a shifted copy and
    dropped.  Rows are ordered top-level class first, then its sub-candidates.

    Returns
    -------
    DataFrame
        ``cone_id``, ``name`` (primary fusion candidate), ``names`` (all
        matching templates), ``count``, ``size``, ``score``, ``depth``,
        ``root_kind``, ``roots`` (first node of each instance), ``ops`` (op
        kinds of one instance, breadth first from the root), ``within``
        (parent ``cone_id`` or ``None``), ``coverage`` (share of the graph's op
        nodes in the class's instances).
    """
    ops = {n.id for n in g.ops()}
    order = {nid: i for i, nid in enumerate(g.nodes)}
    seeds: set[tuple[str, ...]] = set()
    for d in seed_depths:
        groups: dict[str, list[str]] = defaultdict(list)
        for nid, h in _merkle(g, d).items():
            if nid in ops:
                groups[h].append(nid)
        seeds |= {tuple(sorted(v, key=order.get)) for v in groups.values() if len(v) >= 2}
    bounds = sorted({b for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if b < max_depth} | {max_depth})
    classes: dict[frozenset, dict] = {}
    for roots in seeds:
        prev = None
        for b in bounds:
            tuples = _grow(g, roots, b)
            if prev is not None and len(tuples) == prev:
                break  # saturated: deeper bounds add nothing
            prev = len(tuples)
            if len(tuples) < min_size:
                continue
            instances = [frozenset(t[i] for t in tuples) for i in range(len(roots))]
            key = frozenset().union(*instances)
            if key in classes:
                continue
            kinds = [g.nodes[t[0]].kind for t in tuples]
            classes[key] = {"roots": list(roots), "count": len(roots), "size": len(tuples), "depth": b,
                            "kinds": kinds, "nodes": key, "instances": instances,
                            "score": len(roots) * (len(tuples) + 1),
                            "last_root": max(order[r] for r in roots)}
    ranked = sorted(classes.values(), key=lambda c: (-c["score"], -c["size"], -c["last_root"]))
    for c in ranked:
        c["names"] = fusion_name(c["kinds"])
    # pass 1: top-level classes (not inside, and not a shifted copy of, a higher-ranked one)
    top_level: list[dict] = []
    inside: list[tuple[int, dict]] = []
    for c in ranked:
        parent = next((i for i, t in enumerate(top_level)
                       if all(any(inst <= p for p in t["instances"]) for inst in c["instances"])), None)
        if parent is not None:
            if not all(inst in top_level[parent]["instances"] for inst in c["instances"]):  # not the same cone
                inside.append((parent, c))
        elif not any(len(c["nodes"] & t["nodes"]) * 2 >= len(c["nodes"]) for t in top_level):
            top_level.append(c)
    # pass 2: one named sub-candidate per (parent, template): the smallest cone for size-bounded
    # templates (an epilogue fusion's natural unit), the best score otherwise
    bounded = {name for name, _, _, max_size, _ in FUSION_TEMPLATES if max_size is not None}
    best: dict[tuple[int, str], dict] = {}
    for parent, c in inside:
        name = c["names"][0]
        if name in ("repeated_subgraph", top_level[parent]["names"][0]):
            continue
        key = (c["size"], -c["count"]) if name in bounded else (-c["score"], -c["size"])
        old = best.get((parent, name))
        if old is None or key < ((old["size"], -old["count"]) if name in bounded else (-old["score"], -old["size"])):
            best[(parent, name)] = c
    rows = []
    for ti, t in enumerate(top_level):
        for c, parent in [(t, None)] + [(c, ti) for (p, _), c in sorted(best.items(), key=lambda kv: -kv[1]["score"])
                                         if p == ti]:
            rows.append({"cone_id": f"cone{len(rows)}", "name": c["names"][0], "names": c["names"],
                         "count": c["count"], "size": c["size"], "score": c["score"], "depth": c["depth"],
                         "root_kind": c["kinds"][0], "roots": c["roots"], "ops": c["kinds"],
                         "within": None if parent is None else f"top{parent}",
                         "coverage": len(c["nodes"]) / max(len(ops), 1)})
    top_ids = {}
    for r in rows:
        if r["within"] is None:
            top_ids[len(top_ids)] = r["cone_id"]
    for r in rows:
        if r["within"] is not None:
            r["within"] = top_ids[int(r["within"][3:])]
    return pd.DataFrame(rows[:top], columns=["cone_id", "name", "names", "count", "size", "score", "depth",
                                             "root_kind", "roots", "ops", "within", "coverage"])


def dataflow_findings(cones: pd.DataFrame, run_id: str = "dataflow", workload: str = "graph") -> pd.DataFrame:
    """``patterns`` rows (finding ``fusion_candidate``) from :func:`dataflow` output.

    ``site`` is the class's first root node, ``role`` is ``graph``, ``score`` is
    ``count x (size + 1)``; the evidence carries the name, count, size, ops
    and the instances' roots.
    """
    rows = []
    for r in cones.itertuples():
        ev = {"name": r.name, "names": list(r.names), "count": int(r.count), "size": int(r.size),
              "depth": int(r.depth), "roots": list(r.roots), "ops": list(r.ops), "within": r.within,
              "coverage": float(r.coverage), "cone_id": r.cone_id}
        rows.append({"run_id": run_id, "workload": workload, "site": r.roots[0], "role": "graph",
                     "finding": "fusion_candidate", "score": float(r.score), "evidence_json": json.dumps(ev)})
    return pd.DataFrame(rows, columns=columns("patterns"))


def minilm_graph(texts: Sequence[str] | None = None, max_length: int = 32) -> OpGraph:
    """The exported graph of the packaged all-MiniLM-L6-v2 (eager attention) on real text.

    Source: measured_facts — ``torch.export`` of the BertModel works (37 linear sites).
    """
    from goblin_assets.opscope.infer import load_minilm, stdlib_texts

    model, tok = load_minilm()
    enc = tok(list(texts or stdlib_texts(2)), return_tensors="pt", padding=True, truncation=True,
              max_length=max_length)
    return graph_from_module(model, (enc["input_ids"],), {"attention_mask": enc["attention_mask"]})


def op_histogram(g: OpGraph) -> Counter:
    """Count of op kinds (a quick look at what a loaded graph holds)."""
    return Counter(n.kind for n in g.ops())
