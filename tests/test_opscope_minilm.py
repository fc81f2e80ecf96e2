"""The minilm driver: the packaged pretrained all-MiniLM-L6-v2 on real docstrings, eager attention (slow)."""
from __future__ import annotations

import numpy as np
import pytest

from goblin_assets.opscope.drivers import load_minilm, minilm, minilm_batches, stdlib_docstrings
from goblin_assets.opscope.inject import inject_matmul_stats
from goblin_assets.warehouse.db import validate

SEQ = 32


#: Many small reductions: on 2 shared cores, 2 intra-op threads make them ~7x slower (measured).
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def test_docstrings_are_real_text():
    texts = stdlib_docstrings()
    assert len(texts) > 500 and all(isinstance(t, str) and t for t in texts)
    assert any("socket" in t.lower() for t in texts)


@pytest.mark.slow
def test_minilm_sites_gate_and_attention_values():
    r = minilm(steps=2, batch=2, seq_len=SEQ)
    assert r.extra["frontend"] == "export"
    assert r.extra["sites_by_op"] == {"linear": 37, "matmul": 12, "softmax": 6}
    assert r.gate_passed and r.gates[0].outputs_compared == 2
    rows = r.rows
    validate("sketches", rows)
    assert sorted(rows.step.unique()) == [0, 1]
    q = rows[(rows.site == "encoder.layer.0.attention.self.query") & (rows.role == "lhs")]
    assert set(q.M) == {2 * SEQ} and set(q.K) == {384} and set(q.N) == {384}
    probs = rows[rows.role == "probs"]
    assert probs.site.nunique() == 6 and set(probs.stat) == {"peak_prob", "key_mass"}
    for (_, step), g in probs.groupby(["site", "step"]):
        mass = g[g.stat == "key_mass"].sort_values("idx").value.to_numpy()
        peak = g[g.stat == "peak_prob"].value.to_numpy()
        assert len(mass) == SEQ and mass.sum() == pytest.approx(SEQ, rel=1e-4)   # each query's row sums to 1
        assert np.all((peak > 0) & (peak <= 1 + 1e-6))
    s = r.summary.set_index(["site", "role"])
    assert s.loc[("encoder.layer.0.intermediate.dense", "rhs"), "density"] == 1.0


@pytest.mark.slow
def test_sdpa_minilm_has_no_softmax_and_says_so():
    tok, model = load_minilm("sdpa")
    b = minilm_batches(tok, 2, 16, 1)[0]
    inj = inject_matmul_stats(model, (b["input_ids"],), {"attention_mask": b["attention_mask"]}, infer=True)
    ops = list(inj.ops().values())
    assert ops.count("linear") == 37 and "softmax" not in ops
    assert any("scaled_dot_product_attention" in n for n in inj.notes)
