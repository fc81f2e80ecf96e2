"""The conversational audit agent over a materialized audit, as an asset of the workload partition."""

import dagster as dg

from goblin_assets.agent import AuditSession, FinalReport, make_backend, run_agent, transcript_markdown
from goblin_assets.audit.corpus import ReplayReport
from goblin_assets.audit.kb import KnowledgeBase
from goblin_assets.contracts import BenchmarkResult, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.defs.resources import RunnerResource
from goblin_assets.runners.workload import Workload


class ConversationConfig(dg.Config):
    """``question``: what to ask the agent (empty: a full audit); e.g. "what if I double the batch?"."""

    question: str = ""


@dg.asset(group_name="reports", partitions_def=workloads_partitions, kinds={"python"})
def audit_conversation(context: dg.AssetExecutionContext, config: ConversationConfig,
                       audit_report, training_config: ConfigDict,
                       profile_run: RunMetrics, kb_matches: list[RuleMatch], patch: Patch,
                       benchmark_baseline: BenchmarkResult | None, benchmark_patched: tuple | None,
                       workload_source: Workload, kb_rules: KnowledgeBase,
                       runner: RunnerResource) -> dg.MaterializeResult:
    """The audit agent (offline planner, or the model at $GOBLIN_LLM_BASE_URL) asked about this audit; its transcript.

    The session is seeded with this partition's materialized stages, so only a what-if question runs anything.
    ``audit_report`` is an ``AuditReport``, or a ``ReplayReport`` for a replay workload (the synthetic
    corpus; left unannotated because Dagster types take no unions): a replay has no measured benchmark
    to talk about, so the asset says so and runs no agent.
    """
    if isinstance(audit_report, ReplayReport) or benchmark_baseline is None or benchmark_patched is None:
        why = (f"{workload_source.name} is a {audit_report.provenance} recording "
               f"({getattr(audit_report, 'source', '') or 'no source'}): nothing was measured, so there is no "
               "benchmark for the agent to discuss")
        context.log.info(f"audit_conversation skipped: {why}")
        return dg.MaterializeResult(metadata={"transcript": dg.MetadataValue.md(f"_Not run_: {why}."),
                                              "backend": "none", "tool_calls": 0, "capped": False,
                                              "model_error": ""})
    bench_p, after = benchmark_patched
    session = AuditSession.start(
        workload_source, runner.get_runner(), kb=kb_rules, steps=runner.profiled_steps, bench_steps=runner.bench_steps,
        repeats=runner.bench_repeats, warmup=runner.warmup_steps, log=context.log.info, config=training_config,
        before=profile_run, matches=kb_matches, patch=patch,
        bench={"baseline": benchmark_baseline, "patched": bench_p}, after=after, report=audit_report)
    events = list(run_agent(make_backend(), session, config.question))
    final: FinalReport = events[-1]  # run_agent always ends with one
    return dg.MaterializeResult(metadata={
        "transcript": dg.MetadataValue.md(transcript_markdown(events)),
        "backend": final.backend, "tool_calls": final.tool_calls, "capped": final.capped,
        "model_error": final.model_error or "",
    })


AGENT_ASSETS = [audit_conversation]
