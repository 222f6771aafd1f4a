"""One run of the ``trajectories`` table: the summaries of the trajectories new steps or events
touch, recomputed from all of their steps and events, their rows replaced."""

from __future__ import annotations

import polars as pl

from claw_pipelines.derived_schemas import TRAJECTORIES
from claw_pipelines.incremental.increment import Increment, Written, trajectory_ids
from claw_pipelines.transforms.trajectories import (
    EVENT_COLUMNS,
    SUMMARIZED_COLUMNS,
    summarize_trajectories,
)


def refresh_trajectories(increment: Increment) -> Written:
    """Recompute one summary row per touched trajectory (none before steps exist)."""
    affected = trajectory_ids(
        increment.new_rows("steps", ["trajectory_id"]),
        increment.new_rows("trajectory_events", ["trajectory_id"]),
    )
    if increment.upto["steps"] is None:
        affected = trajectory_ids()

    def build(keys: pl.Series) -> pl.DataFrame:
        return summarize_trajectories(
            increment.rows_where("steps", "trajectory_id", keys, SUMMARIZED_COLUMNS),
            increment.rows_where("trajectory_events", "trajectory_id", keys, EVENT_COLUMNS),
        ).collect()

    return increment.recompute(affected, build, TRAJECTORIES, ["num_steps", "outcome", "complete"])
