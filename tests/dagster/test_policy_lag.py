"""``max_policy_lag`` counts from the version the trainer announced (``policy_versions``): steps
too far behind it are left out of batches as ``stale``, though no step carries a newer version,
and the batch that is planned records the announced version in its pins."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
from dagster_harness import Driver
from dagster_rollouts import land_rollouts

from claw_pipelines.config_files import recipes
from claw_pipelines.inspector.batch_preview import preview
from claw_pipelines.inspector.tables import LakeIndex
from claw_pipelines.lake import Lake
from claw_pipelines.policy.versions import TABLE
from claw_pipelines.schemas import PolicyEvent, rows_to_arrow

RECIPE = recipes()["grpo"]


def _announce(lake: Lake, version: int) -> None:
    """What ``POST /claw/v1/policy`` commits."""
    event = PolicyEvent(event="announce", version=version, writer_id="test")
    lake.append(TABLE, rows_to_arrow(PolicyEvent, [event.model_dump()]))


def test_steps_behind_the_announced_version_are_left_out_as_stale(bound, instance) -> None:
    driver = Driver(bound, instance)
    announced = 2 + RECIPE.filters.max_policy_lag
    behind = land_rollouts(bound.lake, groups=RECIPE.groups_per_batch, steps=1, policy_version=1)
    _announce(bound.lake, announced)
    driver.refresh()

    shown = preview(bound.lake, LakeIndex(bound.lake, ["grpo"]).refresh(), RECIPE)
    assert shown.plan.rows.is_empty()
    assert set(shown.plan.dropped.get_column("reason")) == {"stale"}
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)
    retired = bound.lake.scan("batch_retired/grpo").collect()
    stale = set(retired.filter(pl.col("reason") == "stale").get_column("group_id"))
    assert stale == set(behind.groups)

    current = land_rollouts(
        bound.lake, groups=RECIPE.groups_per_batch, steps=1, policy_version=announced - 1
    )
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    driver.materialize(["batch_grpo"], partition_key=request.partition_key)
    batched = bound.lake.scan("batches/grpo").collect()
    assert set(batched.get_column("group_id")) == set(current.groups)
    pins = bound.lake.scan("batch_ledger/grpo").select("pins").head(1).collect().item()
    assert json.loads(pins)["announced_policy_version"] == announced
