"""Steps (state = prompt token IDs, action = response token IDs) and per-trajectory summaries."""

import dagster as dg
import polars as pl

from assets.automation import on_new_data, on_new_data_or_idle_sweep
from assets.incremental import Increment, trajectory_ids
from assets.landing import OWNERS
from assets.metadata import counts, histogram, sample, written_metadata
from claw_pipelines.derived_schemas import NARROW_STEPS, OPEN_STATE, STEPS, TRAJECTORIES, conform
from claw_pipelines.schemas import utc_now
from claw_pipelines.transforms.steps import extract_steps
from claw_pipelines.transforms.trajectories import summarize_trajectories
from resources.lake import LakeResource

STEP_SAMPLE = ["trajectory_id", "step_index", "is_last", "token_source", "response_text"]


class StepsConfig(dg.Config):
    """Trajectory closing rules (editable in the launchpad)."""

    idle_timeout_s: float = 600.0
    reopen_window_s: float = 86_400.0


@dg.asset(
    group_name="steps",
    kinds={"deltalake", "polars"},
    owners=OWNERS,
    deps=["turns", "trajectory_events"],
    automation_condition=on_new_data_or_idle_sweep(),
    pool="claw_steps",
)
def steps(context: dg.AssetExecutionContext, config: StepsConfig, lake: LakeResource):
    """Turns of closed trajectories as ordered steps, with prefix-consistency per step.

    Reads only turns and trajectory events landed since its watermark plus its own small
    ``steps_open`` state (turns of trajectories still open), so work grows with new data.
    """
    increment = Increment.begin(lake.lake(), "steps", "steps", ["turns", "trajectory_events"])
    extraction = extract_steps(
        increment.new_rows("turns", keep_version=True),
        increment.state_as_of("steps_open"),
        increment.new_rows("trajectory_events"),
        now=utc_now(),
        idle_timeout_s=config.idle_timeout_s,
        reopen_window_s=config.reopen_window_s,
        emitted=None
        if increment.snapshot is None
        else increment.lake.scan("steps", increment.snapshot.version()),
    )
    new_steps = extraction.steps
    if new_steps.height or increment.has_new_data:
        increment.replace_state("steps_open", conform(extraction.open_state, OPEN_STATE))
        table = increment.commit(conform(new_steps, STEPS))
    else:
        table = increment.snapshot
    open_turns = extraction.open_state.filter(pl.col("state") == "open").height
    context.log.info("%d new steps, %d turns still open", new_steps.height, open_turns)
    metadata = {
        "open_turns": open_turns,
        "sample": sample(new_steps, ["step_id", *STEP_SAMPLE]),
        "prefix_consistent_share": (
            float(new_steps["prefix_consistent"].mean()) if new_steps.height else None
        ),
    }
    if table is not None:
        metadata.update(written_metadata(increment, table, new_steps.height))
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(
    group_name="steps",
    kinds={"deltalake", "polars"},
    owners=OWNERS,
    deps=[steps, "trajectory_events"],
    automation_condition=on_new_data(),
    pool="claw_trajectories",
)
def trajectories(context: dg.AssetExecutionContext, lake: LakeResource):
    """One summary row per trajectory: steps, tokens, duration, outcome, prefix-tree saving.

    Recomputes only the trajectories touched by new steps or events and replaces their rows.
    """
    increment = Increment.begin(
        lake.lake(), "trajectories", "trajectories", ["steps", "trajectory_events"]
    )
    affected = trajectory_ids(
        increment.new_rows("steps", ["trajectory_id"]),
        increment.new_rows("trajectory_events", ["trajectory_id"]),
    )
    if increment.upto["steps"] is None:
        affected = []

    def build(keys: list[str]) -> pl.DataFrame:
        return summarize_trajectories(
            increment.rows_where("steps", "trajectory_id", keys, NARROW_STEPS.names),
            increment.rows_where("trajectory_events", "trajectory_id", keys),
        ).collect()

    written = increment.recompute(
        affected, build, TRAJECTORIES, ["num_steps", "outcome", "complete"]
    )
    summary = written.summary
    context.log.info("%d trajectories recomputed", summary.height)
    return dg.MaterializeResult(
        metadata={
            **written_metadata(increment, written.table, summary.height),
            "sample": sample(
                written.head,
                ["trajectory_id", "num_steps", "complete", "outcome", "outcome_reward"],
            ),
            "steps_per_trajectory": histogram(summary.get_column("num_steps")),
            "outcomes": dg.MetadataValue.json(counts(summary, "outcome")),
        }
    )
