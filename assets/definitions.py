"""The Dagster composition root: the code location ``claw_pipelines`` (see workspace.yaml).

It binds the assets, checks and sensors of ``assets/`` and the resources of ``resources/`` to
the environment (lake root, sensor interval) and picks the executor. It lives here, not in
``claw_pipelines``: the library never imports the Dagster layer.
"""

from __future__ import annotations

import gc

import dagster as dg

from assets import history, landing, maintenance, quality, release, rewards, steps
from assets.automation import build_automation_sensor
from assets.batches import build_recipe_definitions
from assets.executor import claw_executor
from claw_pipelines.lake.store import is_remote
from claw_pipelines.settings import get_settings
from resources.lake import LakeResource
from resources.orchestration import OrchestrationSettings


def _lake_of_settings() -> LakeResource:
    """The lake of CLAW_LAKE_URI, refused at load with one line (``LakeStoreError``) when it is
    configured for unsafe commits or its object store cannot be written. Every run's process
    loads the definitions too: a local lake, made by its first commit, is not probed."""
    resource = LakeResource.from_settings(get_settings())
    lake = resource.lake()
    if is_remote(lake.root):
        lake.check_writable()
    return resource


def build_definitions(
    lake: LakeResource | None = None,
    sensor_interval_s: int | None = None,
    sensor_wait_s: float | None = None,
) -> dg.Definitions:
    """The code location, bound to ``lake`` (default: CLAW_LAKE_URI) for tests and tools;
    sensor timing from ``OrchestrationSettings`` unless given."""
    settings = OrchestrationSettings()
    interval = sensor_interval_s or settings.sensor_interval_s
    wait = settings.sensor_wait_s if sensor_wait_s is None else sensor_wait_s
    lifecycle = dg.Definitions(
        assets=[
            *landing.LANDING_SPECS,
            steps.steps,
            steps.trajectories,
            rewards.rewarded_steps,
            quality.scored_steps,
            quality.curated_steps,
            *release.release_assets(),
        ],
        sensors=[landing.build_ingest_sensor(interval, wait), build_automation_sensor(interval)],
        jobs=[maintenance.landing_maintenance, history.dagster_history],
        schedules=[maintenance.landing_maintenance_schedule, history.dagster_history_schedule],
        resources={"lake": lake or _lake_of_settings()},
        # One process per run (steps are small and write their own tables), which frees the
        # pool slots of runs whose process died.
        executor=claw_executor,
    )
    return dg.Definitions.merge(lifecycle, build_recipe_definitions(interval))


defs = build_definitions()

# Each process that loads the code location (a run's worker, the code server that evaluates the
# sensors) keeps what loading it allocated for its whole life. Frozen, those ~160k objects are
# not walked again by every full garbage collection: a refresh run paid one, 0.14-0.18 s of a
# one-group refresh (docs/benchmarks.md). A collection right after loading frees nothing, so
# none runs first.
gc.freeze()
