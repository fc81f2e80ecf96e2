"""The offline agent's full audit of workloads/digits_mlp matches the audit session's report; the chat asset.

The audit session runs first (few steps); ``goblin chat`` then audits the same
workload offline in the same GOBLIN_HOME, so its benchmark is a cache hit:
the rules fired, the patch and the benchmark numbers must be identical, and
so must the report text once the fields measured by the two (separate)
profiled runs are taken from the first audit's report.
"""
from __future__ import annotations

import json

import dagster as dg
import pytest
from dagster_duckdb import DuckDBResource

from goblin_assets.agent import CANONICAL_ORDER
from goblin_assets.audit.session import AuditSession
from goblin_assets.cli import main
from goblin_assets.defs.agent import ConversationConfig, audit_conversation
from goblin_assets.defs.resources import LocalRunnerResource, WarehouseResource
from goblin_assets.measure import benchmark as benchmark_module
from goblin_assets.report.markdown import render_markdown, report_markdown
from goblin_assets.runners.workload import load_workload
from goblin_assets.settings import AuditSettings
from tests.conftest import WORKLOADS, conversation_inputs

pytestmark = pytest.mark.slow

#: Two alternating pairs (up to 12 s): the tests compare the conversation with the pipeline, whatever the
#: verdict (the loader fix's size is tests/test_audit_e2e.py's; here a noisy machine may leave it undecided).
SETTINGS = AuditSettings(bench_budget_s=12, profiled_steps=3, bench_steps=8, bench_repeats=2,
                         sketch_steps=2, timeout_s=300)

#: AuditReport fields that come from a profiled or sketched run (measured anew by each audit) or the clock.
PROFILED = ("buckets", "metrics", "before_step_time_s", "after_step_time_s", "predicted_low", "predicted_high",
            "confidence", "evidence_coverage", "rule_consistency", "consistency_notes", "warnings", "provenance",
            "created_at", "cache_hits", "profiled_speedup", "reconciliation", "calibration", "signals",
            "tensor_markdown", "tensor_html", "step_outliers",
            # the interval and the verdict say "replayed from the cache" for the second audit's benchmark
            "measured_interval", "verdict")


def _headline(rep) -> str:
    """The final report's first words: the pipeline's speedup under its own verdict (a noisy machine can
    make the paired interval straddle 1, and the report then says so)."""
    if rep.measured_speedup is None:  # nothing benchmarked (no rule fired): the report says why
        return "Measured speedup: not observable"
    iv = getattr(rep, "measured_interval", None)
    nsc = iv is not None and iv.verdict == "no significant change"
    return f"{'No significant change: ' if nsc else 'Measured speedup '}{rep.measured_speedup:.2f}x"


