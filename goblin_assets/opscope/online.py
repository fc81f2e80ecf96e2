"""Bounded one-pass recorders for sampled production inference, on Apache DataSketches.

A production server cannot keep every activation it sees.  :class:`OnlineRecorder`
keeps three bounded sketches of one tensor site's stream, all from the
``datasketches`` package (Apache DataSketches' C++ core; DESIGN.md: "use it,
don't re-implement"):

* **KLL** (``kll_doubles_sketch``): quantiles of the values, within a
  normalised rank error ε(k) (k=200: ε ≈ 1.65%, the 99th-percentile maximum
  error over all queries; Karnin, Lang & Liberty, FOCS 2016);
* **HLL** (``hll_sketch``): the number of distinct values (float32 bit
  patterns), relative error about 1.04/√(2^lg_k) per standard deviation
  (lg_k=12: 1.6%; Flajolet et al. 2007) — the online twin of the host probe's
  cardinality;
* **var-opt** (``var_opt_sketch``): a weighted reservoir of rows (row id,
  weight = the row's energy Σx²), whose subset sums are unbiased with bounds
  and whose total weight is exact (Cohen et al., "Stream sampling for
  variance-optimal estimation of subset sums", SODA 2009).

Determinism under a seed: which values and rows are fed is decided by a
``numpy`` generator seeded with ``seed`` (the sampled subset is identical
across runs), and HLL is a deterministic function of its input.  KLL's
compaction coin and var-opt's reservoir draws use the library's internal
random source, which the Python binding does not let a caller seed (the
maintainers declined to expose it: apache/datasketches-cpp#361); their answers
are reproducible within the error bounds above, not bit for bit.  The tests
check exactly that.

Serialisation: :meth:`OnlineRecorder.to_frame` gives ``online_sketches`` rows
(base64 of each sketch's own binary format) and :meth:`OnlineRecorder.from_frame`
restores them.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import datasketches as ds
import numpy as np
import pandas as pd

from goblin_assets.errors import GoblinError
from goblin_assets.warehouse.tables import columns

#: Quantiles stored in each KLL summary.
SUMMARY_QUANTILES = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999)


class OnlineSketchError(GoblinError):
    """A serialised sketch row is missing or cannot be deserialised (message names the recorder and kind)."""


class OnlineRecorder:
    """KLL quantiles, HLL distinct count and a var-opt row reservoir of one site's stream.

    Parameters
    ----------
    name : the site (e.g. ``encoder.layer.0.output.dense:lhs``).
    k_kll : KLL accuracy parameter (default 200, ε ≈ 1.65%).
    lg_k_hll : log2 of HLL's register count (default 12, ≈ 1.6% per σ).
    k_varopt : reservoir size in rows (default 64).
    max_values : values per :meth:`update` fed to KLL and HLL; larger updates
        are subsampled uniformly by the seeded generator (the bounded cost of
        "sampled production inference").
    seed : seeds the subsampling (see the module docstring on determinism).

    Shapes
    ------
    :meth:`update` takes ``(..., C)``: rows are all leading positions, values all elements.
    """

    def __init__(self, name: str, k_kll: int = 200, lg_k_hll: int = 12, k_varopt: int = 64,
                 max_values: int = 65536, seed: int = 0):
        self.name, self.seed = name, int(seed)
        self.k_kll, self.lg_k_hll, self.k_varopt, self.max_values = k_kll, lg_k_hll, k_varopt, max_values
        self.rng = np.random.default_rng(seed)
        self.kll = ds.kll_doubles_sketch(k_kll)
        self.hll = ds.hll_sketch(lg_k_hll)
        self.varopt = ds.var_opt_sketch(k_varopt)
        self.rows_seen = 0
        self.values_seen = 0
        self.fed_values: int = 0

    def update(self, x) -> np.ndarray:
        """Feed one tensor (torch or numpy); returns the flat indices of the values fed to KLL/HLL.

        Every row goes into the var-opt reservoir (weight Σx² of the row, so
        that energy subset sums are estimable); at most ``max_values`` values,
        chosen by the seeded generator, go into KLL and HLL.
        """
        a = x.detach().to("cpu").float().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float32)
        a = a.astype(np.float32, copy=False)
        flat = a.reshape(-1)
        rows = a.reshape(-1, a.shape[-1]) if a.ndim >= 2 else a.reshape(1, -1)
        for i, w in enumerate((rows.astype(np.float64) ** 2).sum(1)):
            self.varopt.update(self.rows_seen + i, float(w))
        self.rows_seen += rows.shape[0]
        if flat.size > self.max_values:
            idx = np.sort(self.rng.choice(flat.size, self.max_values, replace=False))
        else:
            idx = np.arange(flat.size)
        vals = flat[idx]
        self.kll.update(vals.astype(np.float64))
        for bits in vals.view(np.int32).tolist():
            self.hll.update(bits)
        self.values_seen += flat.size
        self.fed_values += vals.size
        return idx

    # ---- reads
    def quantiles(self, qs: Sequence[float] = SUMMARY_QUANTILES) -> dict[float, float]:
        """KLL quantile estimates (normalised rank error :attr:`rank_error`)."""
        return {float(q): float(self.kll.get_quantile(q)) for q in qs} if not self.kll.is_empty() else {}

    @property
    def rank_error(self) -> float:
        """KLL's normalised rank error for single quantile/rank queries (99th percentile of the max error)."""
        return float(self.kll.normalized_rank_error(False))

    def distinct(self, num_std_devs: int = 3) -> dict:
        """HLL estimate of distinct values with lower/upper bounds at ``num_std_devs`` σ."""
        return {"estimate": float(self.hll.get_estimate()),
                "lower": float(self.hll.get_lower_bound(num_std_devs)),
                "upper": float(self.hll.get_upper_bound(num_std_devs))}

    def energy(self, predicate=lambda row_id: True) -> dict:
        """Var-opt estimate of Σx² over the rows whose id satisfies ``predicate`` (with bounds and the exact total)."""
        return dict(self.varopt.estimate_subset_sum(predicate))

    def summary(self) -> dict:
        """Quantiles, distinct count, total energy and counts: what the warehouse row shows without deserialising."""
        return {"quantiles": self.quantiles(), "rank_error": self.rank_error, "distinct": self.distinct(),
                "total_energy": float(self.energy()["total_sketch_weight"]) if self.rows_seen else 0.0,
                "rows_seen": self.rows_seen, "values_seen": self.values_seen, "values_fed": self.fed_values}

    # ---- warehouse
    def to_frame(self, run_id: str) -> pd.DataFrame:
        """``online_sketches`` rows: one per sketch kind, each sketch in its own binary format (base64)."""
        blobs = {"kll": (self.kll.serialize(), self.kll.n, self.k_kll),
                 "hll": (self.hll.serialize_compact(), self.values_seen, self.lg_k_hll),
                 "varopt": (self.varopt.serialize(ds.PyLongsSerDe()), self.varopt.n, self.k_varopt)}
        summ = json.dumps(self.summary(), default=float)
        return pd.DataFrame([{"run_id": run_id, "name": self.name, "kind": kind, "seed": self.seed, "n": int(n),
                              "k": int(k), "blob_b64": base64.b64encode(b).decode(), "summary_json": summ}
                             for kind, (b, n, k) in blobs.items()], columns=columns("online_sketches"))

    @classmethod
    def from_frame(cls, df: pd.DataFrame, name: str) -> OnlineRecorder:
        """Restore a recorder from its ``online_sketches`` rows (the latest run's rows for ``name``).

        Raises
        ------
        OnlineSketchError
            A kind is missing or its bytes do not deserialise.
        """
        rows = {r.kind: r for r in df[df["name"] == name].itertuples()}
        missing = {"kll", "hll", "varopt"} - set(rows)
        if missing:
            raise OnlineSketchError(f"online sketch {name!r}: no {sorted(missing)} rows")
        summ = json.loads(rows["kll"].summary_json)
        rec = cls(name, k_kll=int(rows["kll"].k), lg_k_hll=int(rows["hll"].k), k_varopt=int(rows["varopt"].k),
                  seed=int(rows["kll"].seed))
        try:
            rec.kll = ds.kll_doubles_sketch.deserialize(base64.b64decode(rows["kll"].blob_b64))
            rec.hll = ds.hll_sketch.deserialize(base64.b64decode(rows["hll"].blob_b64))
            rec.varopt = ds.var_opt_sketch.deserialize(base64.b64decode(rows["varopt"].blob_b64), ds.PyLongsSerDe())
        except (RuntimeError, ValueError) as exc:
            raise OnlineSketchError(f"online sketch {name!r}: cannot deserialise: {exc}") from None
        rec.rows_seen, rec.values_seen, rec.fed_values = summ["rows_seen"], summ["values_seen"], summ["values_fed"]
        return rec


def record_online(tensors: dict[str, Sequence], run_id: str = "online", seed: int = 0, **kw) -> pd.DataFrame:
    """One :class:`OnlineRecorder` per site fed its stream of tensors; their ``online_sketches`` rows.

    Parameters
    ----------
    tensors : site -> sequence of tensors (one per sampled request/step).
    seed : base seed; site ``i`` (in key order) uses ``seed + i``.
    """
    frames = []
    for i, (name, stream) in enumerate(tensors.items()):
        rec = OnlineRecorder(name, seed=seed + i, **kw)
        for t in stream:
            rec.update(t)
        frames.append(rec.to_frame(run_id))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns("online_sketches"))
