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

Non-finite values (section "Non-finite values" below): a (site, role) whose
tensor held a NaN or inf at some recorded step gets a ``nonfinite`` finding
(score: the largest share of non-finite elements in one step), and its other
findings are mined from its finite steps only (a step's NaN statistics would
otherwise decide every threshold).  Evidence numbers that are not finite are
written as JSON ``null`` (JSON has no NaN).

Softmax (``probs``) and routing (``route``) rows are not mined here; see
:mod:`goblin_assets.opscope.infer`.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from goblin_assets.opscope.sketches import HIST_BINS, NONFINITE_KINDS
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

#: The finding of a (site, role) whose tensor held NaN or inf at a recorded step (:func:`nonfinite_finding`).
NONFINITE = "nonfinite"
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
        positional, dense_not_observable) and, with two or more finite steps,
        one stationary/drifting row; plus one ``nonfinite`` row per (run,
        site, role) whose tensor held NaN or inf (:func:`nonfinite_finding`,
        ranked by :func:`_rank_nonfinite`: ``rank`` 0 is the run's first).
        ``evidence_json`` holds the numbers (strict JSON: non-finite ones are
        null), the thresholds' rule and the rules skipped for lack of a
        statistic.  When one run records the same site under several
        ``dist`` values (a sweep), the site is reported as ``site@dist``.
    """
    df = sketches[~sketches["role"].isin(["probs", "route"])]
    if "dist" not in df.columns:
        df = df.assign(dist="")
    n_dist = df.groupby(["run_id", "site"])["dist"].transform("nunique")
    df = df.assign(_site=np.where(n_dist > 1, df["site"] + "@" + df["dist"].astype(str), df["site"]),
                   _pos=np.arange(len(df)))
    out = []
    bad: dict[tuple, dict] = {}
    for (run_id, workload, site, role), g in df.groupby(["run_id", "workload", "_site", "role"], sort=False):
        rows = _Rows(g)
        nf = nonfinite_steps(rows)
        if nf:
            bad[(run_id, workload, site, role)] = nonfinite_finding(g, nf)
            g = g[~g["step"].isin(list(nf))]
            rows = _Rows(g) if len(g) else rows
        ev: dict = {}
        if len(g):
            ev, skipped = site_stats(rows)
            finding, score = classify(ev)
        else:
            finding, score, skipped = "dense_not_observable", 0.0, [
                "every rule: each recorded step held NaN or inf (see the nonfinite finding)"]
        if finding == "dense_not_observable":
            ev["note"] = _LOW_RANK_NOTE
        if skipped:
            ev["skipped"] = skipped
        if nf:
            ev["nonfinite_steps_left_out"] = sorted(nf)
        out.append((run_id, workload, site, role, finding, score, ev))
        st = stationarity(rows) if len(g) else None
        if st is not None:
            out.append((run_id, workload, site, role, st[0], st[1], st[2]))
    for key, ev in _rank_nonfinite(bad, _last_sites(df) if bad else {}).items():
        out.append((*key, NONFINITE, ev["max_share"] if ev["max_share"] is not None else 1.0, ev))
    return pd.DataFrame(
        [{"run_id": r, "workload": w, "site": s, "role": ro, "finding": f, "score": float(sc),
          "evidence_json": json.dumps(_json_safe(e), default=float, allow_nan=False)}
         for r, w, s, ro, f, sc, e in out],
        columns=columns("patterns"))


# ----------------------------------------------------------------- non-finite values

def nonfinite_steps(r: _Rows) -> dict[int, np.ndarray | None]:
    """Per recorded step whose tensor held a NaN or inf: its ``nonfinite`` counts (NaN, +inf, -inf), float ``(3,)``.

    From the ``nonfinite`` statistic when it was recorded (exact counts);
    for rows recorded before it existed, a step whose ``min`` or ``max`` is NaN
    or infinite (a NaN read back from the warehouse is a NULL, i.e. NaN here)
    is non-finite with unknown counts (None).  Steps with no non-finite value
    are absent.
    """
    out: dict[int, np.ndarray | None] = {}
    counts = r.vec("nonfinite")
    if counts:
        for step, v in counts.items():
            if (len(v) == len(NONFINITE_KINDS) and np.nansum(v) > 0) or not np.isfinite(v).all():
                out[step] = v.astype(float)
        return out
    for stat in ("min", "max"):
        for step, v in r.scal(stat).items():
            if not np.isfinite(v):
                out.setdefault(int(step), None)
    return out


def _fp_format(values: np.ndarray) -> str:
    """Which floating format the finite ``values`` are exactly representable in: ``fp16``, ``bf16``,
    ``fp16 or bf16`` (both, e.g. small integers), ``fp32 or wider`` (neither), or ``unknown`` (no finite value).

    A float32 tensor's values are almost never all exact in fp16 (a random
    float32 value is with probability ~2**-13): the 16 ``sample`` elements
    of an fp16 tensor, widened to float64 by the sketch, are.  A bf16 value
    (8 significant bits) within fp16's normal range is exact in fp16 too, so
    a bf16 tensor reads ``fp16 or bf16`` unless a value lies outside that
    range; ``fp16`` alone means a value needs more than 8 significant bits.
    """
    v = values[np.isfinite(values)]
    if not len(v):
        return "unknown"
    with np.errstate(over="ignore"):
        fp16 = bool(np.all(v.astype(np.float16).astype(np.float64) == v))
    f32 = v.astype(np.float32)
    bf16 = bool(np.all(f32.astype(np.float64) == v) and np.all((f32.view(np.uint32) & 0xFFFF) == 0))
    return {(True, False): "fp16", (False, True): "bf16", (True, True): "fp16 or bf16"}.get((fp16, bf16),
                                                                                           "fp32 or wider")


def nonfinite_finding(g: pd.DataFrame, steps: dict[int, np.ndarray | None]) -> dict:
    """Evidence of one (site, role) whose tensor held NaN or inf (``steps``: :func:`nonfinite_steps`).

    Keys: ``first_step`` (the first recorded step with a non-finite value;
    sketch steps count from 0 after the recording's warm-up), ``counts``
    (``nan``, ``posinf``, ``neginf`` at that step; null when not recorded),
    ``numel``, ``share`` (non-finite elements / numel at the first step),
    ``max_share`` (over steps), ``steps`` (every non-finite step),
    ``finite_steps_before`` (recorded steps before the first, all finite),
    ``absmax_before`` (max |x| at the last finite step before it: how close
    the values came to their format's range; null without one),
    ``sample_format`` (:func:`_fp_format` of the ``sample`` elements of every
    step) and ``order`` (the position of the group's first row at the
    first step in the frame: the tap appends rows in execution order).
    """
    r = _Rows(g)
    first = min(steps)
    numel = r.scal("min", "numel")
    n = float(numel.iloc[0]) if len(numel) else float(g["numel"].iloc[0])
    shares = [float(np.nansum(v)) / n for v in steps.values() if v is not None and n > 0]
    c = steps[first]
    ev: dict = {
        "first_step": int(first), "steps": sorted(int(k) for k in steps),
        "counts": None if c is None else {k: int(x) for k, x in zip(NONFINITE_KINDS, c)},
        "numel": int(n), "share": None if c is None or n <= 0 else float(np.nansum(c)) / n,
        "max_share": max(shares) if shares else None,
    }
    mn, mx = r.scal("min"), r.scal("max")
    before = [int(s) for s in mn.index if s < first and s in mx.index]
    ev["finite_steps_before"] = before
    if before:
        last = max(before)
        ev["absmax_before"] = float(max(abs(mn[last]), abs(mx[last])))
        ev["absmax_before_step"] = last
    else:
        ev["absmax_before"] = None
    sample = r.by.get("sample")
    ev["sample_format"] = _fp_format(sample[2]) if sample is not None else "unknown"
    at_first = g[g["step"] == first]
    ev["order"] = int(at_first["_pos"].min()) if "_pos" in at_first.columns and len(at_first) else 0
    return ev


def _mask_only(ev: dict) -> bool:
    """True when a group's non-finite values are only ``-inf`` (counts known): an additive mask, not a divergence."""
    c = ev.get("counts")
    return bool(c) and c["nan"] == 0 and c["posinf"] == 0 and c["neginf"] > 0


def _last_sites(df: pd.DataFrame) -> dict[tuple, str]:
    """Per (run, workload), the site of the last row of its first recorded step: the forward's last matmul.

    The tap appends rows in execution order and skips backward matmuls, so
    this is the model's output layer (a classifier or LM head) when the
    frame keeps the recorded order.
    """
    out: dict[tuple, str] = {}
    for key, g in df.groupby(["run_id", "workload"], sort=False):
        first = g[g["step"] == g["step"].min()]
        out[key] = str(first["_site"].iloc[int(np.argmax(first["_pos"].to_numpy()))])
    return out


def _rank_nonfinite(bad: dict[tuple, dict], last_site: dict[tuple, str]) -> dict[tuple, dict]:
    """Add each non-finite (site, role)'s place in its run and how it turned non-finite (``origin``).

    Per run, the groups are ranked by (``-inf`` only, first step, execution
    order): ``rank`` 0 is where non-finite values appear first, and every
    group's evidence names it (``run_first``: site, role, step).  A group
    whose values are only ``-inf`` ranks after every other: an additive
    attention mask (``baddbmm`` with a ``-inf`` bias) writes them on purpose.
    ``output_layer`` says the site is the forward's last matmul
    (:func:`_last_sites`).  ``origin`` reads the other operands of the same
    matmul at the group's first step:

    * ``overflow``: an ``out`` whose ``lhs`` and ``rhs`` were finite then: the
      product left the format's range inside this matmul;
    * ``propagated``: an ``out`` of a matmul whose operands were already non-finite;
    * ``mask``: an ``out`` holding only ``-inf`` (see above);
    * ``weight``: an ``rhs`` (the weight of a linear layer): the previous
      optimizer update wrote a non-finite value into it;
    * ``input``: an ``lhs`` (the data, or an activation made by an op that is not a matmul).
    """
    first_of = {k: ev["first_step"] for k, ev in bad.items()}
    out: dict[tuple, dict] = {}
    for run in {(k[0], k[1]) for k in bad}:
        keys = sorted((k for k in bad if (k[0], k[1]) == run),
                      key=lambda k: (_mask_only(bad[k]), bad[k]["first_step"], bad[k]["order"]))
        head = keys[0]
        for rank, k in enumerate(keys):
            ev = dict(bad[k])
            site, role, step = k[2], k[3], ev["first_step"]
            if role == "out":
                ops = [first_of.get((*run, site, r)) for r in ("lhs", "rhs")]
                ev["origin"] = ("propagated" if any(s is not None and s <= step for s in ops) else
                                "mask" if _mask_only(ev) else "overflow")
            else:
                ev["origin"] = "weight" if role == "rhs" else "input"
            ev["rank"] = rank
            ev["output_layer"] = last_site.get(run) == site
            ev["run_first"] = {"site": head[2], "role": head[3], "step": bad[head]["first_step"]}
            out[k] = ev
    return out


def _json_safe(obj):
    """``obj`` with every non-finite float replaced by None (JSON has no NaN or inf)."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj
