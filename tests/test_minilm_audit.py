"""The whole audit on the real MiniLM + LoRA workload: KB rules, a diff that applies, a measured speedup.

Slow (several minutes on 2 CPU cores): it profiles, patches and benchmarks the
packaged all-MiniLM-L6-v2 fine-tune.  It also holds the checks of the profiled
baseline (one profile of the workload serves both).  The gain is measured in real
(non-padding) tokens/s, the honest unit once padding changes.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from goblin_assets import REPO_ROOT
from goblin_assets.audit.session import AuditSession
from goblin_assets.host import use_host
from goblin_assets.kb.rules import load_kb
from goblin_assets.measure.invariants import CHECKS
from goblin_assets.report.html import write_html
from goblin_assets.runners.workload import load_workload
from goblin_assets.settings import AuditSettings
from tests.conftest import PLAIN_HOST, TEST_BENCH_BUDGET_S
from tests.test_observed import observed_equals_trainer

pytestmark = pytest.mark.slow


#: The e2e audit's budgets: 3 profiled steps, a 1-step sketch, benchmark pairs of 4 steps (how much faster the
#: patch is belongs to a benchmark; here the pairs only have to be measured and their interval agree with them).
SETTINGS = AuditSettings(bench_budget_s=TEST_BENCH_BUDGET_S, device="cpu", timeout_s=900, profiled_steps=3,
                         bench_steps=4, bench_repeats=2, sketch_steps=1)


@pytest.fixture(scope="module")
def minilm_audit(tmp_path_factory):
    """One full audit of the workload on the ``plain`` host (no bf16 units), shared by the module's tests."""
    with pytest.MonkeyPatch.context() as mp, use_host(PLAIN_HOST):
        mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("minilm_home")))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        kb = load_kb()
        s = AuditSession.open(load_workload(REPO_ROOT / "workloads" / "minilm_lora_cls"), settings=SETTINGS,
                              kb=kb).run_all()
    return s, kb


@pytest.fixture(scope="module")
def bf16_audit(minilm_audit, tmp_path_factory):
    """The same workload with the host reported as having CPU bf16 matrix units (AMX / AVX-512 BF16), up to its
    validated patch.  The original program's runs do not depend on what the host reports about bf16 units, so
    its profile and sketches are the plain audit's (seeded, not run again)."""
    plain, kb = minilm_audit
    seeds = {k: plain.results[k] for k in ("profile_run", "tensor_sketches", "mined_patterns", "kb_index")}
    with pytest.MonkeyPatch.context() as mp, use_host({"amx_bf16": True, "avx512_bf16": True}):
        mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("bf16_home")))
        s = AuditSession.open(load_workload(REPO_ROOT / "workloads" / "minilm_lora_cls"), settings=SETTINGS, kb=kb,
                              **seeds)
        s.patch()
    return s  # the host override ends here: the module's other tests run on the suite's host


def test_minilm_on_a_host_with_bf16_units_gets_bf16_that_the_trainer_accepts(bf16_audit):
    """The bf16 rule fires; its fix also tells the HF Trainer to train on the CPU (use_cpu=True), so the patched
    program runs (validated with one step); the audit never dies of its own patch."""
    p = bf16_audit.patch()
    assert bf16_audit.host.cpu_bf16_matmul is True
    assert {a.rule_id for a in p.applied} == {"data.dynamic_padding", "attention.eager_to_sdpa",
                                              "precision.cpu_bf16_amx"}, p.dropped
    added = [ln[1:].strip() for ln in p.diff.splitlines() if ln.startswith("+")]
    assert "bf16=True," in added and "use_cpu=True," in added, p.diff
    assert [v["ok"] for v in bf16_audit.results["patch_validation"]] == [True]


