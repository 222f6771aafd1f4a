"""Rewards joined onto steps: late rewards, trajectory outcomes and YAML reward rules."""

import dagster as dg
import polars as pl

from assets.incremental import Refreshed, incremental_asset
from assets.metadata import histogram, sample
from claw_pipelines.config_files import reward_config
from claw_pipelines.derived_schemas import REWARDED_STEPS, STEPS, with_turn_columns
from claw_pipelines.incremental.increment import Increment, trajectory_ids
from claw_pipelines.lake import Lake
from claw_pipelines.transforms.reward_rules import ModelJudge, openai_judge
from claw_pipelines.transforms.rewards import affected_trajectories, reward_steps

REWARD_SAMPLE = ["trajectory_id", "step_index", "reward", "reward_sources", "response_text"]


@incremental_asset(
    "rewarded_steps",
    sources=["steps", "rewards", "trajectory_events", "trajectory_registrations"],
    schema=REWARDED_STEPS,
    group="rewards",
)
def rewarded_steps(context: dg.AssetExecutionContext, increment: Increment) -> Refreshed:
    """Steps with their credited reward; late rewards and registrations (ground truth for the
    rule rewards) re-credit their trajectory on arrival.

    Only trajectories touched by new steps, rewards or events are recomputed (from all of their
    steps and rewards) and their rows replaced, so a reward that lands a day late still reaches
    the next batch without reprocessing the table.
    """
    identity = ["turn_id", "trajectory_id", "group_id"]
    new_steps = increment.new_rows("steps", identity)
    new_rewards = increment.new_rows("rewards")
    new_events = increment.new_rows("trajectory_events")
    new_registrations = increment.new_rows("trajectory_registrations", ["trajectory_id"])
    all_steps = increment.scan("steps")
    affected = trajectory_ids()
    if all_steps is not None:
        affected = affected_trajectories(
            new_steps, new_rewards, new_events, all_steps.select(identity), new_registrations
        ).get_column("trajectory_id")
    config = reward_config()
    judge = None
    if config.judge.enabled:
        judge = _reading_conversations(openai_judge(config.judge), increment.lake)

    def build(keys: pl.Series) -> pl.DataFrame:
        touched = increment.rows_where("steps", "trajectory_id", keys, STEPS.names)
        return reward_steps(
            touched,
            _rewards_for(increment, touched),
            increment.rows_where("trajectory_events", "trajectory_id", keys),
            config,
            judge=judge,
            registrations=increment.rows_where("trajectory_registrations", "trajectory_id", keys),
            turns=increment.lake.scan("turns"),
        ).collect()

    written = increment.recompute(affected, build, REWARDED_STEPS, ["reward", "reward_present"])
    summary = written.summary
    context.log.info("%d trajectories re-credited (%d steps)", len(affected), summary.height)
    return Refreshed(
        written.table,
        summary.height,
        metadata={
            "sample": sample(written.head, REWARD_SAMPLE, increment.lake.scan("turns")),
            "reward_distribution": histogram(summary.get_column("reward")),
            "reward_present_share": (
                float(summary["reward_present"].mean()) if summary.height else None
            ),
        },
    )


def _reading_conversations(judge: ModelJudge, lake: Lake) -> ModelJudge:
    """``judge`` given each row's ``request_messages``, read from ``turns`` by turn_id for the
    rows it scores (the step tables point at their turns instead of repeating the
    conversation on every step)."""

    def with_conversation(rows: pl.DataFrame) -> pl.Series:
        return judge(with_turn_columns(rows, lake.scan("turns"), ["request_messages"]))

    return with_conversation


def _rewards_for(increment: Increment, touched: pl.DataFrame) -> pl.DataFrame | None:
    """Every reward (old or new) aimed at a touched step, trajectory or group. The targets go
    into the scan as Series, not Python lists (100k touched steps: 45 ms against 130)."""
    rewards = increment.scan("rewards")
    if rewards is None:
        return None

    def aimed(column: str) -> pl.Expr:
        return pl.col(column).is_in(touched.get_column(column).implode())

    return rewards.filter(aimed("turn_id") | aimed("trajectory_id") | aimed("group_id")).collect()
