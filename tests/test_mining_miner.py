"""mine_patterns on real digits sketches (recorded here with MatmulTap) and on the full sketch set."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from goblin_assets.opscope.miner import mine_patterns
from goblin_assets.opscope.sketches import SCALAR_STATS, STATS, sketch_layout, sketch_vector
from goblin_assets.opscope.taps import MatmulTap
from goblin_assets.warehouse.db import validate
from goblin_assets.warehouse.tables import columns


def digits_mlp(seed: int = 0) -> torch.nn.Sequential:
    """A 64-256-256-10 MLP whose first layer's bias sits one standard deviation below its pre-activation.

    Why the bias: with zero-mean weights and non-negative pixels a unit's
    pre-activation is roughly symmetric about its bias, so at bias 0 about half
    of the post-ReLU activations are non-zero (measured 0.53 on these digits)
    -- exactly at the 0.5 threshold.  A bias of -1 standard deviation of the
    pre-activation (computed on the real pixels) puts the expected density near
    Phi(-1) ~ 0.16-0.3: clearly sparse, the way a trained ReLU layer often is.
    The test does not trust that estimate: it compares the miner to the exact
    non-zero share of the activations.
    """
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 10))
    x = torch.tensor(load_digits().data[:256] / 16.0, dtype=torch.float32)
    with torch.no_grad():
        m[0].bias.copy_(-(x @ m[0].weight.T).std(0))
    return m


def record_digits(steps: int = 4, batch: int = 64, optimizer: str | None = None, run_id: str = "digits-mine",
                  stats: tuple[str, ...] = STATS):
    """Tap a digits MLP fed real scikit-learn digits for ``steps`` steps.

    Returns (sketch rows, the pixels fed, the post-ReLU activations of layer 0 on them).
    With ``optimizer`` None the step is forward + backward only, so weights never change;
    ``"adam"`` (lr 1e-3) or ``"sgd"`` (lr 1e-3: small updates) train.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target)
    m = digits_mlp()
    opt = {None: None, "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
           "sgd": lambda p: torch.optim.SGD(p, lr=1e-3)}[optimizer]
    opt = opt(m.parameters()) if opt else None
    fed = []
    with MatmulTap(stats) as tap:
        for s in range(steps):
            xb, yb = X[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
            fed.append(xb)
            torch.nn.functional.cross_entropy(m(xb), yb).backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            tap.flush(s)
    df = pd.DataFrame(tap.rows).assign(run_id=run_id, workload="digits_mlp", model="mlp-64-256-256-10",
                                       backend="cpu", dist="digits")[columns("sketches")]
    pixels = torch.cat(fed)
    with torch.no_grad():
        h1 = torch.relu(m[0](pixels))
    return df, pixels, h1


@pytest.fixture(scope="module")
def digits():
    return record_digits()


def _finding(pat, site, role, kinds=None):
    g = pat[(pat.site == site) & (pat.role == role)]
    if kinds:
        g = g[g.finding.isin(kinds)]
    assert len(g) == 1, g
    return g.iloc[0].finding, json.loads(g.iloc[0].evidence_json)


RULES = ["sparse_gemm", "int_quant", "quantize_lut", "delta_compute", "positional", "dense_not_observable"]


def test_digits_input_density_is_the_exact_pixel_share(digits):
    from sklearn.datasets import load_digits

    df, pixels, _ = digits
    pat = mine_patterns(df)
    validate("patterns", pat)
    _, ev = _finding(pat, "linear_0", "lhs", RULES)
    exact = float((pixels != 0).double().mean())                       # the pixels fed in
    assert ev["density"] == pytest.approx(exact, abs=1e-12)
    assert ev["density"] == pytest.approx(float((load_digits().data != 0).mean()), abs=0.02)  # ~0.51 overall


def test_post_relu_activations_are_sparse(digits):
    df, _, h1 = digits
    pat = mine_patterns(df)
    finding, ev = _finding(pat, "linear_1", "lhs", RULES)
    exact = float((h1 != 0).double().mean())
    assert ev["density"] == pytest.approx(exact, abs=1e-12)
    assert exact < 0.4
    assert finding == "sparse_gemm"
    score = pat[(pat.site == "linear_1") & (pat.role == "lhs") & (pat.finding == "sparse_gemm")].score.iloc[0]
    assert score == pytest.approx(1 - exact)


def test_weights_stationary_without_optimizer_and_drifting_with_it(digits):
    df, _, _ = digits
    pat = mine_patterns(df)
    for site in ("linear_0", "linear_1", "linear_2"):
        f, ev = _finding(pat, site, "rhs", ["stationary", "drifting"])
        assert f == "stationary" and ev["l1_cv"] == 0.0 and ev["steps"] == 4 and ev["exact_repeat"]
        assert _finding(pat, site, "lhs", ["stationary", "drifting"])[0] == "drifting"  # a new batch each step
    trained, _, _ = record_digits(optimizer="adam", run_id="digits-adam")
    pat2 = mine_patterns(trained)
    assert _finding(pat2, "linear_0", "rhs", ["stationary", "drifting"])[0] == "drifting"
    # small SGD updates keep l1 within the 1e-4 CV of the harness rule, but the weights do change
    sgd, _, _ = record_digits(optimizer="sgd", run_id="digits-sgd")
    f, ev = _finding(mine_patterns(sgd), "linear_1", "rhs", ["stationary", "drifting"])
    assert f == "stationary" and 0 < ev["l1_cv"] < 1e-4 and not ev["exact_repeat"]


def test_scalar_only_sketches_keep_the_audit_contract():
    """sparse_gemm iff density < 0.5, else dense_not_observable; skipped rules are named."""
    df, _, _ = record_digits(stats=SCALAR_STATS, run_id="digits-scalar")
    pat = mine_patterns(df)
    for (site, role), g in df[df.stat == "nnz"].groupby(["site", "role"]):
        density = float((g.value / g.numel).mean())
        finding, ev = _finding(pat, site, role, RULES)
        assert finding == ("sparse_gemm" if density < 0.5 else "dense_not_observable")
        if finding == "dense_not_observable":
            assert "host probe" in ev["note"]
            assert any(s.startswith("int_quant") for s in ev["skipped"])


def rows_of(x: torch.Tensor, site: str, steps: int = 2, dist: str = "synthetic") -> pd.DataFrame:
    """Tidy rows of the full sketch set of ``x`` (recorded ``steps`` times) via the recording side's sketch_vector."""
    vec = sketch_vector(x, STATS).numpy()
    stat = np.concatenate([np.full(len(i), s, dtype=object) for s, i in sketch_layout(x.shape, STATS)])
    idx = np.concatenate([i for _, i in sketch_layout(x.shape, STATS)])
    m, k = x.shape[0], x.shape[-1]
    frames = [pd.DataFrame({"run_id": "rules", "workload": "synthetic", "model": "none", "step": s, "backend": "cpu",
                            "dist": dist, "M": m, "K": k, "N": 8, "numel": x.numel(), "site": site, "role": "lhs",
                            "stat": stat, "idx": idx, "value": vec}) for s in range(steps)]
    return pd.concat(frames, ignore_index=True)[columns("sketches")]


def test_every_rule_fires_on_the_tensor_built_for_it():
    g = torch.Generator().manual_seed(0)
    r, c = 512, 256
    base = torch.randn(r, c, generator=g)
    outlier = base.clone()
    outlier[:, :4] *= 20.0                                              # 4 outlier channels (LLM.int8()-like)
    grid = torch.tensor([-1.0, 0.5, 1.0])[torch.randint(0, 3, (r, c), generator=g)]  # 3 levels: LUT
    walk = torch.randn(1, c, generator=g) + 0.02 * torch.randn(r, c, generator=g).cumsum(0)  # slowly varying rows
    posn = base * torch.where(torch.arange(r) < r // 2, 1.0, 3.0)[:, None]   # later positions carry 9x the energy
    sparse = torch.relu(base - 0.5)
    cases = {"sparse": (sparse, "sparse_gemm"), "outlier": (outlier, "int_quant"), "grid": (grid, "quantize_lut"),
             "walk": (walk, "delta_compute"), "posn": (posn, "positional"), "gauss": (base, "dense_not_observable")}
    df = pd.concat([rows_of(x, name) for name, (x, _) in cases.items()], ignore_index=True)
    validate("sketches", df)
    pat = mine_patterns(df)
    validate("patterns", pat)
    for name, (x, want) in cases.items():
        finding, ev = _finding(pat, name, "lhs", RULES)
        assert finding == want, (name, ev)
        assert "skipped" not in ev
    _, ev = _finding(pat, "outlier", "lhs", RULES)
    assert ev["int8_outlier_channels"] == 4 and ev["outlier_ratio"] > 6
    assert _finding(pat, "gauss", "lhs", ["stationary", "drifting"])[0] == "stationary"  # the same tensor twice


def test_sweep_sites_are_split_by_distribution():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 32, generator=g), torch.relu(torch.randn(64, 32, generator=g) - 1)
    df = pd.concat([rows_of(a, "mm_0", dist="gaussian"), rows_of(b, "mm_0", dist="relu_sparse")], ignore_index=True)
    pat = mine_patterns(df)
    assert _finding(pat, "mm_0@relu_sparse", "lhs", RULES)[0] == "sparse_gemm"
    assert _finding(pat, "mm_0@gaussian", "lhs", RULES)[0] != "sparse_gemm"


# ----------------------------------------------------------------- non-finite values

def record_half(steps: int = 4, lr: float = 20.0, run_id: str = "half-mine") -> pd.DataFrame:
    """The fp16 MLP of tests/data/half_workload, trained after ``model.half()``, tapped after one warm-up step.

    Measured (torch 2.13, CPU): finite at the first recorded step, ``linear_1``'s
    output overflows to inf at the second (its operands still finite), NaN
    everywhere from the third.
    """
    torch.manual_seed(0)
    x = torch.randn(2048, 32) * 4
    y = (x[:, :16].sum(1) > x[:, 16:].sum(1)).long()
    m = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 2)).half()
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    tap = MatmulTap()
    for s in range(steps + 1):
        xb, yb = x[s * 64:(s + 1) * 64].half(), y[s * 64:(s + 1) * 64]
        opt.zero_grad()
        if s:
            tap.__enter__()
        loss = torch.nn.functional.cross_entropy(m(xb), yb)
        if s:
            tap.__exit__(None, None, None)
        loss.backward()
        opt.step()
        if s:
            tap.flush(s - 1)
    return pd.DataFrame(tap.rows).assign(run_id=run_id, workload="half", model="mlp-fp16", backend="cpu",
                                         dist="workload")[columns("sketches")]


