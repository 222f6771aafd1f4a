"""Steps (state = prompt token IDs, action = response token IDs) and per-trajectory summaries."""

from dataclasses import dataclass, replace
from datetime import timedelta

import dagster as dg
import numpy as np
import polars as pl

from assets.races import retried_when_raced
from assets.automation import on_new_data, on_new_data_or_idle_sweep
from assets.checks import (
    STEP_CHECKS,
    logprobs_aligned,
    misaligned_logprobs,
    schema_spec,
    schema_unchanged,
    unique_step_ids,
)
from claw_pipelines.incremental.closed_tails import ClosedTails
from claw_pipelines.incremental.increment import Increment, trajectory_ids
from assets.landing import OWNERS
from assets.metadata import counts, histogram, sample, written_metadata
from claw_pipelines.derived_schemas import (
    NARROW_STEPS,
    OPEN_STATE,
    STEP_SOURCE_COLUMNS,
    STEPS,
    TRAJECTORIES,
    conform,
    empty,
)
from claw_pipelines.lake import keyed
from claw_pipelines.schemas import utc_now
from claw_pipelines.transforms.steps import extract_steps
from claw_pipelines.transforms.trajectories import summarize_trajectories
from resources.lake import LakeResource

STEP_SAMPLE = ["trajectory_id", "step_index", "is_last", "token_source", "response_text"]

CHUNK_TURNS = 16_384
"""New turns extracted per commit, so a backlog (e.g. a first build) needs memory for a chunk."""


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
    check_specs=STEP_CHECKS,
)
@retried_when_raced
def steps(context: dg.AssetExecutionContext, config: StepsConfig, lake: LakeResource):
    """Turns of closed trajectories as ordered steps, with prefix-consistency per step.

    Reads only turns and trajectory events landed since its watermark plus its own small state
    (``steps_open``: turns of trajectories still open; ``steps_tails``: the closed tails it
    touches, appended to, never rewritten), so work grows with new data. A
    backlog is extracted in chunks of about ``CHUNK_TURNS`` turns (``TurnChunk``), as if the
    asset had run after each (state carried over; a trajectory's events go with the chunk
    holding its last new turn), one commit each; only the last moves the watermark, and each
    replaces its step ids, so re-running after a crash part-way cannot duplicate steps.
    """
    increment = Increment.begin(lake.lake(), "steps", "steps", ["turns", "trajectory_events"])
    tails = ClosedTails.for_attempt(
        increment.lake, increment.run, increment.attempt, increment.committed_attempt
    )
    open_turns = _open_turns(increment.state_as_of("steps_open"), tails)
    events = increment.new_rows("trajectory_events")
    chunks, last_range = _turn_chunks(increment)
    now, table, written, state_version = utc_now(), increment.snapshot, [], None
    for index, chunk in enumerate(chunks):
        final = index == len(chunks) - 1
        known_tails = tails.scan()
        extraction = extract_steps(
            chunk.read(increment),
            open_turns
            if known_tails is None
            else pl.concat([open_turns, known_tails], how="diagonal_relaxed"),
            _events_of_range(events, last_range, index),
            now=now,
            idle_timeout_s=config.idle_timeout_s,
            reopen_window_s=config.reopen_window_s,
            emitted=increment.lake.scan("steps"),
        )
        new_steps, open_turns = extraction.steps, extraction.open_turns.lazy()
        if not (new_steps.height or increment.has_new_data or increment.predates(STEPS)):
            continue
        if extraction.new_tails.height:
            tails.append(extraction.new_tails)
        if final:
            state_version = increment.replace_state("steps_open", extraction.open_turns, OPEN_STATE)
            tails.record_committed()
        replace = (
            ("step_id", new_steps.get_column("step_id").to_list()) if len(chunks) > 1 else None
        )
        table = increment.commit(conform(new_steps, STEPS), replace, watermark=final)
        written.append(
            new_steps.select(
                "step_id",
                *STEP_SAMPLE,
                "prefix_consistent",
                misaligned_logprobs().fill_null(False).alias("logprobs_misaligned"),
            )
        )
    if state_version is not None:
        tails.expire(now, timedelta(seconds=config.reopen_window_s))
        read = increment.states_read.get("steps_open")
        kept = [v for v in (state_version, read) if v is not None]
        increment.lake.drop_removed_files("steps_open", keep_versions=kept)
    open_count = extraction.open_turns.height
    new_steps = pl.concat(written) if written else None
    rows = 0 if new_steps is None else new_steps.height
    context.log.info("%d new steps, %d turns still open", rows, open_count)
    metadata = {
        "open_turns": open_count,
        "sample": sample(new_steps, ["step_id", *STEP_SAMPLE]),
        "prefix_consistent_share": float(new_steps["prefix_consistent"].mean()) if rows else None,
    }
    if table is not None:
        metadata.update(written_metadata(increment, table, rows))
    checked = (
        new_steps
        if new_steps is not None
        else pl.DataFrame(schema={"step_id": pl.String, "logprobs_misaligned": pl.Boolean})
    )
    return dg.MaterializeResult(
        metadata=metadata,
        check_results=[
            schema_unchanged(table, STEPS),
            unique_step_ids(
                None if table is None else pl.scan_delta(table), checked.get_column("step_id")
            ),
            logprobs_aligned(checked),
        ],
    )


