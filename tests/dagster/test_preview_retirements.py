"""The inspector's batch preview plans with the retirements the batch asset left, less those
that newer rows void (in the curated change feed, in scored steps or labels curated_steps has not
taken in yet): it shows what a preview reading everything shows, at each stage."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster_harness import CHAIN, Driver
from dagster_rollouts import land_rollouts
from polars.testing import assert_frame_equal

from claw_pipelines.config_files import recipes
from claw_pipelines.inspector import batch_preview
from claw_pipelines.inspector.batch_preview import Preview, preview, standing_retirements
from claw_pipelines.inspector.tables import LakeIndex
from claw_pipelines.schemas import Label, Reward, rows_to_arrow

RECIPE = recipes()["grpo"]


def _planned(result: Preview) -> list[str]:
    return sorted(result.plan.rows.get_column("turn_id"))


def _assert_same_as_reading_everything(bound, index: LakeIndex, standing_rows: int) -> None:
    state = index.refresh()
    retired, _ = standing_retirements(bound.lake, state, RECIPE)
    assert retired is not None and retired.collect().height == standing_rows
    with_retirements = preview(bound.lake, state, RECIPE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch_preview, "standing_retirements", lambda *_: (None, None))
        everything = preview(bound.lake, state, RECIPE)
    assert _planned(with_retirements) == _planned(everything)
    assert_frame_equal(with_retirements.groups, everything.groups)  # spreads: float tolerance
    assert_frame_equal(with_retirements.dropped, everything.dropped)


def test_the_preview_voids_what_the_planner_would_and_what_it_has_not_seen_yet(
    bound, instance
) -> None:
    driver = Driver(bound, instance)
    flat = land_rollouts(bound.lake, groups=3, group_size=4, steps=1, flat=True)
    land_rollouts(bound.lake, groups=2, group_size=4, steps=1, seed=1)
    driver.refresh()
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)  # 2 groups: not ready
    assert bound.lake.scan("batch_retired/grpo").collect().height == 12
    index = LakeIndex(bound.lake, ["grpo"])
    _assert_same_as_reading_everything(bound, index, standing_rows=12)

    first, second, _ = flat.groups
    late = Reward(trajectory_id=flat.groups[first][0], value=0.0)
    bound.lake.append("rewards", rows_to_arrow(Reward, [late.model_dump()]))
    driver.tick("landing_ingest_sensor")
    driver.materialize(CHAIN[:-1])  # scored_steps has the reward, curated_steps not yet
    _assert_same_as_reading_everything(bound, index, standing_rows=8)

    label = Label(target_kind="trajectory", target_id=flat.groups[second][1], trainable=False)
    bound.lake.append("labels", rows_to_arrow(Label, [label.model_dump()]))
    _assert_same_as_reading_everything(bound, index, standing_rows=4)

    driver.refresh()  # now both are in the curated change feed since the retirements
    _assert_same_as_reading_everything(bound, index, standing_rows=4)
