"""Evidence survives: a run whose loss turns NaN ends in a report that names NaN, the site, the step and the cause.

Unit tests of :mod:`goblin_assets.measure.evidence` on mined patterns of a
real fp16 recording (tests/test_mining_miner.py ``record_half``) with configs
of each precision setup, then the whole audit of ``tests/data/half_workload``
(a tiny MLP trained after ``model.half()``): every stage runs, the warehouse
takes the non-finite sketches, and the evidence names the first site, the
training step and ``model.half()``.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import RunMetrics
from goblin_assets.measure.evidence import FINDING, nonfinite_evidence, nonfinite_section, train_step

HALF = Path(__file__).parent / "data" / "half_workload"


@pytest.fixture(scope="module")
def half_patterns():
    from goblin_assets.opscope.miner import NONFINITE, mine_patterns
    from tests.test_mining_miner import record_half

    assert NONFINITE == FINDING
    return mine_patterns(record_half())


def _config(tmp_path: Path, body: str):
    f = tmp_path / "train.py"
    f.write_text(body)
    return parse_config(f)


LOOP = """
import torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
"""


def test_half_without_amp_is_named_with_its_line(half_patterns):
    cfg = parse_config(HALF / "train.py")
    ev = nonfinite_evidence(half_patterns, RunMetrics(), cfg)
    assert ev.cause.kind == "fp16_weights_without_amp"
    assert ev.first["site"] == "linear_1" and ev.first["role"] == "out" and ev.first["train_step"] == 3
    assert ev.loss_step == 3 and ev.first["origin"] == "overflow"
    text = "\n".join(ev.markdown)
    assert text.startswith("## Non-finite values")
    for needle in ("NaN", "`linear_1` (out)", "training step 3", "`model.half()` at train.py:", "GradScaler",
                   "autocast", "65,504", "the loss computed from it is NaN", "learning rate 20"):
        assert needle in text, needle
    assert "<section" in ev.html and "linear_1" in ev.html and "<script" not in ev.html
    doc = ev.to_json()
    assert json.loads(json.dumps(doc))["first"]["site"] == "linear_1" and doc["cause"] == "fp16_weights_without_amp"
    assert nonfinite_section(half_patterns, None, cfg) == (ev.markdown, ev.html)


@pytest.mark.parametrize("body,kind", [
    (LOOP + "model.half()\n", "fp16_weights_without_amp"),
    ('"""Trained without autocast or GradScaler (said in a docstring, not done)."""' + LOOP + "model.half()\n",
     "fp16_weights_without_amp"),
    (LOOP + "with torch.autocast('cuda', dtype=torch.float16):\n    y = model(torch.ones(4))\n",
     "fp16_autocast_without_scaler"),
    (LOOP + "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
            "    y = model(torch.ones(4))\n", "fp16_with_scaler"),
    ("from transformers import TrainingArguments\nargs = TrainingArguments(output_dir='o', fp16=True)\n",
     "fp16_with_scaler"),
    (LOOP + "model.bfloat16()\n", "bf16"),
])
def test_the_precision_cause_follows_the_config(half_patterns, tmp_path, body, kind):
    pats = half_patterns.copy()
    if kind == "bf16":   # bf16 operands: their values are exact in both formats (8 significant bits)
        pats["evidence_json"] = [e.replace('"sample_format": "fp16"', '"sample_format": "fp16 or bf16"')
                                 for e in pats.evidence_json]
    ev = nonfinite_evidence(pats, None, _config(tmp_path, body))
    assert ev.cause.kind == kind, ev.cause.text


def test_fp32_and_no_config(half_patterns, tmp_path):
    fp32 = half_patterns.copy()
    fp32["evidence_json"] = [e.replace('"sample_format": "fp16"', '"sample_format": "fp32 or wider"')
                             for e in fp32.evidence_json]
    assert nonfinite_evidence(fp32, None, _config(tmp_path, LOOP)).cause.kind == "fp32"
    # no config: the sketched operands are exact fp16 values, so the weights are fp16 all the same
    assert nonfinite_evidence(half_patterns).cause.kind == "fp16_weights_without_amp"


def test_nothing_non_finite_gives_no_section(half_patterns):
    finite = half_patterns[half_patterns.finding != FINDING]
    assert nonfinite_evidence(finite, RunMetrics()) is None and nonfinite_section(finite) == ([], "")
    assert nonfinite_section(None) == ([], "")


def test_the_harness_parameter_check_alone_is_reported():
    ev = nonfinite_evidence(None, RunMetrics(nonfinite_step=2, nonfinite_params=["0.weight", "0.bias"]))
    text = "\n".join(ev.markdown)
    assert "after optimizer step 2 (0.weight, 0.bias)" in text and ev.param_step == 2 and ev.first is None


def test_training_steps_count_the_sketch_warm_up():
    assert train_step(0) == 2 and train_step(1, sketch_warmup=3) == 5


@pytest.fixture(scope="module")
def half_audit(tmp_path_factory):
    """The whole audit of tests/data/half_workload through ``goblin audit --plain --fail-on unhealthy`` (small
    step budgets): the session it ran, its exit status, its stdout and its warehouse."""
    from goblin_assets import cli

    tmp = tmp_path_factory.mktemp("half")
    mp = pytest.MonkeyPatch()
    sessions = []
    opened = cli.open_session
    mp.setattr(cli, "open_session", lambda *a, **k: sessions.append(opened(*a, **k)) or sessions[-1])
    for var, value in {"GOBLIN_HOME": tmp / "home", "GOBLIN_RUNNER_WARMUP_STEPS": 1,
                       "GOBLIN_RUNNER_SKETCH_STEPS": 3}.items():
        mp.setenv(var, str(value))
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            code = cli.main(["audit", str(HALF), "--plain", "--fail-on", "unhealthy", "--steps", "3",
                             "--bench-steps", "3", "--repeats", "2", "--bench-budget", "15"])
    finally:
        mp.undo()
    (s,) = sessions
    return s, code, stdout.getvalue(), tmp / "home" / "warehouse.duckdb"


def test_the_summary_and_the_headline_lead_with_the_nan_and_fail_on_unhealthy_exits_3(half_audit):
    s, code, stdout, db = half_audit
    from goblin_assets.cli import EXIT_FAIL_ON
    from goblin_assets.warehouse.db import query

    first = stdout.splitlines()[0]
    assert first.startswith("verdict: ") and "NaN" in first, stdout
    assert code == EXIT_FAIL_ON                                            # the run is not healthy
    headline = s.report_path.read_text(encoding="utf-8").splitlines()[2]
    assert headline.startswith("**Verdict: ") and "NaN" in headline
    v = s.to_json()["verdict"]
    assert v["status"] == "unhealthy" and v["healthy"] is False and "NaN" in v["headline"]
    row = query("SELECT verdict, healthy FROM audits", db).iloc[0]
    assert (row.verdict, bool(row.healthy)) == ("unhealthy", False)


def test_a_half_workload_audit_ends_with_evidence_and_nothing_crashes(half_audit):
    from goblin_assets.warehouse.db import query

    s, _, _, db = half_audit
    written = {t: query(f"SELECT count(*) n FROM {t}", db).n[0] for t in ("sketches", "patterns")}
    assert s.report_path is not None and s.report_path.is_file()          # every stage ran, the report was written
    sk = s.tensor_sketches()
    assert sk.value.isna().any() and (sk.stat == "nonfinite").any()
    assert written["sketches"] == len(sk) and written["patterns"] == len(s.mined_patterns())
    nulls = query("SELECT count(*) n FROM sketches WHERE value IS NULL", db).n[0]
    assert nulls == int(sk.value.isna().sum()) > 0                        # NaN -> NULL, by the schema
    ev = nonfinite_evidence(s.mined_patterns(), s.profile_run(), s.training_config())
    assert ev is not None and ev.cause.kind == "fp16_weights_without_amp"
    assert ev.first["site"].startswith("linear_") and ev.first["train_step"] >= 2
    assert ev.loss_step is not None
    assert "NaN" in ev.headline and f"training step {ev.first['train_step']}" in ev.headline


def test_the_report_names_nan_the_site_the_step_and_the_cause(half_audit):
    s, _, _, _ = half_audit
    ev = nonfinite_evidence(s.mined_patterns(), s.profile_run(), s.training_config())
    report = s.report_path.read_text(encoding="utf-8")
    for needle in ("## Non-finite values", "NaN", f"`{ev.first['site']}`", f"training step {ev.first['train_step']}",
                   "model.half()"):
        assert needle in report, needle
    assert s.to_json()["nonfinite"]["first"]["site"] == ev.first["site"]
    assert "Non-finite values" in (s.out_dir / "report.html").read_text(encoding="utf-8")


def test_the_half_workloads_observed_settings_are_the_fp16_it_ran_with(half_audit):
    """Issue 27: every field observed in the run; precision fp16 from the stepped parameters' own dtype (no
    autocast), batch and accumulation equal to the harness's counts; the rows are in observed_settings."""
    from goblin_assets.config.observed import observed_values
    from goblin_assets.contracts import CONFIG_FIELDS
    from goblin_assets.warehouse.db import query

    s, _, _, db = half_audit
    m = s.profile_run()
    obs = {f: v for f, (v, _) in observed_values(m.observed).items()}
    assert set(obs) == set(CONFIG_FIELDS)
    assert obs["precision"] == "fp16" and set(m.observed["param_dtypes"]) == {"float16"} and not m.observed["autocast"]
    assert obs["batch_size"] == m.samples_per_step and obs["grad_accum_steps"] == m.observed["backward_per_step"][-1]
    rows = query("SELECT field, status FROM observed_settings", db)
    assert sorted(rows.field) == sorted(CONFIG_FIELDS) and set(rows.status) == {"observed"}