def _open_turns(state: pl.LazyFrame | None, tails: ClosedTails) -> pl.LazyFrame:
    """The open turns of ``steps_open``. Lakes from before ``steps_tails`` also kept the closed
    tails there: those move to the log (once, as the state this run writes has none)."""
    if state is None:
        return empty(OPEN_STATE).lazy()
    closed = state.filter(pl.col("state") == "closed")
    if closed.select(pl.len()).collect().item():
        tails.append(closed)
    return state.filter(pl.col("state") == "open")


def _events_of_range(
    events: pl.DataFrame | None, last_range: pl.DataFrame, index: int
) -> pl.DataFrame | None:
    """The events of the trajectories whose last new turn is in range ``index``; events of
    trajectories without new turns go with the first range."""
    if events is None:
        return None
    ranges = events.join(
        last_range.select("trajectory_id", "_range"), on="trajectory_id", how="left"
    )
    return ranges.filter(pl.col("_range").fill_null(0) == index).drop("_range")


@dataclass(frozen=True)
class TurnChunk:
    """The new turns one commit extracts: those landed in ``versions`` = ``(after, upto]``; or,
    when a first build finds every turn in one version (a landing table whose history was
    vacuumed reads as its snapshot, or one bulk commit), the turns of the listed
    ``trajectories`` only, and in the last chunk also the turns without identity, which
    trajectory inference must see together. Either way a chunk's memory is bounded, not the
    table's."""

    versions: tuple[int | None, int | None]
    trajectories: list[str] | None = None
    unidentified: bool = False

    def read(self, increment: Increment) -> pl.DataFrame | None:
        if self.trajectories is None:
            return increment.new_rows(
                "turns", STEP_SOURCE_COLUMNS, with_version=True, versions=self.versions
            )
        turns = increment.scan("turns").select(STEP_SOURCE_COLUMNS)
        identified = keyed(turns, "trajectory_id", pl.Series(self.trajectories, dtype=pl.String))
        unidentified = turns.filter(pl.col("trajectory_id").is_null())
        return (
            pl.concat([identified, unidentified] if self.unidentified else [identified])
            .with_columns(pl.lit(self.versions[1], pl.UInt64).alias("_commit_version"))
            .collect()
        )


def _turn_chunks(increment: Increment) -> tuple[list[TurnChunk], pl.DataFrame]:
    """Chunks of about ``CHUNK_TURNS`` new turns (one when fewer): consecutive version ranges,
    or for a first build whose turns all share one version, groups of whole trajectories; and
    per trajectory with new turns the index of the chunk of its last."""
    light = increment.new_rows("turns", ["trajectory_id"], with_version=True)
    after, upto = increment.after["turns"], increment.upto["turns"]
    if light is None or light.height <= CHUNK_TURNS:
        chunks, last = [TurnChunk((after, upto))], _last_versions(light)
        return chunks, last.with_columns(pl.lit(0, pl.Int64).alias("_range"))
    if after is None and light.get_column("_commit_version").n_unique() == 1:
        return _trajectory_chunks(light, upto)
    rows = pl.col("len")
    ends = (
        light.group_by("_commit_version")
        .len()
        .sort("_commit_version")
        .group_by(((rows.cum_sum() - rows) // CHUNK_TURNS).alias("_chunk"))
        .agg(pl.col("_commit_version").max())
        .sort("_chunk")
        .get_column("_commit_version")
        .to_list()
    )
    bounds = [*ends[:-1], upto]
    chunks = [TurnChunk(v) for v in zip([after, *bounds[:-1]], bounds, strict=True)]
    last = _last_versions(light)
    index = np.searchsorted(np.array(bounds[:-1], dtype=np.int64), last["_commit_version"], "left")
    return chunks, last.with_columns(pl.Series("_range", index, pl.Int64))


def _last_versions(light: pl.DataFrame | None) -> pl.DataFrame:
    """Per trajectory, the version of its last new turn."""
    if light is None:
        return pl.DataFrame(schema={"trajectory_id": pl.String, "_commit_version": pl.Int64})
    return (
        light.drop_nulls("trajectory_id")
        .group_by("trajectory_id")
        .agg(pl.col("_commit_version").max())
    )


def _trajectory_chunks(
    light: pl.DataFrame, upto: int | None
) -> tuple[list[TurnChunk], pl.DataFrame]:
    """Whole trajectories (in id order, so a chunk's keyed read skips most files) in chunks of
    about ``CHUNK_TURNS`` turns; the turns without identity go with the last."""
    turns = pl.col("len")
    per_trajectory = (
        light.drop_nulls("trajectory_id")
        .group_by("trajectory_id")
        .len()
        .sort("trajectory_id")
        .with_columns(((turns.cum_sum() - turns) // CHUNK_TURNS).cast(pl.Int64).alias("_range"))
    )
    members = per_trajectory.group_by("_range", maintain_order=True).agg("trajectory_id")
    chunks = [
        TurnChunk((None, upto), trajectories=ids)
        for ids in members.get_column("trajectory_id").to_list()
    ] or [TurnChunk((None, upto), trajectories=[])]
    chunks[-1] = replace(chunks[-1], unidentified=True)
    return chunks, per_trajectory.select("trajectory_id", "_range")


@dg.asset(
    group_name="steps",
    kinds={"deltalake", "polars"},
    owners=OWNERS,
    deps=[steps, "trajectory_events"],
    automation_condition=on_new_data(),
    pool="claw_trajectories",
    op_tags={"dagster/priority": "-1"},  # off the way to a batch: after the releases in a run
    check_specs=[schema_spec("trajectories")],
)
@retried_when_raced
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
        },
        check_results=[schema_unchanged(written.table, TRAJECTORIES)],
    )
