"""Rewards joined onto steps: late rewards, trajectory outcomes and YAML reward rules."""

import dagster as dg

from assets.incremental import Refreshed, incremental_asset
from assets.metadata import histogram, sample
from claw_pipelines.config_files import reward_config
from claw_pipelines.derived_schemas import REWARDED_STEPS
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.incremental.rewards_refresh import refresh_rewarded_steps

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
    run = refresh_rewarded_steps(increment, reward_config())
    summary = run.written.summary
    context.log.info("%d trajectories re-credited (%d steps)", run.trajectories, summary.height)
    return Refreshed(
        run.written.table,
        summary.height,
        metadata={
            "sample": sample(run.written.head, REWARD_SAMPLE, increment.lake.scan("turns")),
            "reward_distribution": histogram(summary.get_column("reward")),
            "reward_present_share": (
                float(summary["reward_present"].mean()) if summary.height else None
            ),
        },
    )
