"""The bundled digits audit on both kinds of host: with and without CPU bf16 matrix units.

The host is reported through the host-facts object (``use_host``), never read
from this machine's CPU flags, so the verdicts are the same on any x86 machine.
(The MiniLM audit on both kinds is in tests/test_minilm_audit.py.)
"""
from __future__ import annotations

import pytest

from goblin_assets.audit.session import AuditSession
from goblin_assets.host import use_host
from goblin_assets.runners.workload import load_workload
from goblin_assets.settings import AuditSettings
from tests.conftest import TEST_BENCH_BUDGET_S, WORKLOADS

pytestmark = pytest.mark.slow

SMALL = AuditSettings(bench_budget_s=TEST_BENCH_BUDGET_S, device="cpu", timeout_s=300, profiled_steps=3, bench_steps=6,
                      bench_repeats=1, sketch_steps=1)


@pytest.mark.parametrize("bf16_units", [True], ids=["with-bf16-units"])
def test_digits_audit_on_both_kinds_of_host(bf16_units, goblin_home):
    """With bf16 units here; without (the suite's host) in tests/test_defs.py's digits audit, which checks the same."""
    with use_host({"amx_bf16": bf16_units, "avx512_bf16": bf16_units}):
        s = AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), settings=SMALL).run_all()
    prec = s.profile_run().waste_budget["precision_path"]
    assert prec.status == "estimated"
    if bf16_units:   # half the fp32 GEMM time is what bf16 units would save
        assert prec.seconds > 0 and "half the CPU op time" in prec.note
    else:
        assert prec.seconds == 0 and "no bf16" in prec.note
    # the loader-bound MLP is not compute-bound: the bf16 rule stays quiet on either host
    fired = {m.rule_id for m in s.kb_matches() if m.fired}
    assert "precision.cpu_bf16_amx" not in fired
    assert s.report_path.is_file()
    if fired:   # the loader rule reads the measured data-wait share: a loaded machine can keep it quiet
        assert s.audit_report().measured_speedup > 0
    else:
        assert s.verdict().status == "no patch"
    assert s.to_json()["host"]["cpu_bf16_matmul"] is bf16_units
