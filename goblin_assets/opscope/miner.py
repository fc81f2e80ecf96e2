"""mine_patterns: turn tidy sketch rows into findings (first matching rule wins).

Per (run, workload, dist, site, role), each statistic averaged over steps, the
rules of the original recording harness (issue 7) are tried in order and the
first that matches is the site's finding:

=====  =============================================  ==============  ====================================
order  rule                                           finding         score
=====  =============================================  ==============  ====================================
1      density nnz/numel < 0.5                        sparse_gemm     1 − density
2      outlier ratio max/mean of chan_maxabs > 6      int_quant       1 − 6/ratio
3      top-bin share of the non-zero values > 0.25    quantize_lut    that share
4      mean(adj_sumsq)/mean(pos_sumsq) < 0.5, and     delta_compute   1 − ratio
       mean(adj_sumsq)/far_sumsq < 0.5 (when
       recorded)
5      CV of pos_sumsq across positions > 0.75        positional      cv / (1 + cv)
6      otherwise                                      dense_not_observable  0
=====  =============================================  ==============  ====================================

Rule 3 removes the exact zeros from the histogram first (they all fall in
bin 16, the one holding 0, and their share is ``1 − density``): a ReLU
output's zero spike is sparsity, judged by rule 1, not a few quantisation
levels (measured: post-ReLU digits activations at density 0.52 have a raw
top-bin share of 0.57 and 0.17–0.18 without their zeros).  Rule 4 asks for
row *order*: adjacent rows must also differ much less than rows half the
tensor apart (``far_sumsq``).  Rows that are alike only because they share a
per-channel offset (a shuffled batch early in training) give a low
``adj/pos`` ratio but ``adj/far`` near 1 (measured on the digits MLP:
adjacent pairs and randomly re-paired rows give the same ratio, and the
mean-centred ratio is ~2, as for independent rows); delta compute needs
adjacent rows to be alike, not all rows.  Rows recorded without
``far_sumsq`` get the old rule and an ``adj_order_note`` in the evidence.

A rule whose statistic was not recorded is skipped, and the evidence of the
finding says which rules were skipped and why, so that a ``dense_not_observable``
from scalar-only sketches is never mistaken for a measured "nothing to exploit".
LLM.int8()-style absolute outliers (|x| >= 6: how many channels, and the share
of positions when a per-position max is recorded) are reported in the
evidence whenever ``chan_maxabs`` exists.

Cross-step section: the coefficient of variation of ``l1`` across steps
``< 1e-4`` -> ``stationary`` (prepack/precompute: weights), else ``drifting``
(temporal coherence: activations).  Needs at least two steps.

Softmax (``probs``) and routing (``route``) rows are not mined here; see
:mod:`goblin_assets.opscope.infer`.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from goblin_assets.opscope.sketches import HIST_BINS
from goblin_assets.warehouse.tables import columns

#: nnz/numel below this: zero-skipping / sparse GEMM pays.  Source: harness threshold (issue 7);
#: vendor sparse GEMMs (cuSPARSE, hipSPARSE) need well over 50% zeros to beat dense GEMM.
SPARSE_DENSITY = 0.5
#: max/mean of per-channel absmax above this: per-channel int quantisation.  Source: harness threshold
#: (issue 7); the same magnitude as LLM.int8()'s outlier threshold (Dettmers et al. 2022, sec. 3.2).
OUTLIER_RATIO = 6.0
#: |x| at or above this is an LLM.int8() outlier feature.  Source: Dettmers et al., "LLM.int8()", NeurIPS 2022, sec. 4.
INT8_ABS_OUTLIER = 6.0
#: top-bin share of the 32-bin histogram above this: few distinct levels, quantise / LUT.  Source: harness (issue 7).
TOP_BIN_SHARE = 0.25
#: adjacent-row energy ratio below this: rows change little, delta compute.  Source: harness (issue 7).
ADJ_RATIO = 0.5
#: adjacent-pair over far-pair difference energy below this: row order matters (delta compute).  Rows in no
#: order give ~1 (measured 0.93-1.07 on the digits MLP's shuffled batches); chosen as ADJ_RATIO's twin.
ADJ_ORDER = 0.5
#: CV of per-position energy above this: sequence/positional structure.  Source: harness (issue 7).
POS_CV = 0.75
#: CV of l1 across steps below this: the tensor does not change.  Source: harness (issue 7).
STATIONARY_CV = 1e-4

SCALARS = ("min", "max", "mean", "l1", "sumsq", "nnz", "kurtosis", "chan_outlier")
_LOW_RANK_NOTE = "low rank is not observable from these sketches; a host probe is needed (goblin opscope probes)"


class _Rows:
    """One (site, role) group of sketch rows as numpy arrays per statistic, sorted by (step, idx) once."""

    def __init__(self, g: pd.DataFrame):
        self.g = g
        codes, names = pd.factorize(g["stat"])
        step, idx = g["step"].to_numpy(dtype=np.int64), g["idx"].to_numpy(dtype=np.int64)
        order = np.lexsort((idx, step, codes))
        codes, step, idx = codes[order], step[order], idx[order]
        val = g["value"].to_numpy(dtype=float)[order]
        numel = g["numel"].to_numpy(dtype=float)[order]
        cuts = np.flatnonzero(np.diff(codes)) + 1
        self.by = {names[c[0]]: (st, ix, v, n) for c, st, ix, v, n in
                   zip(np.split(codes, cuts), np.split(step, cuts), np.split(idx, cuts), np.split(val, cuts),
                       np.split(numel, cuts)) if len(c)}

    def vec(self, stat: str) -> dict[int, np.ndarray]:
        """Per step, the vector of ``stat`` ordered by idx (empty dict when not recorded)."""
        if stat not in self.by:
            return {}
        step, _, val, _ = self.by[stat]
        steps, starts = np.unique(step, return_index=True)
        return {int(s): v for s, v in zip(steps, np.split(val, starts[1:]))}

    def scal(self, stat: str, col: str = "value") -> pd.Series:
        """Per step, the scalar ``stat`` (idx 0), or the ``numel`` of its rows (``col="numel"``)."""
        if stat not in self.by:
            return pd.Series(dtype=float)
        step, idx, val, numel = self.by[stat]
        m = idx == 0
        steps, first = np.unique(step[m], return_index=True)
        return pd.Series((val if col == "value" else numel)[m][first], index=steps)


def _rows(g) -> _Rows:
    return g if isinstance(g, _Rows) else _Rows(g)


def site_stats(g: pd.DataFrame) -> tuple[dict, list[str]]:
    """The numbers the rules read, for one (site, role) group of rows; and the rules that cannot run.

    Returns
    -------
    (dict, list)
        ``density``, ``outlier_ratio``, ``top_bin_share`` (non-zero values),
        ``adj_ratio``, ``adj_far_ratio``, ``pos_cv`` (each averaged over steps;
        absent keys were not computable),
        plus ``absmax``, ``mean``, ``kurtosis``, ``steps`` and the LLM.int8()
        outlier counts; and the list of skipped rules with the reason.
    """
    r = _rows(g)
    ev: dict = {"steps": int(r.g["step"].nunique())}
    skipped: list[str] = []
    nnz, numel = r.scal("nnz"), r.scal("nnz", "numel")
    if len(nnz) and (numel > 0).all():
        ev["density"] = float((nnz / numel).mean())
    else:
        skipped.append("sparse_gemm: nnz not recorded")
    mn, mx = r.scal("min"), r.scal("max")
    if len(mn) and len(mx):
        ev["absmax"] = float(np.maximum(mx.abs(), mn.abs()).max())
    for stat in ("mean", "kurtosis"):
        v = r.scal(stat)
        if len(v):
            ev[stat] = float(v.mean())

    cmax = r.vec("chan_maxabs")
    co = r.scal("chan_outlier")
    if len(co):
        ev["outlier_ratio"] = float(co.mean())
    elif cmax:
        ev["outlier_ratio"] = float(np.mean([v.max() / max(v.mean(), 1e-30) for v in cmax.values()]))
    else:
        skipped.append("int_quant: neither chan_outlier nor chan_maxabs recorded")
    if cmax:
        ch = np.max(np.stack([v for v in cmax.values() if len(v) == len(next(iter(cmax.values())))]), axis=0)
        n_out = int((ch >= INT8_ABS_OUTLIER).sum())
        ev.update({"int8_outlier_channels": n_out, "int8_outlier_channel_share": n_out / max(len(ch), 1)})
        pmax = r.vec("pos_maxabs")
        if pmax:
            ev["int8_outlier_position_share"] = float(np.mean([(v >= INT8_ABS_OUTLIER).mean() for v in pmax.values()]))
        else:
            ev["int8_outlier_position_share"] = None
            ev["int8_position_note"] = "share of positions needs a per-position max (pos_maxabs), not recorded"

    hist = r.vec("hist")
    if hist:
        density = (nnz / numel) if len(nnz) and (numel > 0).all() else pd.Series(dtype=float)
        shares = []
        for step, h in hist.items():
            h = h.astype(float)
            if step in density.index and len(h) == HIST_BINS and h.sum() > 0:
                h = h / h.sum()
                h[HIST_BINS // 2] = max(h[HIST_BINS // 2] - (1.0 - float(density[step])), 0.0)  # the zeros' bin
            if h.sum() > 0:
                shares.append(h.max() / h.sum())
        ev["top_bin_share"] = float(np.mean(shares or [0.0]))
    else:
        skipped.append("quantize_lut: hist not recorded")

    pos, adj, far = r.vec("pos_sumsq"), r.vec("adj_sumsq"), r.scal("far_sumsq")
    if pos and adj:
        ratios, order = [], []
        for step, p in pos.items():
            a = adj.get(step)
            if a is None or len(p) < 2 or p.mean() <= 0:
                continue
            adj_mean = a[0] / (len(p) - 1) if (len(a) == 1 and len(p) > 2) else a.mean()
            ratios.append(adj_mean / p.mean())
            if step in far.index and far[step] > 0:
                order.append(adj_mean / far[step])
        if ratios:
            ev["adj_ratio"] = float(np.mean(ratios))
            if order:
                ev["adj_far_ratio"] = float(np.mean(order))
            else:
                ev["adj_order_note"] = "row order not checked: far_sumsq not recorded"
    if "adj_ratio" not in ev:
        skipped.append("delta_compute: adj_sumsq and pos_sumsq over >= 2 positions not recorded")
    if pos:
        cvs = [p.std() / p.mean() for p in pos.values() if len(p) >= 2 and p.mean() > 0]
        if cvs:
            ev["pos_cv"] = float(np.mean(cvs))
    if "pos_cv" not in ev:
        skipped.append("positional: pos_sumsq over >= 2 positions not recorded")
    return ev, skipped


def classify(ev: dict) -> tuple[str, float]:
    """First matching rule of the module table on :func:`site_stats` numbers: (finding, score)."""
    d = ev.get("density")
    if d is not None and d < SPARSE_DENSITY:
        return "sparse_gemm", 1.0 - d
    r = ev.get("outlier_ratio")
    if r is not None and r > OUTLIER_RATIO:
        return "int_quant", 1.0 - OUTLIER_RATIO / r
    t = ev.get("top_bin_share")
    if t is not None and t > TOP_BIN_SHARE:
        return "quantize_lut", t
    a, o = ev.get("adj_ratio"), ev.get("adj_far_ratio")
    if a is not None and a < ADJ_RATIO and (o is None or o < ADJ_ORDER):
        return "delta_compute", 1.0 - a
    c = ev.get("pos_cv")
    if c is not None and c > POS_CV:
        return "positional", c / (1.0 + c)
    return "dense_not_observable", 0.0


def stationarity(g: pd.DataFrame) -> tuple[str, float, dict] | None:
    """Cross-step finding from the CV of ``l1``: (stationary|drifting, score, evidence), or None (< 2 steps).

    The evidence also says whether the tensor repeats *exactly* (``exact_repeat``:
    every recorded scalar statistic, and the fixed ``sample`` elements when
    recorded, identical at every step).  A weight under small optimizer
    updates can have an l1 CV below 1e-4 and still change every step; only an
    exact repeat makes prepacking safe (the plan's guard reads this).
    """
    r = _rows(g)
    l1 = r.scal("l1").to_numpy(dtype=float)
    if len(l1) < 2:
        return None
    cv = float(np.std(l1) / (abs(np.mean(l1)) + 1e-30))
    label = "stationary" if cv < STATIONARY_CV else "drifting"
    checked = [st for st in SCALARS + ("sample",) if st in r.by]
    exact = True
    for st in checked:
        step, idx, val, _ = r.by[st]
        o = np.lexsort((step, idx))
        i, v = idx[o], val[o]
        same = i[1:] == i[:-1]
        _, counts = np.unique(i, return_counts=True)
        exact &= bool(np.array_equal(v[1:][same], v[:-1][same]) and (counts == len(l1)).all())
    ev = {"l1_cv": cv, "steps": int(len(l1)), "threshold": STATIONARY_CV, "exact_repeat": exact,
          "repeat_checked": checked}
    if label == "stationary" and not exact:
        ev["note"] = "l1 nearly constant but the values change (e.g. small optimizer updates): not an exact repeat"
    return label, 1.0 - min(cv, 1.0), ev


def mine_patterns(sketches: pd.DataFrame) -> pd.DataFrame:
    """Findings per (run, site, role) from tidy sketch rows.

    Parameters
    ----------
    sketches : rows of the ``sketches`` table (run_id, workload, step, site,
        role, stat, idx, value, numel; ``dist`` optional).  Roles ``probs`` and
        ``route`` are ignored (see :func:`goblin_assets.opscope.infer.infer_dynamics`).

    Returns
    -------
    DataFrame
        ``patterns`` rows: one per (run, site, role) with the first matching
        rule's finding (sparse_gemm, int_quant, quantize_lut, delta_compute,
        positional, dense_not_observable) and, with two or more steps, one
        stationary/drifting row.  ``evidence_json`` holds the numbers, the
        thresholds' rule and the rules skipped for lack of a statistic.  When
        one run records the same site under several ``dist`` values (a sweep),
        the site is reported as ``site@dist``.
    """
    df = sketches[~sketches["role"].isin(["probs", "route"])]
    if "dist" not in df.columns:
        df = df.assign(dist="")
    n_dist = df.groupby(["run_id", "site"])["dist"].transform("nunique")
    df = df.assign(_site=np.where(n_dist > 1, df["site"] + "@" + df["dist"].astype(str), df["site"]))
    out = []
    for (run_id, workload, site, role), g in df.groupby(["run_id", "workload", "_site", "role"], sort=False):
        rows = _Rows(g)
        ev, skipped = site_stats(rows)
        finding, score = classify(ev)
        if finding == "dense_not_observable":
            ev["note"] = _LOW_RANK_NOTE
        if skipped:
            ev["skipped"] = skipped
        out.append((run_id, workload, site, role, finding, score, ev))
        st = stationarity(rows)
        if st is not None:
            out.append((run_id, workload, site, role, st[0], st[1], st[2]))
    return pd.DataFrame(
        [{"run_id": r, "workload": w, "site": s, "role": ro, "finding": f, "score": float(sc),
          "evidence_json": json.dumps(e, default=float)} for r, w, s, ro, f, sc, e in out],
        columns=columns("patterns"))