@pytest.fixture(scope="module")
def pipeline_audit(tmp_path_factory):
    """The audit session of digits_mlp, every stage run, in a private GOBLIN_HOME, kept for the module's tests.

    The benchmark cache key's image tag and runner-code hash are pinned for the module: on a
    machine where someone edits goblin_assets/runners meanwhile, the second audit would
    (rightly) miss the cache.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOBLIN_HOME", str(tmp_path_factory.mktemp("agent_home")))
        mp.setenv("GOBLIN_ROCM_IMAGE", "rocm/pytorch:test-agent")
        mp.setattr(benchmark_module, "runner_code_hash", lambda h=benchmark_module.runner_code_hash(): h)
        yield AuditSession.open(load_workload(WORKLOADS / "digits_mlp"), settings=SETTINGS).run_all()


def test_goblin_chat_offline_matches_the_pipeline_report(pipeline_audit, capsys, monkeypatch):
    res = pipeline_audit
    for var in ("GOBLIN_LLM_BASE_URL", "GOBLIN_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    sessions: list[AuditSession] = []
    start = AuditSession.open.__func__

    def capture(cls, *a, **kw):
        sessions.append(start(cls, *a, **kw))
        return sessions[-1]

    monkeypatch.setattr(AuditSession, "open", classmethod(capture))
    code = main(["chat", str(WORKLOADS / "digits_mlp"), "--steps", "3", "--bench-steps", "8", "--repeats", "2",
                 "--bench-budget", "12", "--json"])
    assert code == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["name"] for e in events if e["kind"] == "tool_call"] == list(CANONICAL_ORDER)
    assert all(e["ok"] for e in events if e["kind"] == "tool_result")
    final = events[-1]
    assert final["kind"] == "final_report" and not final["capped"] and final["model_error"] is None
    s = sessions[0]
    fired = lambda ms: [m.rule_id for m in ms if m.fired]  # noqa: E731
    assert final["text"].startswith(_headline(s.audit_report()))
    # where the numbers hold is said of measured numbers: not when nothing was benchmarked (no rule fired)
    assert ("hold only for workload digits_mlp" in final["text"]) == (s.benchmarks() is not None)
    assert all(r in final["text"] for r in fired(s.kb_matches()))
    if fired(s.kb_matches()) != fired(res.kb_matches()):
        # the loader rule reads each profile's measured data-wait share, which a loaded machine moves: the chat's
        # own profile fired other rules than the pipeline's, so its patch (and benchmark) is another one
        return
    # the same rules fired (whichever they are: none on a machine that kept the loader rule quiet in both)
    assert final["text"].startswith(_headline(res.audit_report()))
    assert s.patch().diff == res.patch().diff and s.patch().new_config == res.patch().new_config
    assert [a.rule_id for a in s.patch().applied] == [a.rule_id for a in res.patch().applied]
    rep, res_rep = s.audit_report(), res.audit_report()
    assert final["report_markdown"] == report_markdown(rep, "report.png")
    if res.benchmarks() is None:
        # no rule fired, or the patch changes nothing: neither audit benchmarked, and both say why; the
        # report's numbers are then each audit's own profile (nothing measured in common to compare)
        assert s.benchmarks() is None and s.patched_run() is None and res.patched_run() is None
        assert rep.measured_speedup is None and res_rep.measured_speedup is None
        assert s.not_observable["benchmarks"] == res.not_observable["benchmarks"]
        return
    for arm in ("baseline", "patched"):   # the second benchmark is the first one, from the cache
        b, res_b = s.benchmarks()[arm], res.benchmarks()[arm]
        assert b.cache_hit and b.throughputs == res_b.throughputs and b.cache_key == res_b.cache_key
    assert rep.measured_speedup == res_rep.measured_speedup and rep.cache_hits == ["baseline", "patched"]
    assert rep.measured_interval.cache_hit and (rep.measured_interval.low, rep.measured_interval.high) == (
        res_rep.measured_interval.low, res_rep.measured_interval.high)
    # the report text is the first audit's, once the fields of the profiled runs are the pipeline's too
    same = rep.model_copy(update={
        **{f: getattr(res_rep, f) for f in PROFILED},
        "applied": [a.model_copy(update={"predicted_recovery": b.predicted_recovery})
                    for a, b in zip(rep.applied, res_rep.applied)]})
    assert render_markdown(same, "report.png") == render_markdown(res_rep, "report.png")


def test_audit_conversation_asset_over_a_materialized_audit(pipeline_audit, monkeypatch, tmp_path):
    res = pipeline_audit
    monkeypatch.delenv("GOBLIN_LLM_BASE_URL", raising=False)

    class Refuse:
        kind = "local"

        def run(self, *a, **kw):
            raise AssertionError("the conversation ran a stage again")

    class NoRuns(LocalRunnerResource):
        def get_runner(self, workload=None):  # seeded from the audit: the conversation must run no stage again
            return Refuse()

    ctx = dg.build_asset_context(partition_key="digits_mlp")
    out = audit_conversation(ctx, config=ConversationConfig(), runner=NoRuns(),
                             warehouse=WarehouseResource(duckdb=DuckDBResource(database=str(tmp_path / "wh.duckdb"))),
                             **conversation_inputs(res))   # no benchmark when no rule fired: the arms are None
    md = out.metadata["transcript"].value
    for name in CANONICAL_ORDER:
        assert f"`{name}`" in md
    assert "## Final report (offline planner (no model), 6 tool calls)" in md
    assert _headline(res.audit_report()) in md and "```diff" in md
    assert out.metadata["tool_calls"] == 6 and out.metadata["model_error"] == ""
    assert out.metadata["what_if_audits"].value == [] and out.metadata["dagster/row_count"].value == 0