@pytest.fixture(scope="module")
def half():
    return record_half()


def _strict(text: str) -> dict:
    def bad(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=bad)


def test_the_first_nonfinite_site_and_step_are_named(half):
    pat = mine_patterns(half)
    validate("patterns", pat)
    nf = pat[pat.finding == "nonfinite"]
    evs = {(r.site, r.role): _strict(r.evidence_json) for r in nf.itertuples()}
    first = next(ev for ev in evs.values() if ev["rank"] == 0)
    assert first["run_first"] == {"site": "linear_1", "role": "out", "step": 1}
    ev = evs[("linear_1", "out")]
    assert ev["first_step"] == 1 and ev["origin"] == "overflow" and ev["finite_steps_before"] == [0]
    assert ev["counts"]["nan"] == 0 and ev["counts"]["posinf"] + ev["counts"]["neginf"] > 0
    assert 0 < ev["absmax_before"] < 65504 and ev["sample_format"] == "fp16"      # CPU ran the matmuls in fp16
    assert evs[("linear_0", "rhs")]["origin"] == "weight" and evs[("linear_2", "out")]["output_layer"]
    assert all(e["run_first"] == first["run_first"] for e in evs.values())
    assert nf.score.between(0, 1).all() and (nf.score > 0).all()
    # the other findings of that site come from its finite step only; every evidence is strict JSON
    _, other = _finding(pat, "linear_1", "out", RULES)
    assert other["steps"] == 1 and other["nonfinite_steps_left_out"] == [1, 2, 3]
    for text in pat.evidence_json:
        _strict(text)
    from goblin_assets.contracts import PATTERN_FINDINGS
    from goblin_assets.kb.rules import PatternScores, _check_path
    from goblin_assets.opscope.miner import NONFINITE

    assert NONFINITE in PATTERN_FINDINGS and _check_path("patterns.any.nonfinite") is None
    assert PatternScores(pat).score("linear_1", "nonfinite") == 1.0


