"""The whole audit on the real MiniLM + LoRA workload: KB rules, a diff that applies, a measured gain.

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
from goblin_assets.audit.kb import load_kb
from goblin_assets.audit.session import AuditSession
from goblin_assets.audit.report import write_html
from goblin_assets.settings import AuditSettings
from goblin_assets.runners.workload import load_workload

pytestmark = pytest.mark.slow


def test_minilm_audit_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    wl = load_workload(REPO_ROOT / "workloads" / "minilm_lora_cls")
    kb = load_kb()
    settings = AuditSettings(device="cpu", timeout_s=900, profiled_steps=3, bench_steps=8, bench_repeats=2,
                             sketch_steps=1)
    res = AuditSession.open(wl, settings=settings, kb=kb).run_all()

    # the profiled baseline: tokens from the real input_ids the Trainer's (accelerate-wrapped) DataLoader yields
    m = res.profile_run()
    assert m.ok and m.provenance.kind == "measured" and m.steps == 3 and m.unit == "tokens"
    assert m.tokens_per_sec and m.tokens_per_sec > 0
    assert m.samples_per_step == 8
    assert m.attention_kernel_loaded is False  # attn_implementation="eager"
    assert sum(b.seconds for b in m.waste_budget.values()) == pytest.approx(m.step_time_s, rel=0.05)
    assert m.trace_path and Path(m.trace_path).is_file()
    assert m.headroom_batch is not None and m.headroom_batch > 8

    # the rules come from the KB, with their citations; no special case in code
    applied = {a.rule_id for a in res.patch().applied}
    assert applied == {"data.dynamic_padding", "attention.eager_to_sdpa"}
    for a in res.patch().applied:
        assert a.citation == kb.by_id[a.rule_id].citation and a.citation.url.startswith("https://")
    assert res.profile_run().padding_share > 0.3 and res.patched_run().padding_share < 0.15

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
    assert rep.measured_speedup > 1.0, (rep.baseline_throughputs, rep.patched_throughputs)

    html = write_html(rep, tmp_path / "report.html")
    page = html.read_text()
    assert len(re.findall(r"data:image/png;base64,", page)) == 2
    assert "data.dynamic_padding" in page and "DataCollatorWithPadding" in page
    assert (res.report_path.parent / "report.html").is_file()
