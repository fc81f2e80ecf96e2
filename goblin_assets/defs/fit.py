"""The ``memory_fit`` asset: ``goblin fit`` for each workload partition (table ``memory_fit``).

Thin: it opens the partition's audit session and calls
:meth:`~goblin_assets.audit.session.AuditSession.memory_fit` (two small-batch
memory probes, never the configured run), writes the rows through the
warehouse resource and returns the answer.  It is not one of the audit's
stages (``audit_workload`` does not run it): a fit is asked for before a run.
"""

import dagster as dg

from goblin_assets.audit.fit import fit_text
from goblin_assets.defs.audit import _KW, audit_session
from goblin_assets.defs.resources import POOL, RunnerResource, WarehouseResource
from goblin_assets.runners.workload import Workload
from goblin_assets.warehouse.frames import memory_fit_frame


@dg.asset(group_name="memory", pool=POOL, dagster_type=dg.PythonObjectDagsterType(dict, name="MemoryFit"), **_KW)
def memory_fit(context: dg.AssetExecutionContext, workload_source: Workload, runner: RunnerResource,
               warehouse: WarehouseResource):
    """Will the configured step fit? Its memory term by term (provenance each), the margin, the levers (table `memory_fit`)."""
    s = audit_session(context, workload_source, runner)
    ans = s.memory_fit()
    ans["fit_id"] = f"{s.audit_id}-fit"
    written = warehouse.write({"memory_fit": memory_fit_frame(ans, ans["fit_id"])})
    verdict = {True: "fits", False: "does not fit", None: "undetermined"}[ans["fits"]]
    return dg.MaterializeResult(value=ans, metadata={
        **written, "verdict": verdict, "peak_bytes": dg.MetadataValue.float(float(ans["peak_bytes"] or 0.0)),
        "budget_bytes": dg.MetadataValue.float(float(ans["budget_bytes"] or 0.0)),
        "answer": dg.MetadataValue.md(f"```\n{fit_text(ans)}\n```")})


FIT_ASSETS = [memory_fit]