def test_nonfinite_sketches_survive_the_warehouse_and_mine_the_same(half, tmp_path):
    """NaN becomes NULL in DuckDB (the schema says so), inf stays inf; read back, the miner finds the same."""
    from goblin_assets.warehouse.db import query, write

    db = tmp_path / "w.duckdb"
    assert write({"sketches": half}, db) == {"sketches": len(half)}
    back = query("SELECT * FROM sketches", db)
    assert back.value.isna().sum() == half.value.isna().sum() > 0
    assert np.isinf(back.value).sum() == np.isinf(half.value).sum() > 0
    ours, theirs = (p[p.finding == "nonfinite"].set_index(["site", "role"]).sort_index() for p in
                    (mine_patterns(half), mine_patterns(back)))
    assert ours.index.equals(theirs.index)
    for a, b in zip(ours.evidence_json, theirs.evidence_json):
        a, b = _strict(a), _strict(b)
        for k in ("first_step", "counts", "origin", "run_first", "steps"):
            assert a[k] == b[k], k


def test_rows_without_the_nonfinite_stat_are_still_judged_from_min_and_max(half):
    pat = mine_patterns(half[half.stat != "nonfinite"])
    ev = {(r.site, r.role): _strict(r.evidence_json) for r in pat[pat.finding == "nonfinite"].itertuples()}
    assert ev[("linear_1", "out")]["counts"] is None and ev[("linear_1", "out")]["first_step"] == 1
    assert pat[pat.finding == "nonfinite"].score.eq(1.0).all()


def test_minus_inf_only_outputs_are_a_mask_not_a_divergence():
    """An additive attention mask (baddbmm with a -inf bias) writes -inf into a matmul output on purpose."""
    q, k = torch.randn(2, 8, 16), torch.randn(2, 16, 8)
    mask = torch.zeros(2, 8, 8)
    mask[:, :, 6:] = float("-inf")
    lin = torch.nn.Linear(16, 16)
    with MatmulTap() as tap:
        torch.baddbmm(mask, q, k)
        lin(torch.randn(4, 16))
    tap.flush(0)
    df = pd.DataFrame(tap.rows).assign(run_id="m", workload="w", model="m", backend="cpu", dist="d")
    ev = {(r.site, r.role): _strict(r.evidence_json) for r in mine_patterns(df[columns("sketches")]).itertuples()
          if r.finding == "nonfinite"}
    (key, e), = ev.items()
    assert key[1] == "out" and e["origin"] == "mask" and e["counts"] == {"nan": 0, "posinf": 0, "neginf": 32}
