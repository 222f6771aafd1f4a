"""One run of the ``steps`` table: the turns landed since its watermark, extracted as steps.

A run reads only new turns and trajectory events plus its own small state (``steps_open``:
turns of trajectories still open; ``steps_tails``: the closed tails it touches, appended to,
never rewritten), so work grows with new data. A backlog is extracted in chunks
(``turn_chunks``), as if the run had happened after each (state carried over; a trajectory's
events go with the chunk holding its last new turn), one commit each; only the last moves the
watermark, and each replaces its step ids, so re-running after a crash part-way cannot
duplicate steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl
from deltalake import DeltaTable

from claw_pipelines.derived_schemas import OPEN_STATE, STEPS, conform
from claw_pipelines.incremental.closed_tails import ClosedTails, open_turns_of
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.incremental.turn_chunks import turn_chunks
from claw_pipelines.schemas import utc_now
from claw_pipelines.transforms.steps import extract_steps, stored_steps

STEP_SAMPLE = ["trajectory_id", "step_index", "is_last", "token_source", "response_text"]
"""Columns of a run's new steps kept for a sample (with ``step_id``)."""


def misaligned_logprobs() -> pl.Expr:
    """A step whose logprobs list is present but not one per response token (null: none)."""
    return pl.col("response_logprobs").list.len() != pl.col("response_token_ids").list.len()


@dataclass
class StepsRefresh:
    """What a steps run extracted and wrote."""

    table: DeltaTable | None
    """The steps table after the run's last commit."""
    written: list[pl.DataFrame] = field(default_factory=list)
    """Per commit, the new steps' ids, ``STEP_SAMPLE`` columns, ``prefix_consistent`` and a
    ``logprobs_misaligned`` flag: what a check or a sample needs once the token lists are gone."""
    open_turns: int = 0
    """Turns of trajectories still open after the run."""
    state_version: int | None = None
    """The version of ``steps_open`` this run wrote (None: it wrote none)."""

    @property
    def new_steps(self) -> pl.DataFrame | None:
        """``written`` as one frame (None: the run committed nothing)."""
        return pl.concat(self.written) if self.written else None


def refresh_steps(
    increment: Increment, *, idle_timeout_s: float, reopen_window_s: float, repetition_ngram: int
) -> StepsRefresh:
    """Extract and commit the run's new turns, then expire the tails past ``reopen_window_s``
    and drop state files no version needs, once the run wrote its state.

    A trajectory closes after ``idle_timeout_s`` without a turn; a turn landing within
    ``reopen_window_s`` of its close extends it. ``repetition_ngram`` is the quality signal's
    n-gram, computed while the token lists are in memory (``stored_steps``)."""
    tails = ClosedTails.for_attempt(
        increment.lake, increment.run, increment.attempt, increment.committed_attempt
    )
    now = utc_now()
    run = _extract(increment, tails, now, idle_timeout_s, reopen_window_s, repetition_ngram)
    if run.state_version is not None:
        tails.expire(now, timedelta(seconds=reopen_window_s))
        increment.drop_old_states("steps_open")
    return run


def _extract(
    increment: Increment,
    tails: ClosedTails,
    now: datetime,
    idle_timeout_s: float,
    reopen_window_s: float,
    repetition_ngram: int,
) -> StepsRefresh:
    """Extract and commit the run's new turns, one chunk (``turn_chunks``) per commit."""
    open_turns = open_turns_of(increment.state_as_of("steps_open"), tails)
    events = increment.new_rows("trajectory_events")
    chunks = turn_chunks(increment)
    run = StepsRefresh(increment.snapshot)
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
            idle_timeout_s=idle_timeout_s,
            reopen_window_s=reopen_window_s,
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
        stored = conform(stored_steps(new_steps, repetition_ngram), STEPS)
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
