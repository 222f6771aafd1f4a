"""Steps (state = prompt token IDs, action = response token IDs) and per-trajectory summaries."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import dagster as dg
import polars as pl
from deltalake import DeltaTable

from assets.automation import on_new_data_or_idle_sweep
from assets.checks import STEP_CHECKS, logprobs_aligned, misaligned_logprobs, unique_step_ids
from assets.incremental import Refreshed, incremental_asset
from assets.metadata import counts, histogram, sample
from claw_pipelines.config_files import quality_config
from claw_pipelines.derived_schemas import (
    OPEN_STATE,
    STEPS,
    TRAJECTORIES,
    conform,
)
from claw_pipelines.incremental.closed_tails import ClosedTails, open_turns_of
from claw_pipelines.incremental.increment import Increment, trajectory_ids
from claw_pipelines.incremental.turn_chunks import turn_chunks
from claw_pipelines.schemas import utc_now
from claw_pipelines.transforms.steps import extract_steps, stored_steps
from claw_pipelines.transforms.trajectories import (
    EVENT_COLUMNS,
    SUMMARIZED_COLUMNS,
    summarize_trajectories,
)

STEP_SAMPLE = ["trajectory_id", "step_index", "is_last", "token_source", "response_text"]


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
    from the token lists is computed here, while they are in memory (``SIGNAL_COLUMNS``).

    Reads only turns and trajectory events landed since its watermark plus its own small state
    (``steps_open``: turns of trajectories still open; ``steps_tails``: the closed tails it
    touches, appended to, never rewritten), so work grows with new data. A
    backlog is extracted in chunks of about ``CHUNK_TURNS`` turns (``turn_chunks``), as if the
    asset had run after each (state carried over; a trajectory's events go with the chunk
    holding its last new turn), one commit each; only the last moves the watermark, and each
    replaces its step ids, so re-running after a crash part-way cannot duplicate steps.
    """
    tails = ClosedTails.for_attempt(
        increment.lake, increment.run, increment.attempt, increment.committed_attempt
    )
    now = utc_now()
    run = _extract(increment, tails, config, now)
    if run.state_version is not None:
        tails.expire(now, timedelta(seconds=config.reopen_window_s))
        increment.drop_old_states("steps_open")
    new_steps = pl.concat(run.written) if run.written else None
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


@dataclass
class Extracted:
    """What a steps run extracted and wrote."""

    table: DeltaTable | None
    """The steps table after the run's last commit."""
    written: list[pl.DataFrame] = field(default_factory=list)
    """Per commit, the new steps' ids, sample columns and check flags."""
    open_turns: int = 0
    """Turns of trajectories still open after the run."""
    state_version: int | None = None
    """The version of ``steps_open`` this run wrote (None: it wrote none)."""


def _extract(
    increment: Increment, tails: ClosedTails, config: StepsConfig, now: datetime
) -> Extracted:
    """Extract and commit the run's new turns, one chunk (``turn_chunks``) per commit."""
    open_turns = open_turns_of(increment.state_as_of("steps_open"), tails)
    events = increment.new_rows("trajectory_events")
    chunks = turn_chunks(increment)
    run = Extracted(increment.snapshot)
    ngram = quality_config().repetition_ngram
    chunk_events = chunks.events_by_chunk(events)
    for index, chunk in enumerate(chunks.chunks):
        final = index == len(chunks.chunks) - 1
        known_tails = tails.scan()
        extraction = extract_steps(
            chunk.read(increment),
            open_turns
            if known_tails is None
            else pl.concat([open_turns, known_tails], how="diagonal_relaxed"),
            chunk_events[index],
            now=now,
            idle_timeout_s=config.idle_timeout_s,
            reopen_window_s=config.reopen_window_s,
            landed=increment.scan("turns"),
        )
        new_steps, open_turns = extraction.steps, extraction.open_turns.lazy()
        run.open_turns = extraction.open_turns.height
        if not (new_steps.height or increment.has_new_data or increment.predates(STEPS)):
            continue
        if extraction.new_tails.height:
            tails.append(extraction.new_tails)
        if final:
            run.state_version = increment.replace_state(
                "steps_open", extraction.open_turns, OPEN_STATE
            )
            tails.record_committed()
        replace = (
            ("step_id", new_steps.get_column("step_id").to_list())
            if len(chunks.chunks) > 1
            else None
        )
        stored = conform(stored_steps(new_steps, ngram), STEPS)
        run.table = increment.commit(stored, replace, watermark=final)
        run.written.append(
            new_steps.select(
                "step_id",
                *STEP_SAMPLE,
                "prefix_consistent",
                misaligned_logprobs().fill_null(False).alias("logprobs_misaligned"),
            )
        )
    return run


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

    written = increment.recompute(
        affected, build, TRAJECTORIES, ["num_steps", "outcome", "complete"]
    )
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
