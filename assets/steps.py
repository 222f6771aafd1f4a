"""Steps (state = prompt token IDs, action = response token IDs) and per-trajectory summaries."""

import dagster as dg
import polars as pl

from assets.automation import on_new_data_or_idle_sweep
from assets.checks import STEP_CHECKS, logprobs_aligned, unique_step_ids
from assets.incremental import Refreshed, incremental_asset
from assets.metadata import counts, histogram, sample
from claw_pipelines.config_files import quality_config
from claw_pipelines.derived_schemas import STEPS, TRAJECTORIES
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.incremental.steps_refresh import STEP_SAMPLE, refresh_steps
from claw_pipelines.incremental.trajectories_refresh import refresh_trajectories


class StepsConfig(dg.Config):
    """Trajectory closing rules (editable in the launchpad)."""

    idle_timeout_s: float = 600.0
    reopen_window_s: float = 86_400.0


@incremental_asset(
    "steps",
    sources=["turns", "trajectory_events"],
    schema=STEPS,
    group="steps",
    checks=STEP_CHECKS,
    automation_condition=on_new_data_or_idle_sweep(),
)
def steps(
    context: dg.AssetExecutionContext, increment: Increment, config: StepsConfig
) -> Refreshed:
    """Turns of closed trajectories as ordered steps, with prefix-consistency per step.

    A step points at its turn (turn_id, started_at, source_version) instead of copying its
    token lists and messages (``derived_schemas.TURN_COLUMNS``); what the quality signals need
    from the token lists is computed while they are in memory (``SIGNAL_COLUMNS``). Only new
    turns and events are read, a backlog a chunk per commit
    (``claw_pipelines.incremental.steps_refresh``).
    """
    run = refresh_steps(
        increment,
        idle_timeout_s=config.idle_timeout_s,
        reopen_window_s=config.reopen_window_s,
        repetition_ngram=quality_config().repetition_ngram,
    )
    new_steps = run.new_steps
    rows = 0 if new_steps is None else new_steps.height
    context.log.info("%d new steps, %d turns still open", rows, run.open_turns)
    checked = (
        new_steps
        if new_steps is not None
        else pl.DataFrame(schema={"step_id": pl.String, "logprobs_misaligned": pl.Boolean})
    )
    table = None if run.table is None else pl.scan_delta(run.table)
    return Refreshed(
        run.table,
        rows,
        metadata={
            "open_turns": run.open_turns,
            "sample": sample(new_steps, ["step_id", *STEP_SAMPLE]),
            "prefix_consistent_share": (
                float(new_steps["prefix_consistent"].mean()) if rows else None
            ),
        },
        checks=[
            unique_step_ids(table, checked.get_column("step_id")),
            logprobs_aligned(checked),
        ],
    )


@incremental_asset(
    "trajectories",
    sources=["steps", "trajectory_events"],
    schema=TRAJECTORIES,
    group="steps",
    op_tags={"dagster/priority": "-1"},  # off the way to a batch: after the releases in a run
)
def trajectories(context: dg.AssetExecutionContext, increment: Increment) -> Refreshed:
    """One summary row per trajectory: steps, tokens, duration, outcome, prefix-tree saving.

    Recomputes only the trajectories touched by new steps or events and replaces their rows.
    """
    written = refresh_trajectories(increment)
    summary = written.summary
    context.log.info("%d trajectories recomputed", summary.height)
    return Refreshed(
        written.table,
        summary.height,
        metadata={
            "sample": sample(
                written.head,
                ["trajectory_id", "num_steps", "complete", "outcome", "outcome_reward"],
            ),
            "steps_per_trajectory": histogram(summary.get_column("num_steps")),
            "outcomes": dg.MetadataValue.json(counts(summary, "outcome")),
        },
    )
