"""Graph-rewrite taps: sketches appended to the model's own graph as one extra output.

:func:`inject_matmul_stats` takes a model (or an ``ExportedProgram`` or an fx
``GraphModule``), captures its graph with ``torch.export`` (falling back to
``torch.fx.symbolic_trace`` where export fails), and for every matmul site
(aten ``linear``/``mm``/``addmm``/``bmm``/``matmul``/``baddbmm`` and their
module and function forms) inserts reduction nodes right after the tensors
they read (while those are still hot in cache).  The reductions are the
backend's own kernels (:func:`goblin_assets.opscope.sketches.sketch_vector`),
so the same rewrite runs on CPU, CUDA and ROCm.  All sketch vectors are
concatenated into one float64 vector returned as the *last* output; the
model's own outputs come first, flattened, output 0 unchanged.
:func:`inject_infer_stats` does the same for softmax outputs (role ``probs``)
and top-k routing (role ``route``).

Weights (operands read from parameters, ``get_attr`` nodes) are not sketched
in the graph: :class:`Recorder` sketches them once per step, whatever the
number of forward calls, and only if a weight changed since (a frozen
model's weights are sketched once per run).  :class:`Recorder` also reads a step's sketches back
to the host once (one ``torch.cat(...).cpu()``), never per op, and can record
only every k-th step.

Every injection runs a correctness gate: ``torch.testing.assert_close`` of
each of the injected module's own outputs against the original model's on the
example inputs; a mismatch raises :class:`InjectionError`.

Private API pinned by ``tests/test_opscope_inject.py``: an exported module
re-packs its flat outputs into the model's output class through
``graph._codegen.pytree_info.out_spec``; it is cleared so that the extra
output survives (measured, torch 2.13).
"""
from __future__ import annotations

import functools
import inspect
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.fx as fx
import torch.nn.functional as F
import torch.utils._pytree as pytree

from goblin_assets.errors import GoblinError
from goblin_assets.opscope.sketches import (
    ROW_SAMPLE, STATS, probs_layout, probs_vector, route_layout, route_vector, sketch_layout, sketch_length,
    sketch_vector,
)
from goblin_assets.warehouse.frames import text

aten = torch.ops.aten

#: Columns of the rows a :class:`Recorder` emits (the ``sketches`` table minus run columns).
ROW_COLUMNS = ["step", "site", "role", "stat", "idx", "value", "M", "K", "N", "numel"]


class InjectionError(GoblinError):
    """The graph could not be captured, or the injected graph changed the model's output."""


# ----------------------------------------------------------------- site discovery

#: aten (export) and fx function targets of matmul sites -> (lhs arg, rhs arg, rhs is (N, K))
_MATMUL_FUNCS: dict = {
    aten.linear.default: (0, 1, True), F.linear: (0, 1, True),
    aten.matmul.default: (0, 1, False), torch.matmul: (0, 1, False), operator.matmul: (0, 1, False),
    aten.mm.default: (0, 1, False), torch.mm: (0, 1, False),
    aten.bmm.default: (0, 1, False), torch.bmm: (0, 1, False),
    aten.addmm.default: (1, 2, False), torch.addmm: (1, 2, False),
    aten.baddbmm.default: (1, 2, False), torch.baddbmm: (1, 2, False),
}
_MATMUL_METHODS = {"matmul": (0, 1), "mm": (0, 1), "bmm": (0, 1), "__matmul__": (0, 1)}
_SOFTMAX_FUNCS = {aten.softmax.int: 1, aten._softmax.default: 1, torch.softmax: 1, F.softmax: 1}
_TOPK_FUNCS = {aten.topk.default, torch.topk}
#: fused attention: no softmax node exists to tap
_SDPA = re.compile(r"scaled_dot_product|flash_attention|efficient_attention")


@dataclass(frozen=True)
class SiteFilter:
    """Which sites to tap: by name pattern and by tensor size.

    ``include``/``exclude`` are regular expressions searched in the site name
    (e.g. ``r"encoder\\.layer\\.[0-2]\\."``); a site is kept when its largest
    tapped tensor has ``min_numel <= numel <= max_numel`` elements.
    """

    include: str | None = None
    exclude: str | None = None
    min_numel: int = 0
    max_numel: int | None = None

    def keep(self, site: str, numel: int) -> bool:
        if self.include and not re.search(self.include, site):
            return False
        if self.exclude and re.search(self.exclude, site):
            return False
        return numel >= self.min_numel and (self.max_numel is None or numel <= self.max_numel)