def test_minilm_audit_end_to_end(tmp_path, minilm_audit):
    res, kb = minilm_audit
    wl = res.workload
    assert res.host.cpu_bf16_matmul is False  # the plain host: no bf16 units, whatever this machine has

    # the profiled baseline: tokens from the real input_ids the Trainer's (accelerate-wrapped) DataLoader yields
    m = res.profile_run()
    assert m.ok and m.provenance.kind == "measured" and m.steps == 3 and m.unit == "tokens"
    assert m.tokens_per_sec and m.tokens_per_sec > 0
    assert m.samples_per_step == 8
    assert m.attention_kernel_loaded is False  # attn_implementation="eager"
    assert sum(b.seconds for b in m.waste_budget.values()) == pytest.approx(m.step_time_s, rel=0.05)
    assert m.trace_path and Path(m.trace_path).is_file()
    assert m.headroom_batch is not None and m.headroom_batch > 8
    observed_equals_trainer(m)   # every field observed in the run, equal to the Trainer's own values (issue 27)
    assert not [d for d in res.effective_config().disagreements if d.field != "optimizer"]
    # the run-time invariant checks ran (issue 28) and stay silent on this healthy fine-tune: LoRA A's zero
    # gradient while B is zero is by design, and three steps in a learning-rate warm-up show no loss trend
    invs = {i.id: i for i in m.invariants}
    # (an info check may fire: cores_busy states that the run keeps the cores busy, a premise, not a fault)
    assert set(invs) == set(CHECKS)
    assert not {k: i.message for k, i in invs.items() if i.status == "fired" and i.severity != "info"}
    assert invs["numerics_vs_reference"].status == "silent" and invs["grad_below_normal"].status == "silent"

    # the rules come from the KB, with their citations; no special case in code.  Both fire and are applied;
    # when the whole patch measures slower, each rule is measured alone and one measured slower alone is dropped
    # as not recommended (a loaded machine can flip SDPA against eager on this small model: which way is a
    # benchmark's question), so the offer is the rest
    applied = {a.rule_id for a in res.patch().applied}
    slower = {r["rule_id"] for r in res.results.get("rule_isolation", []) if r["slower"]}
    # (either rule can be the one measured slower alone on a loaded machine: a fresh clone's run dropped
    # dynamic padding once, 2026-12-06; which one wins is a benchmark's question, never this test's)
    assert applied and not applied & slower
    assert applied | slower == {"data.dynamic_padding", "attention.eager_to_sdpa"}, (applied, slower)
    for rid in slower:
        assert any(d.startswith(f"{rid}:") and "not recommended: measured alone" in d for d in res.patch().dropped)
    for a in res.patch().applied:
        assert a.citation == kb.by_id[a.rule_id].citation and a.citation.url.startswith("https://")
    assert res.profile_run().padding_share > 0.3
    if "data.dynamic_padding" in applied:
        assert res.patched_run().padding_share < 0.15

    # the diff applies to the user's own folder (git apply and patch -p1)
    patched = Path(res.patch().patched_file).read_text()
    for tool in (["git", "apply"], ["patch", "-p1", "--quiet"]):
        work = tmp_path / f"apply-{tool[0]}"
        shutil.copytree(wl.root, work, ignore=shutil.ignore_patterns("__pycache__"))
        if tool[0] == "git":
            subprocess.run(["git", "init", "-q"], cwd=work, check=True)
        subprocess.run(tool, input=res.patch().diff, text=True, cwd=work, check=True)
        assert (work / "train.py").read_text() == patched

    # measured, in real (non-padding) tokens/s
    rep = res.audit_report()
    assert rep.throughput_unit == "real tokens/s"
    assert res.profile_run().provenance.kind == "measured" and res.patched_run().provenance.kind == "measured"
    # how much faster is a benchmark's question (benchmarks/); here: a measured speedup whose verdict its interval
    # supports, whatever the machine's load
    iv = rep.measured_interval
    assert rep.measured_speedup > 0 and iv.low <= rep.measured_speedup <= iv.high
    assert {"faster": iv.low > 1.0, "slower": iv.high < 1.0, "no significant change": iv.low <= 1.0 <= iv.high}[
        iv.verdict], (iv, rep.baseline_throughputs, rep.patched_throughputs)

    html = write_html(rep, tmp_path / "report.html")
    page = html.read_text()
    assert len(re.findall(r"data:image/png;base64,", page)) == 2
    assert "data.dynamic_padding" in page    # applied (with its DataCollatorWithPadding) or listed as not applied
    if "data.dynamic_padding" in applied:
        assert "DataCollatorWithPadding" in page
    assert (res.report_path.parent / "report.html").is_file()
