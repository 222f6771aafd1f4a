"""One run of the ``rewarded_steps`` table: the trajectories new data touches, re-credited.

Only trajectories touched by new steps, rewards, events or registrations (ground truth for the
rule rewards) are recomputed, from all of their steps and rewards, and their rows replaced, so
a reward that lands a day late still reaches the next batch without reprocessing the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from claw_pipelines.derived_schemas import REWARDED_STEPS, STEPS
from claw_pipelines.incremental.increment import Increment, Written, trajectory_ids
from claw_pipelines.transforms.reward_rules import RewardConfig, openai_judge, reading_conversations
from claw_pipelines.transforms.rewards import affected_trajectories, reward_steps, rewards_aimed_at

STEP_IDENTITY = ["turn_id", "trajectory_id", "group_id"]
"""What resolves a reward's target (a turn, a trajectory, a group) to trajectories."""


@dataclass
class Recredited:
    """What a rewarded_steps run wrote, and for how many trajectories."""

    written: Written
    trajectories: int


def refresh_rewarded_steps(increment: Increment, config: RewardConfig) -> Recredited:
    """Recompute the rewarded rows of every trajectory the run's new rows touch, under the
    reward rules (and model judge, when enabled) of ``config``."""
    new_steps = increment.new_rows("steps", STEP_IDENTITY)
    new_rewards = increment.new_rows("rewards")
    new_events = increment.new_rows("trajectory_events")
    new_registrations = increment.new_rows("trajectory_registrations", ["trajectory_id"])
    all_steps = increment.scan("steps")
    affected = trajectory_ids()
    if all_steps is not None:
        affected = affected_trajectories(
            new_steps, new_rewards, new_events, all_steps.select(STEP_IDENTITY), new_registrations
        ).get_column("trajectory_id")
    judge = None
    if config.judge.enabled:
        judge = reading_conversations(openai_judge(config.judge), increment.lake)

    def build(keys: pl.Series) -> pl.DataFrame:
        touched = increment.rows_where("steps", "trajectory_id", keys, STEPS.names)
        return reward_steps(
            touched,
            rewards_aimed_at(increment.scan("rewards"), touched),
            increment.rows_where("trajectory_events", "trajectory_id", keys),
            config,
            judge=judge,
            registrations=increment.rows_where("trajectory_registrations", "trajectory_id", keys),
            turns=increment.lake.scan("turns"),
        ).collect()

    written = increment.recompute(affected, build, REWARDED_STEPS, ["reward", "reward_present"])
    return Recredited(written, len(affected))