@dataclass
class Tap:
    """One (site, role) record: where its values sit and what they describe.

    ``source`` is the graph node read (activations) or the parameter's
    qualified name (weights, sketched once per step by :class:`Recorder`).
    ``layout`` is ``[(stat, idx array), ...]`` in value order.
    """

    site: str
    op: str                       # linear, matmul, mm, bmm, addmm, baddbmm, softmax, topk
    role: str                     # lhs | rhs | out | probs | route
    M: int
    K: int
    N: int
    numel: int
    layout: list
    source: object                # fx.Node or parameter name (str)
    offset: int = -1              # position in the packed (graph) or weight vector

    @property
    def length(self) -> int:
        return int(sum(len(i) for _, i in self.layout))


@dataclass
class Gate:
    """Result of the correctness gate: injected outputs vs the model's own."""

    passed: bool
    outputs_compared: int
    max_abs_diff: float
    message: str = ""


@dataclass
class InjectedModel:
    """A model whose graph returns ``(*own outputs, packed sketches)``.

    ``module`` is the injected ``GraphModule``; ``plain`` the captured graph
    without taps (same parameters), used on steps that are not recorded.
    ``taps`` are the in-graph records (offsets into the packed vector),
    ``weight_taps`` the parameter records (offsets into :meth:`weight_vector`).
    Site names: the issuing module's qualified name for a linear layer
    (``encoder.layer.0.attention.self.query``), ``path:op_k`` for the k-th
    other op of a module (``encoder.layer.0.attention.self:matmul_1``,
    ``...:softmax_0``), ``op_k`` at the root.
    """

    module: fx.GraphModule
    plain: torch.nn.Module
    frontend: str                 # export | fx
    taps: list[Tap]
    weight_taps: list[Tap]
    out_spec: object              # pytree spec of the model's own outputs
    n_outputs: int
    packed_length: int
    weight_length: int
    weight_names: list[str]
    gate: Gate
    notes: list[str] = field(default_factory=list)
    stats: tuple[str, ...] = STATS
    row_sample: int | None = ROW_SAMPLE
    _weight_cache: tuple | None = field(default=None, repr=False)

    @property
    def sites(self) -> list[str]:
        """Site names in graph order (each once)."""
        return list(dict.fromkeys(t.site for t in self.taps + self.weight_taps))

    def ops(self) -> dict[str, str]:
        """site -> op (``linear``, ``matmul``, ``softmax``, ...)."""
        return {t.site: t.op for t in self.taps + self.weight_taps}

    def __call__(self, *args, **kwargs) -> tuple[object, torch.Tensor]:
        """Run the injected graph: ``(the model's own output, packed sketches)``.

        Shapes: packed is float64 ``(packed_length,)`` on the model's device.
        """
        out = self.module(*args, **kwargs)
        return pytree.tree_unflatten(list(out[:-1]), self.out_spec), out[-1]

    def weight_vector(self) -> torch.Tensor:
        """Sketches of every tapped parameter, concatenated (float64, on device; no host copy).

        Recomputed only when a weight changed since the last call (its tensor
        version counter, bumped by every in-place update such as
        ``optimizer.step()``, or a new tensor): a frozen model's weights are
        sketched once per run, a trained one's once per step.
        """
        ws = [_get_attr(self.module, n) for n in self.weight_names]
        key = tuple((id(w), w._version, w.data_ptr()) for w in ws)
        if self._weight_cache is None or self._weight_cache[0] != key:
            vec = (torch.cat([sketch_vector(w, self.stats, self.row_sample) for w in ws]) if ws
                   else torch.zeros(0, dtype=torch.float64))
            self._weight_cache = (key, vec)
        return self._weight_cache[1]

    def check(self, reference: Callable, *args, **kwargs) -> Gate:
        """The correctness gate on these inputs: ``reference(*args, **kwargs)`` vs the injected outputs.

        Raises
        ------
        InjectionError
            An output differs (``torch.testing.assert_close``), an output is
            missing, the injected graph raised, or the packed vector does not
            have the recorded length.
        """
        name = type(reference).__name__
        with torch.no_grad():
            ref = [t for t in pytree.tree_leaves(reference(*args, **kwargs)) if isinstance(t, torch.Tensor)]
            try:
                out = self.module(*args, **kwargs)
            except Exception as exc:  # whatever the inserted nodes raise: a typed, one-line error
                raise InjectionError(f"{name}: correctness gate: the injected graph failed to run: "
                                     f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
        own = [t for t in out[:-1] if isinstance(t, torch.Tensor)]
        if not ref or not own:
            raise InjectionError(f"{name}: no tensor output to compare; the gate cannot run")
        pairs = list(zip(ref, own)) if len(ref) == len(own) else [(ref[0], own[0])]
        worst = 0.0
        for i, (a, b) in enumerate(pairs):
            try:
                torch.testing.assert_close(b, a)
            except AssertionError as exc:
                first = " ".join(ln.strip() for ln in str(exc).strip().splitlines()[:4] if ln.strip())
                raise InjectionError(f"{name}: correctness gate failed: injected output {i} differs from the "
                                     f"model's own ({len(self.taps)} taps, frontend {self.frontend}): "
                                     f"{first}") from None
            if a.numel():
                worst = max(worst, float((a.double() - b.double()).abs().max()))
        if int(out[-1].numel()) != self.packed_length:
            raise InjectionError(f"{name}: packed sketches have {out[-1].numel()} values, "
                                 f"layout expects {self.packed_length}")
        return Gate(True, len(pairs), worst)


def _get_attr(mod: torch.nn.Module, target: str):
    return functools.reduce(getattr, target.split("."), mod)


def _shape(node) -> tuple[int, ...] | None:
    """Static shape of a graph value (export: meta['val']; fx: ShapeProp's tensor_meta)."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    if val is None and "tensor_meta" in node.meta:
        val = node.meta["tensor_meta"]
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except TypeError:  # symbolic sizes: not a static shape
        return None


def _module_path(node: fx.Node) -> str:
    """Qualified name of the module that issued ``node`` ('' for the root)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if stack:
        return str(list(stack.values())[-1][0])
    return ""


def _mkn(lhs: tuple[int, ...], rhs: tuple[int, ...], transposed: bool) -> tuple[int, int, int]:
    """(M, K, N) of ``lhs @ rhs`` (``rhs`` of shape (N, K) when ``transposed``), batch folded into M."""
    k = lhs[-1] if lhs else 1
    m = int(np.prod(lhs)) // max(k, 1) if lhs else 1
    if transposed:
        n = rhs[0] if len(rhs) == 2 else 1
    else:
        n = rhs[-1] if len(rhs) >= 2 else 1
    return m, k, n


def _classify(node: fx.Node, gm: fx.GraphModule):
    """``(kind, op, detail)`` for a tappable node, else None.

    matmul: detail = (lhs, rhs, transposed) where lhs/rhs are nodes or parameter names;
    softmax: detail = dim; topk: detail = n_experts.
    """
    t = node.target
    if node.op == "call_function":
        if t in _MATMUL_FUNCS:
            li, ri, tr = _MATMUL_FUNCS[t]
            return "matmul", _opname(t), (node.args[li], node.args[ri], tr)
        if t in _SOFTMAX_FUNCS:
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
            return "softmax", "softmax", dim
        if t in _TOPK_FUNCS:
            return "topk", "topk", _topk_experts(node)
    elif node.op == "call_method":
        if t in _MATMUL_METHODS:
            return "matmul", t.strip("_"), (node.args[0], node.args[1], False)
        if t == "softmax":
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
            return "softmax", "softmax", dim
        if t == "topk":
            return "topk", "topk", _topk_experts(node)
    elif node.op == "call_module":
        mod = gm.get_submodule(str(t))
        if isinstance(mod, torch.nn.Linear):
            return "matmul", "linear", (node.args[0], f"{t}.weight", True)
        if isinstance(mod, torch.nn.Softmax):
            return "softmax", "softmax", mod.dim if mod.dim is not None else -1
    return None


def _opname(target) -> str:
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0].strip("_") or str(target)


