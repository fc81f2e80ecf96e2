"""The conversational audit agent over a materialized audit, as an asset of the workload partition."""

import dagster as dg

from goblin_assets.agent import FinalReport, run_agent, transcript_markdown
from goblin_assets.agent.factory import make_backend
from goblin_assets.agent.record import audits_of, what_if_frames
from goblin_assets.contracts import BenchmarkResult, ConfigDict, Patch, RuleMatch, RunMetrics
from goblin_assets.defs.audit import audit_session, measured_arms
from goblin_assets.defs.partitions import workloads_partitions
from goblin_assets.defs.resources import POOL, RunnerResource, WarehouseResource
from goblin_assets.kb.rules import KnowledgeBase
from goblin_assets.runners.workload import Workload


class ConversationConfig(dg.Config):
    """``question``: what to ask the agent (empty: a full audit); e.g. "what if I double the batch?"."""

    question: str = ""


@dg.asset(group_name="reports", partitions_def=workloads_partitions, kinds={"python"}, pool=POOL)
def audit_conversation(context: dg.AssetExecutionContext, config: ConversationConfig,
                       audit_report, training_config: ConfigDict,
                       profile_run: RunMetrics, kb_matches: list[RuleMatch], patch: Patch,
                       benchmark_baseline: BenchmarkResult | None, benchmark_patched: tuple | None,
                       workload_source: Workload, kb_rules: KnowledgeBase,
                       runner: RunnerResource, warehouse: WarehouseResource) -> dg.MaterializeResult:
    """The audit agent (offline planner, or the model at $GOBLIN_LLM_BASE_URL) asked about this audit; its transcript.

    The session is seeded with this partition's materialized stages, so only a what-if question runs anything.
    Each what-if that measured a run is an audit of its own: its rows are written to the warehouse
    (:func:`~goblin_assets.agent.record.what_if_frames`, as ``goblin chat`` records its what-ifs); the
    partition's audit itself was written by its own steps and is not written again.
    ``audit_report`` is an ``AuditReport``, or a ``ReplayReport`` for a replay workload (the synthetic
    corpus; left unannotated because Dagster types take no unions).  A replay benchmarks nothing: the
    agent's benchmark and comparison tools say so (not observable, with the reason) and its rules were
    checked on the recorded host.
    """
    bench, after, patch = measured_arms(benchmark_baseline, benchmark_patched, patch)
    session = audit_session(context, workload_source, runner, kb=kb_rules, training_config=training_config,
                            profile_run=profile_run, kb_matches=kb_matches, patch=patch, benchmarks=bench,
                            patched_run=after, audit_report=audit_report)
    events = list(run_agent(make_backend(), session, config.question))
    final: FinalReport = events[-1]  # run_agent always ends with one
    whatifs = [s.audit_id for s in audits_of(session) if s is not session]
    written = warehouse.write(what_if_frames(session))  # nothing to write (no measured what-if): no connection
    return dg.MaterializeResult(metadata={
        **written, "what_if_audits": dg.MetadataValue.json(whatifs),
        "transcript": dg.MetadataValue.md(transcript_markdown(events)),
        "backend": final.backend, "tool_calls": final.tool_calls, "capped": final.capped,
        "model_error": final.model_error or "",
    })


AGENT_ASSETS = [audit_conversation]
