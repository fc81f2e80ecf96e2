"""Re-audits when the ROCm image changes: the ``rocm_image`` source asset, its daily
observation schedule and the Declarative Automation sensor.
"""
import warnings

import dagster as dg

from goblin_assets.runners.image import read_rocm_image

with warnings.catch_warnings():
    warnings.simplefilter("ignore", category=dg.BetaWarning)

    @dg.observable_source_asset(group_name="profiling", kinds={"docker"})
    def rocm_image(context) -> dg.ObserveResult:
        """The ROCm container image audits run in; its data version is the image tag and digest.

        Read from ``GOBLIN_ROCM_IMAGE`` or ``rocm_image.lock`` (plus ``docker manifest
        inspect`` when docker and a registry are reachable).  A new version re-runs every
        profile, benchmark and report partition through Declarative Automation.
        """
        ref = read_rocm_image(lookup=True)
        return dg.ObserveResult(data_version=dg.DataVersion(ref.version),
                                metadata={"image": ref.image, "digest": ref.digest or "unknown",
                                          "source": ref.source})


#: Assets that re-run when an upstream (ultimately ``rocm_image``) gets a new version.
REAUDIT = dg.AutomationCondition.eager()

_AC = dg.AutomationCondition
#: The knowledge base (unpartitioned, upstream of every audit) is built when it is missing: on the first
#: tick of a fresh instance (``initial_evaluation``; Dagster's ``on_missing`` skips what is missing then)
#: or once it goes missing again.  So the ``audit_workload`` job can run from a fresh ``make ui``.  A
#: failed build is not retried every tick (materialize the ``kb`` group by hand then).
BUILD_WHEN_MISSING = (_AC.missing() & (_AC.initial_evaluation() | _AC.missing().newly_true())
                      & ~_AC.any_deps_missing() & ~_AC.in_progress()).with_label("built when missing")

observe_rocm_image_job = dg.define_asset_job("observe_rocm_image", selection=[rocm_image])

observe_rocm_image_daily = dg.ScheduleDefinition(
    name="observe_rocm_image_daily", job=observe_rocm_image_job, cron_schedule="0 6 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)

automation_sensor = dg.AutomationConditionSensorDefinition(
    "goblin_automation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
)