def _topk_experts(node: fx.Node) -> int:
    shape = _shape(node.args[0])
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)
    return int(shape[dim]) if shape else 0


def _capture(model, args: tuple, kwargs: dict) -> tuple[fx.GraphModule, str, list[str]]:
    """(GraphModule, frontend, notes): torch.export first, torch.fx on failure."""
    if isinstance(model, torch.export.ExportedProgram):
        return model.module(), "export", []
    if isinstance(model, fx.GraphModule):
        return model, "fx", []
    notes = []
    try:
        return torch.export.export(model, args, kwargs).module(), "export", notes
    except Exception as exc:  # torch raises many types here; we fall back and say why
        notes.append(f"torch.export failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                     f"fell back to torch.fx.symbolic_trace")
    try:
        return fx.symbolic_trace(model), "fx", notes
    except Exception as exc:
        raise InjectionError(f"{type(model).__name__}: neither torch.export nor torch.fx can capture the graph: "
                             f"{notes[0]}; fx: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None


def _propagate_shapes(gm: fx.GraphModule, args: tuple, kwargs: dict) -> None:
    """fx graphs carry no shapes: run ShapeProp on the example inputs (positional order)."""
    from torch.fx.passes.shape_prop import ShapeProp

    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        bound = inspect.signature(gm.forward).bind(*args, **kwargs)
        bound.apply_defaults()
        flat = [bound.arguments[str(n).lstrip("*")] for n in names]
    except (TypeError, KeyError):
        flat = list(args)
    ShapeProp(gm).propagate(*flat)


def _flat_outputs(graph: fx.Graph):
    """(output node, leaves, pytree spec of the model's own outputs)."""
    out = next(n for n in graph.nodes if n.op == "output")
    cg = graph._codegen
    info = getattr(cg, "pytree_info", None)
    if info is not None and info.out_spec is not None:
        return out, list(out.args[0]), info.out_spec
    leaves, spec = pytree.tree_flatten(out.args[0])
    return out, leaves, spec


def _inject(model, args: tuple, kwargs: dict, kinds: set[str], stats: tuple[str, ...],
            row_sample: int | None, site_filter: SiteFilter | None) -> InjectedModel:
    stats = tuple(stats)
    sketch_layout((2, 2), stats, row_sample)  # validates the names before any capture
    plain, frontend, notes = _capture(model, args, kwargs)
    if frontend == "fx":
        _propagate_shapes(plain, args, kwargs)

    # a copy of the graph sharing the parameters; the plain module stays untouched
    graph = fx.Graph()
    val_map: dict = {}
    graph.output(graph.graph_copy(plain.graph, val_map))
    cg = plain.graph._codegen
    info = getattr(cg, "pytree_info", None)
    if info is not None:
        graph._codegen = type(cg)(info)
    out_node, leaves, out_spec = _flat_outputs(graph)

    flt = site_filter or SiteFilter()
    taps: list[Tap] = []
    counts: dict[tuple[str, str], int] = {}
    sdpa = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and _SDPA.search(str(node.target)):
            sdpa += 1
        c = _classify(node, plain)
        if c is None or c[0] not in kinds:
            continue
        kind, op, detail = c
        path = _module_path(node)
        k = counts.get((path, op), 0)
        counts[(path, op)] = k + 1
        site = path if (op == "linear" and k == 0 and path) else (f"{path}:{op}_{k}" if path else f"{op}_{k}")
        taps += _taps_of(node, kind, op, detail, site, stats, row_sample, flt, plain)

    if "softmax" in kinds and not any(t.role == "probs" for t in taps) and sdpa:
        notes.append(f"{type(model).__name__} uses fused scaled_dot_product_attention ({sdpa} nodes): no softmax "
                     f"node exists, so no attention taps; load it with attn_implementation='eager' to tap softmax")

    # one reduction node per distinct (tensor, sketch function); weights go to the per-step weight vector
    slots: dict = {}
    packed_nodes: list[fx.Node] = []
    packed_offsets: list[int] = []
    offset = 0
    weight_names: list[str] = []
    woffset = 0
    weight_offsets: dict[str, int] = {}
    graph_taps, weight_taps = [], []
    for t in taps:
        if isinstance(t.source, str):
            if t.source not in weight_offsets:
                weight_offsets[t.source] = woffset
                weight_names.append(t.source)
                woffset += t.length
            t.offset = weight_offsets[t.source]
            weight_taps.append(t)
            continue
        src, fn, fkw, consumer = t.source
        key = (src, fn, tuple(sorted(fkw.items())))
        if key not in slots:
            # operands: just before their first tapped consumer (the value it reads, still in cache);
            # outputs: just after the op
            where = graph.inserting_after(src) if consumer is src else graph.inserting_before(consumer)
            with where:
                n = graph.call_function(fn, (src,), fkw)
            packed_nodes.append(n)
            packed_offsets.append(offset)
            slots[key] = offset
            offset += t.length
        t.offset = slots[key]
        t.source = src.name
        graph_taps.append(t)

    if not graph_taps and not weight_taps:
        raise InjectionError(f"{type(model).__name__}: no site to tap ({sorted(kinds)}; filter {flt})"
                             + (f"; {notes[-1]}" if notes else ""))
    if packed_nodes:
        # one packed vector per forward, allocated before the first sketch; each sketch writes its slice
        members = set(packed_nodes)
        first = next(n for n in graph.nodes if n in members)
        with graph.inserting_before(first):
            buf = graph.call_function(_packed_buffer, (first.args[0], offset))
        for n, off in zip(packed_nodes, packed_offsets):
            n.args = (n.args[0], buf, off)
        with graph.inserting_before(out_node):
            packed = graph.call_function(_packed_done, (buf, *packed_nodes))
    else:
        with graph.inserting_before(out_node):
            packed = graph.call_function(torch.zeros, (0,), {"dtype": torch.float64})
    out_node.args = (tuple(leaves) + (packed,),)
    if info is not None:  # private API (pinned by a test): keep the extra output, return a flat tuple
        graph._codegen = type(cg)(info._replace(out_spec=None))
    graph.lint()
    gm = fx.GraphModule(plain, graph)

    inj = InjectedModel(gm, plain, frontend, graph_taps, weight_taps, out_spec, len(leaves), offset, woffset,
                        weight_names, Gate(False, 0, float("nan")), notes, stats, row_sample)
    reference = model if isinstance(model, torch.nn.Module) and not isinstance(model, fx.GraphModule) else plain
    inj.gate = inj.check(reference, *args, **kwargs)
    return inj


def _packed_buffer(like: torch.Tensor, n: int) -> torch.Tensor:
    """The step's packed sketch vector: float64 ``(n,)`` on ``like``'s device, filled by the ``_*_into`` nodes.

    One allocation per forward, made before the first sketch: ~100 small
    result tensors kept alive until a final ``torch.cat`` would sit between
    the model's large activations on the CPU heap, and glibc then returns and
    re-faults tens of MB of pages per forward (measured on MiniLM: 18,000 to
    116,000 minor faults per injected forward, none in the plain one).
    """
    return torch.empty(n, dtype=torch.float64, device=like.device)


def _sketch_into(x: torch.Tensor, buf: torch.Tensor, offset: int, **kw) -> None:
    """Write :func:`sketch_vector` of ``x`` into ``buf[offset:]`` (the fused kernel writes there directly)."""
    length = sketch_length(x.shape, kw.get("stats", STATS), kw.get("row_sample", ROW_SAMPLE))
    sketch_vector(x, out=buf.narrow(0, offset, length), **kw)


def _probs_into(p: torch.Tensor, buf: torch.Tensor, offset: int, **kw) -> None:
    """Write :func:`probs_vector` of ``p`` into ``buf[offset:]``."""
    v = probs_vector(p, **kw)
    buf.narrow(0, offset, v.numel()).copy_(v)


def _route_into(idx, buf: torch.Tensor, offset: int, **kw) -> None:
    """Write :func:`route_vector` of a top-k result into ``buf[offset:]``."""
    v = route_vector(idx, **kw)
    buf.narrow(0, offset, v.numel()).copy_(v)


def _packed_done(buf: torch.Tensor, *written) -> torch.Tensor:
    """``buf`` once every sketch node (``written``, their None results) has run."""
    return buf


def _operand(x, root: torch.nn.Module):
    """(source, shape): a parameter's qualified name for get_attr nodes and names, else the node."""
    if isinstance(x, fx.Node) and x.op == "get_attr":
        x = str(x.target)
    if isinstance(x, str):
        try:
            return x, tuple(int(s) for s in _get_attr(root, x).shape)
        except AttributeError:
            return x, None
    return x, _shape(x)


def _taps_of(node: fx.Node, kind: str, op: str, detail, site: str, stats, row_sample, flt: SiteFilter,
             root: torch.nn.Module) -> list[Tap]:
    """The taps of one site (empty when the filter drops it or shapes are unknown)."""
    if kind == "matmul":
        lhs, rhs, transposed = detail
        lhs, ls = _operand(lhs, root)
        rhs, rs = _operand(rhs, root)
        os_ = _shape(node)
        if ls is None or rs is None or os_ is None:
            return []
        m, k, n = _mkn(ls, rs, transposed)
        numels = [int(np.prod(s)) for s in (ls, rs, os_)]
        if not flt.keep(site, max(numels)):
            return []
        out = []
        kw = {"stats": stats, "row_sample": row_sample}
        for role, src, shp, ne in (("lhs", lhs, ls, numels[0]), ("rhs", rhs, rs, numels[1]),
                                   ("out", node, os_, numels[2])):
            lay = sketch_layout(shp, stats, row_sample)
            source = src if isinstance(src, str) else (src, _sketch_into, kw, node)
            out.append(Tap(site, op, role, m, k, n, ne, lay, source))
        return out
    if kind == "softmax":
        shp = _shape(node)
        if shp is None or not flt.keep(site, int(np.prod(shp))):
            return []
        dim = int(detail)
        keys = shp[dim] if shp else 1
        ne = int(np.prod(shp))
        return [Tap(site, op, "probs", ne // max(keys, 1), keys, 0, ne, probs_layout(shp, dim),
                    (node, _probs_into, {"dim": dim}, node))]
    if kind == "topk":
        n_exp = int(detail)
        shp = _shape(node.args[0])
        if not n_exp or shp is None or not flt.keep(site, int(np.prod(shp))):
            return []
        kk = int(node.args[1]) if len(node.args) > 1 else int(node.kwargs.get("k", 1))
        tokens = int(np.prod(shp)) // n_exp
        return [Tap(site, op, "route", tokens, kk, n_exp, tokens * kk, route_layout(n_exp),
                    (node, _route_into, {"n_experts": n_exp}, node))]
    return []


def inject_matmul_stats(model_or_graph, example_inputs: tuple = (), example_kwargs: dict | None = None, *,
                        sketches: tuple[str, ...] = STATS, site_filter: SiteFilter | None = None,
                        row_sample: int | None = ROW_SAMPLE, infer: bool = False) -> InjectedModel:
    """Append sketches of every matmul's lhs, rhs and out to the model's graph.

    Parameters
    ----------
    model_or_graph
        An ``nn.Module`` (captured with ``torch.export``, or ``torch.fx`` if
        export fails), an ``ExportedProgram`` or an fx ``GraphModule``.  Must be
        deterministic on the example inputs (call ``.eval()`` first) for the
        gate to mean anything.
    example_inputs, example_kwargs
        Positional and keyword inputs: used to capture the graph, fix the
        shapes (the layout is static) and run the correctness gate.
    sketches
        Statistic names from :data:`goblin_assets.opscope.sketches.STATS`.
    site_filter
        Keep only some sites (by name pattern and tensor size).
    row_sample
        Rows kept by the row-sampled sketches (``None``: all exact).
    infer
        Also tap softmax outputs and top-k routing (:func:`inject_infer_stats`).

    Returns
    -------
    InjectedModel
        Calling it returns ``(model output, packed sketches)``; ``gate`` holds
        the gate's result, ``notes`` the export fallback and SDPA remarks.

    Shapes
    ------
    packed: float64 ``(packed_length,)``; see :class:`Recorder` for the rows.

    Raises
    ------
    InjectionError
        The graph cannot be captured, no site is left to tap, or the
        correctness gate fails (the injected graph changed an output).
    goblin_assets.opscope.sketches.SketchError
        An unknown statistic name.

    Source
    ------
    Graph capture: ``torch.export`` (https://pytorch.org/docs/stable/export.html);
    the out-spec clearing: measured (``docs/measured_facts.md`` "Graph-rewrite taps").
    """
    kinds = {"matmul", "softmax", "topk"} if infer else {"matmul"}
    return _inject(model_or_graph, tuple(example_inputs), dict(example_kwargs or {}), kinds, sketches, row_sample,
                   site_filter)


def inject_infer_stats(model_or_graph, example_inputs: tuple = (), example_kwargs: dict | None = None, *,
                       site_filter: SiteFilter | None = None) -> InjectedModel:
    """Tap softmax outputs (role ``probs``) and top-k routing decisions (role ``route``).

    Softmax taps give, per site, ``peak_prob`` (per query) and ``key_mass``
    (per key) (:func:`goblin_assets.opscope.sketches.probs_vector`); top-k taps
    give ``expert_load`` per expert (:func:`goblin_assets.opscope.sketches.route_vector`).
    A model whose attention runs as fused ``scaled_dot_product_attention`` has
    no softmax node: ``notes`` says so (load it with eager attention).

    Shapes
    ------
    probs: ``(Q + K,)`` per softmax site; route: ``(n_experts,)`` per top-k site.

    Raises
    ------
    InjectionError
        As :func:`inject_matmul_stats`; also when there is no softmax or top-k
        node at all (the message says whether SDPA is the reason).

    Source
    ------
    H2O (attention mass), StreamingLLM (sinks), Switch Transformer (expert load).
    """
    return _inject(model_or_graph, tuple(example_inputs), dict(example_kwargs or {}), {"softmax", "topk"}, STATS,
                   ROW_SAMPLE, site_filter)


# ----------------------------------------------------------------- recording


class Recorder:
    """Run an :class:`InjectedModel` step by step and turn its sketches into tidy rows.

    ``rec(*args, **kwargs)`` runs one forward and returns the model's own
    output; sketches stay on the device.  ``rec.flush()`` ends the step: the
    weight sketches (computed once, at the step's first forward) and every
    forward's packed vector are concatenated and copied to the host in one
    transfer, and the step's rows are returned (columns :data:`ROW_COLUMNS`).
    A second forward in the same step gets site names ``site#1``, ``site#2``.
    With ``every=k`` only steps 0, k, 2k, ... are recorded; the others run the
    plain graph (no taps at all) and their ``flush`` returns an empty frame
    (no read-back, no row building).  The rows of a one-forward step are
    laid out once per recorder (only the values and the step are new per
    step); :meth:`memory` states the bytes the recorder holds.

    Units: ``readbacks`` counts device-to-host transfers (one per recorded step).
    """

    def __init__(self, injected: InjectedModel, every: int = 1):
        if every < 1:
            raise ValueError(f"Recorder: every must be >= 1, got {every}")
        self.injected = injected
        self.every = every
        self.step = 0
        self.readbacks = 0
        self._pending: list[torch.Tensor] = []
        self._weights: torch.Tensor | None = None
        self._templates = _templates(injected)
        self._one = _one_call_columns(*self._templates, injected.weight_length)
        self._empty = self._templates[1].iloc[:0].assign(value=0.0, step=0)[ROW_COLUMNS]

    @property
    def recording(self) -> bool:
        """Whether the current step is recorded."""
        return self.step % self.every == 0

    def __call__(self, *args, **kwargs):
        if not self.recording:
            return self.injected.plain(*args, **kwargs)
        if self._weights is None:
            self._weights = self.injected.weight_vector()
        out, packed = self.injected(*args, **kwargs)
        self._pending.append(packed)
        return out

    def flush(self) -> pd.DataFrame:
        """End the step; the step's rows (empty when the step was not recorded)."""
        step, self.step = self.step, self.step + 1
        if self._weights is None and not self._pending:
            return self._empty.copy()       # an unrecorded step: no Python work beyond this
        w = self._weights if self._weights is not None else self.injected.weight_vector()
        vals = torch.cat([w.to(self._pending[0].device) if self._pending else w] + self._pending).cpu().numpy()
        self.readbacks += 1
        n_calls = len(self._pending)
        self._pending, self._weights = [], None
        if n_calls == 1 and len(w) == self.injected.weight_length:
            # the common step (one forward): the rows' columns were laid out once, only the values are new
            cols, pos = self._one
            n = len(pos)
            return pd.DataFrame({"step": np.full(n, step, dtype=np.int64), **{k: c() for k, c in cols.items()},
                                 "value": vals[pos]}, columns=ROW_COLUMNS, copy=False)
        wt, gt = self._templates
        frames = []
        if len(wt):
            frames.append(wt.assign(value=vals[wt["pos"].to_numpy()]))
        base = len(w)
        for call in range(n_calls):
            f = gt.assign(value=vals[base + gt["pos"].to_numpy()])
            if call:
                f["site"] = f["site"] + f"#{call}"
            frames.append(f)
            base += self.injected.packed_length
        df = pd.concat(frames, ignore_index=True) if frames else self._templates[1].iloc[:0].assign(value=0.0)
        df["step"] = step
        return df[ROW_COLUMNS]

    def memory(self) -> dict[str, int]:
        """Bytes the recorder holds, by part; every part is fixed by the graph's layout (bounded).

        ``packed_per_forward``: the float64 vector one recorded forward fills
        (``packed_length`` values); ``weights``: the weight sketches (computed
        once per step, cached while the weights do not change); ``per_step``:
        what a recorded step with one forward holds until :meth:`flush`
        (``packed_per_forward + weights``; each further forward in the step
        adds ``packed_per_forward``); ``scratch``: the fused kernel's work
        buffers of this thread (:func:`goblin_assets.opscope.ckernel.scratch_bytes`;
        sized by the largest tensor sketched so far, reused); ``templates``:
        the row templates (host, built once); ``rows_per_step``: the number of
        rows :meth:`flush` returns for a one-forward step.  Units: bytes
        (``rows_per_step``: rows).  Unrecorded steps hold nothing.
        """
        from goblin_assets.opscope import ckernel

        packed = 8 * self.injected.packed_length
        weights = 8 * self.injected.weight_length
        tmpl = sum(int(t.memory_usage(deep=True).sum()) for t in self._templates)
        return {"packed_per_forward": packed, "weights": weights, "per_step": packed + weights,
                "scratch": ckernel.scratch_bytes(), "templates": tmpl, "rows_per_step": len(self._one[1])}


def _one_call_columns(wt: pd.DataFrame, gt: pd.DataFrame, weight_length: int) -> tuple[dict, np.ndarray]:
    """The columns of a one-forward step's rows but ``step`` and ``value``, laid out once per recorder.

    Returns ``({column: () -> array}, pos)``: each column's maker gives a fresh
    array for the step's frame (numbers copied, so that a caller editing its
    frame never edits the template; the Arrow text columns are immutable and
    shared), ``pos`` the position of each row's value in the step's
    read-back vector (weight sketches first, then the forward's packed
    vector).  Rows in the order of the general path (weights, then the
    graph's taps).
    """
    both = pd.concat([wt, gt], ignore_index=True)
    pos = np.concatenate([wt["pos"].to_numpy(dtype=np.int64), weight_length + gt["pos"].to_numpy(dtype=np.int64)])
    cols: dict = {}
    for k in ROW_COLUMNS:
        if k in ("step", "value"):
            continue
        arr = both[k].array if k in ("site", "role", "stat") else both[k].to_numpy()
        cols[k] = (lambda a=arr: a) if k in ("site", "role", "stat") else (lambda a=arr: a.copy())
    return cols, pos


def _templates(inj: InjectedModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Row templates (site, role, stat, idx, M, K, N, numel, pos) for weight taps and graph taps.

    Built once per recorder; text columns are Arrow strings
    (:func:`goblin_assets.warehouse.frames.text`), so a step's rows reach the
    warehouse with no per-cell conversion.
    """
    out = []
    for taps in (inj.weight_taps, inj.taps):
        stats, counts, idxs = [], [], []
        for t in taps:
            for stat, idx in t.layout:
                stats.append(stat)
                counts.append(len(idx))
                idxs.append(np.asarray(idx, dtype=np.int64))
        per_tap = [t.length for t in taps]
        # a tap's values are consecutive from its offset (taps of one tensor share the offset)
        first = np.repeat(np.array([t.offset for t in taps], dtype=np.int64), per_tap)
        starts = np.cumsum([0] + per_tap)[:-1]
        within = np.arange(sum(per_tap), dtype=np.int64) - np.repeat(starts, per_tap).astype(np.int64)
        ints = {k: np.repeat(np.array([getattr(t, k) for t in taps], dtype=np.int64), per_tap)
                for k in ("M", "K", "N", "numel")}
        out.append(pd.DataFrame({
            "site": text([t.site for t in taps], per_tap), "role": text([t.role for t in taps], per_tap),
            "stat": text(stats, counts), "idx": np.concatenate(idxs) if idxs else np.zeros(0, dtype=np.int64),
            **ints, "pos": first + within}))
    return out[0], out[1]
