"""The single place where Dagster things are wired: ``goblin_assets.definitions:defs``."""
from __future__ import annotations

import dagster as dg

from goblin_assets.defs.agent import AGENT_ASSETS
from goblin_assets.defs.audit import AUDIT_ASSETS
from goblin_assets.defs.checks import AUDIT_CHECKS
from goblin_assets.defs.automation import automation_sensor, observe_rocm_image_daily, observe_rocm_image_job
from goblin_assets.defs.mining import MINING_ASSETS
from goblin_assets.defs.opscope import OPSCOPE_ASSETS
from goblin_assets.defs.partitions import workload_folders_sensor
from goblin_assets.defs.sql import SQL_ASSETS
from goblin_assets.defs.resources import runner_from_env, warehouse_resource

#: Each step runs in its own process (so a crashing workload cannot take the run down); the
#: forkserver preloads this module once, so a step starts in ~2 s instead of re-importing
#: Dagster and the definitions (~5-9 s measured on 2 cores).
EXECUTOR = dg.multiprocess_executor.configured(
    {"start_method": {"forkserver": {"preload_modules": ["goblin_assets.definitions"]}}})

defs = dg.Definitions(
    assets=[*AUDIT_ASSETS, *AGENT_ASSETS, *OPSCOPE_ASSETS, *MINING_ASSETS, *SQL_ASSETS],
    asset_checks=AUDIT_CHECKS,
    sensors=[workload_folders_sensor, automation_sensor],
    schedules=[observe_rocm_image_daily],
    jobs=[observe_rocm_image_job],
    resources={"runner": runner_from_env(), "duckdb": warehouse_resource()},
    executor=EXECUTOR,
)
