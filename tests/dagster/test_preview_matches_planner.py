"""The inspector's batch preview judges steps as the planner does: an open trajectory of a newer
policy, which no curated step carries yet, does not make the scored groups stale in the preview
while the planner batches them."""

from __future__ import annotations

from dagster_harness import Driver
from dagster_rollouts import land_rollouts

from claw_pipelines.config_files import recipes
from claw_pipelines.inspector.batch_preview import preview
from claw_pipelines.inspector.tables import LakeIndex

RECIPE = recipes()["grpo"]


def test_an_open_trajectory_of_a_newer_policy_leaves_the_preview_as_the_planner(
    bound, instance
) -> None:
    driver = Driver(bound, instance)
    landed = land_rollouts(bound.lake, groups=RECIPE.groups_per_batch, steps=1)
    newer = RECIPE.filters.max_policy_lag + 2
    land_rollouts(bound.lake, groups=1, group_size=1, steps=1, complete=False, policy_version=newer)
    driver.refresh()

    shown = preview(bound.lake, LakeIndex(bound.lake, ["grpo"]).refresh(), RECIPE)
    assert "stale" not in shown.plan.dropped.get_column("reason")
    assert set(shown.plan.rows.get_column("group_id")) == set(landed.groups)
    (request,) = driver.tick("batch_grpo_planner").run_requests
    driver.materialize(["batch_grpo"], partition_key=request.partition_key)
    batched = bound.lake.scan("batches/grpo").collect()
    assert set(batched.get_column("group_id")) == set(landed.groups)
