"""mine_patterns: turn tidy sketch rows into findings (first matching rule wins).

Thresholds from the original recording harness (issue 7): density
``nnz/numel < 0.5`` -> sparse GEMM (score ``1 - density``); otherwise dense, and
low rank is not observable from these sketches (a host probe is needed).
Cross-step: coefficient of variation of ``l1`` across steps ``< 1e-4`` ->
stationary (prepack/precompute), else drifting.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from goblin_assets.warehouse.tables import columns

SPARSE_DENSITY = 0.5      # nnz/numel below this: zero-skipping / sparse GEMM pays (harness threshold)
STATIONARY_CV = 1e-4      # CV of l1 across steps below this: the tensor does not change (harness threshold)


def mine_patterns(sketches: pd.DataFrame) -> pd.DataFrame:
    """Findings per (run, site, role) from tidy sketch rows.

    Input columns: run_id, workload, step, site, role, stat, value, numel
    (the ``sketches`` table).  Output: rows of the ``patterns`` table with
    ``finding`` in {sparse_gemm, dense_not_observable, stationary, drifting}
    and the numbers behind each in ``evidence_json``.
    """
    out = []
    scal = sketches[sketches["idx"] == 0]
    wide = scal.pivot_table(index=["run_id", "workload", "site", "role", "step"], columns="stat",
                            values="value", aggfunc="first").reset_index()
    numel = scal.groupby(["run_id", "site", "role", "step"])["numel"].first().rename("numel").reset_index()
    wide = wide.merge(numel, on=["run_id", "site", "role", "step"])
    for (run_id, workload, site, role), g in wide.groupby(["run_id", "workload", "site", "role"]):
        density = float((g["nnz"] / g["numel"]).mean())
        absmax = float(np.maximum(g["max"].abs(), g["min"].abs()).max())
        ev = {"density": density, "absmax": absmax, "mean": float(g["mean"].mean()), "steps": int(len(g))}
        if density < SPARSE_DENSITY:
            out.append((run_id, workload, site, role, "sparse_gemm", 1.0 - density, ev))
        else:
            out.append((run_id, workload, site, role, "dense_not_observable", 0.0,
                        {**ev, "note": "low rank is not observable from scalar sketches; a host probe is needed"}))
        if len(g) >= 2:
            l1 = g["l1"].to_numpy()
            cv = float(np.std(l1) / (abs(np.mean(l1)) + 1e-30))
            label = "stationary" if cv < STATIONARY_CV else "drifting"
            out.append((run_id, workload, site, role, label, 1.0 - min(cv, 1.0), {"l1_cv": cv, "steps": int(len(g))}))
    return pd.DataFrame(
        [{"run_id": r, "workload": w, "site": s, "role": ro, "finding": f, "score": sc,
          "evidence_json": json.dumps(e)} for r, w, s, ro, f, sc, e in out],
        columns=columns("patterns"))
