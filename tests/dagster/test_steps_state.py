"""The steps run's carried-over state in-process: crashes between its state and output
commits, closed tails, and backlogs extracted in chunks."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from dagster_harness import CHAIN, Driver, KilledOnCall
from dagster_rollouts import Rollouts, land_rollouts, late_turn
from deltalake import CommitProperties, Transaction, write_deltalake

from claw_pipelines.derived_schemas import (
    OPEN_STATE,
    conform,
    fit,
)
from claw_pipelines.incremental.closed_tails import ClosedTails
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import compact
from claw_pipelines.schemas import TrajectoryEventRow, Turn, empty, new_id, rows_to_arrow, utc_now


@pytest.mark.parametrize("crashes", [1, 12])
def test_steps_recover_from_a_crash_between_state_and_output(
    driver: Driver, bound, crashes: int
) -> None:
    """The state commit lands first; if the run dies before the steps commit (again and again,
    say until an operator steps in), the next run must take the state matching the steps'
    watermark, so nothing is lost or emitted twice."""
    land_rollouts(bound.lake, groups=1, group_size=2, steps=2, complete=False)
    driver.refresh()  # turns of open trajectories: all in the state, no steps yet
    land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=3)
    for _ in range(crashes):
        crashed = Increment.begin(bound.lake, "steps", "steps", ["turns", "trajectory_events"])
        crashed.replace_state("steps_open", empty(OPEN_STATE), OPEN_STATE)
    metadata = driver.refresh()
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique()
    assert metadata["steps"]["open_turns"] == 4  # the first group never completed
    assert steps.height == 4


def test_an_idle_sweep_dying_before_its_commit_loses_no_step(
    driver: Driver, bound, monkeypatch
) -> None:
    """A sweep with no new data that closes idle trajectories writes its state, then their
    steps; if it dies in between, its state must not be taken as the current one (it names
    the same input versions), or those trajectories would count as emitted and never be."""
    from claw_pipelines.incremental import steps_refresh

    land_rollouts(bound.lake, groups=1, group_size=2, steps=2, complete=False)
    assert driver.refresh()["steps"]["open_turns"] == 4
    an_hour_later = utc_now() + timedelta(hours=1)
    monkeypatch.setattr(steps_refresh, "utc_now", lambda: an_hour_later)
    commit = KilledOnCall(Increment.commit, n=1)
    monkeypatch.setattr(Increment, "commit", lambda self, *a, **k: commit(self, *a, **k))
    assert not driver.attempt(["steps"]).success
    assert bound.lake.scan("steps").collect().is_empty()

    driver.materialize(["steps"])
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 4
    assert set(steps.get_column("close_reason")) == {"timeout"}


def _last_turn(landed: Rollouts, trajectory_id: str) -> dict:
    turns = [t for t in landed.turns.values() if t["trajectory_id"] == trajectory_id]
    return max(turns, key=lambda t: t["started_at"])


def _steps_of(lake: Lake, trajectory_id: str) -> pl.DataFrame:
    return (
        lake.scan("steps")
        .filter(pl.col("trajectory_id") == trajectory_id)
        .sort("step_index")
        .collect()
    )


def test_late_turns_extend_a_closed_trajectory_from_its_tail(driver: Driver, bound) -> None:
    """A closed trajectory keeps a tail in ``steps_tails``: a turn landing after completion is
    emitted as a reopened step numbered after the emitted ones and prefix-checked against the
    last, a re-delivered turn is dropped, and a run appends only the tails it changed."""
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2)
    driver.refresh()
    assert bound.lake.scan("steps_tails").collect().height == 2
    reopened, other = next(iter(landed.groups.values()))
    last = _last_turn(landed, reopened)
    first = min(landed.turns.values(), key=lambda t: t["started_at"])
    bound.lake.append("turns", rows_to_arrow(Turn, [late_turn(last), first]))

    assert driver.refresh()["steps"]["rows_written"] == 1
    steps = _steps_of(bound.lake, reopened)
    assert steps.get_column("step_index").to_list() == [0, 1, 2]
    assert steps.get_column("reopened").to_list() == [False, False, True]
    assert steps.get_column("prefix_consistent").all()
    tails = bound.lake.scan("steps_tails").collect()
    assert tails.filter(pl.col("trajectory_id") == reopened).get_column(
        "step_index"
    ).sort().to_list() == [1, 2]
    assert tails.filter(pl.col("trajectory_id") == other).height == 1
    assert bound.lake.scan("steps_open").collect().is_empty()


def test_closed_tails_kept_in_steps_open_by_older_lakes_move_to_the_log(
    driver: Driver, bound
) -> None:
    """Lakes written before ``steps_tails`` kept closed tails in ``steps_open``; the next run
    moves them to the log and a late turn still continues its trajectory."""
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2)
    driver.refresh()
    tails = bound.lake.scan("steps_tails").collect()
    output = bound.lake.open("steps")
    watermark = [
        Transaction(app_id=app, version=output.transaction_version(app))
        for app in ("claw/steps/turns", "claw/steps/trajectory_events", "claw/steps/run")
    ]
    write_deltalake(
        bound.lake.open("steps_open"),
        conform(fit(tails, OPEN_STATE), OPEN_STATE),
        mode="overwrite",
        commit_properties=CommitProperties(app_transactions=watermark),
    )
    shutil.rmtree(bound.lake.uri("steps_tails"))
    trajectory_id = next(iter(landed.groups.values()))[0]
    bound.lake.append("turns", rows_to_arrow(Turn, [late_turn(_last_turn(landed, trajectory_id))]))

    driver.refresh()
    steps = _steps_of(bound.lake, trajectory_id)
    assert steps.get_column("step_index").to_list() == [0, 1, 2]
    assert steps.get_column("reopened").to_list() == [False, False, True]
    assert bound.lake.scan("steps_tails").collect().height == 3
    assert bound.lake.scan("steps_open").collect().is_empty()


def test_tails_past_the_reopen_window_leave_the_log(driver: Driver, bound, monkeypatch) -> None:
    """A run that commits deletes the tails closed before the reopen window, compacts a log of
    many small files and drops the state files no version needs any more; a turn landing after
    the window starts a new emission."""
    import claw_pipelines.incremental.closed_tails
    from claw_pipelines.incremental import steps_refresh

    monkeypatch.setattr(claw_pipelines.incremental.closed_tails, "COMPACT_AFTER_FILES", 2)
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    driver.refresh()
    for seed in (1, 2):
        land_rollouts(bound.lake, groups=1, group_size=1, steps=1, seed=seed)
        driver.refresh()
    assert len(bound.lake.open("steps_tails").file_uris()) == 1  # compacted
    for state in ("steps_tails", "steps_open"):  # files of older versions are dropped
        on_disk = list(Path(bound.lake.uri(state)).glob("*.parquet"))
        assert len(on_disk) == len(bound.lake.open(state).file_uris()), state
    two_days_later = utc_now() + timedelta(days=2)
    monkeypatch.setattr(steps_refresh, "utc_now", lambda: two_days_later)
    trajectory_id = next(iter(landed.groups.values()))[0]
    last = _last_turn(landed, trajectory_id)
    bound.lake.append("turns", rows_to_arrow(Turn, [late_turn(last, timedelta(days=2))]))
    events = [TrajectoryEventRow(trajectory_id=trajectory_id, reward=1.0).model_dump()]
    bound.lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, events))

    driver.refresh()
    tails = bound.lake.scan("steps_tails").collect()
    assert tails.get_column("trajectory_id").to_list() == [trajectory_id]
    assert _steps_of(bound.lake, trajectory_id).get_column("step_index").to_list() == [0, 0]


def test_chunked_recompute_survives_a_crash_part_way(driver: Driver, bound, monkeypatch) -> None:
    """Big backlogs are recomputed a few trajectories per commit; a run dying after some chunks
    committed (watermark not moved yet) is redone by the next run without duplicates."""
    import claw_pipelines.incremental.increment
    from claw_pipelines.incremental import quality_refresh

    monkeypatch.setattr(claw_pipelines.incremental.increment, "CHUNK_TRAJECTORIES", 3)
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1)
    monkeypatch.setattr(
        quality_refresh, "score_steps", KilledOnCall(quality_refresh.score_steps, n=3)
    )
    driver.tick("landing_ingest_sensor")
    assert not driver.attempt(CHAIN).success
    partial = bound.lake.scan("scored_steps").collect()
    assert partial.height == 6  # two chunks of 3 one-step trajectories committed
    assert (
        bound.lake.open("scored_steps").transaction_version("claw/scored_steps/rewarded_steps")
        is None
    )

    metadata = driver.refresh()
    assert metadata["scored_steps"]["rows_written"] == 16
    for key in CHAIN:
        table = bound.lake.scan(key).collect()
        assert table.height == 16, key  # one-step trajectories: as many rows as steps
    scored = bound.lake.scan("scored_steps").collect()
    assert scored.get_column("step_id").n_unique() == 16


def test_a_turns_backlog_is_extracted_in_chunks_that_survive_a_crash(
    driver: Driver, bound, monkeypatch
) -> None:
    """A backlog of turn versions is extracted a chunk per commit; a run dying after a chunk
    committed is redone by the next run without duplicates, with the steps of one pass."""
    from claw_pipelines.incremental import steps_refresh, turn_chunks

    monkeypatch.setattr(turn_chunks, "CHUNK_TURNS", 4)
    for seed in range(3):  # three turns versions of 4 turns (2 two-step trajectories) each
        land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=seed)
    extract = KilledOnCall(steps_refresh.extract_steps, n=2)
    monkeypatch.setattr(steps_refresh, "extract_steps", extract)
    driver.tick("landing_ingest_sensor")
    assert not driver.attempt(["steps"]).success
    assert bound.lake.scan("steps").collect().height == 4  # the first chunk committed
    assert bound.lake.open("steps").transaction_version("claw/steps/turns") is None

    metadata = driver.refresh()
    assert extract.calls == 5  # the crashed run's two calls, then three chunks
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 12
    assert metadata["steps"]["rows_written"] == 12
    assert steps.get_column("prefix_consistent").all()
    assert not steps.get_column("reopened").any()
    assert set(steps.get_column("step_index")) == {0, 1}
    committed = bound.lake.open("steps").transaction_version("claw/steps/attempt")
    tails = ClosedTails.for_attempt(bound.lake, run=0, attempt=0, committed=committed)
    counted = tails.scan().collect()  # the crashed run's tails stay in the log, uncounted
    assert counted.height == counted.get_column("trajectory_id").n_unique() == 6


def test_a_first_build_from_a_vacuumed_landing_table_is_chunked_by_trajectory(
    driver: Driver, bound, monkeypatch
) -> None:
    """A landing table whose merged files were vacuumed reads as one version (its snapshot):
    steps rebuilt from it are still extracted a chunk of whole trajectories at a time, with
    the steps of one pass."""
    from claw_pipelines.incremental import steps_refresh, turn_chunks

    monkeypatch.setattr(turn_chunks, "CHUNK_TURNS", 4)
    for seed in range(3):  # 12 turns: 6 two-step trajectories
        landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=seed)
    anonymous = [  # and a two-turn trajectory that came without identity, still open
        {**turn, "turn_id": new_id(), "trajectory_id": None, "group_id": None}
        for turn in list(landed.turns.values())[:2]
    ]
    bound.lake.append("turns", rows_to_arrow(Turn, anonymous))
    for table in ("turns", "trajectory_events"):
        compact(bound.lake.open(table), max_files=1)
        bound.lake.vacuum(table, 0, enforce_retention_duration=False)
    chunks, extract = [], steps_refresh.extract_steps

    def recording(turns: pl.DataFrame, *args, **kwargs):
        chunks.append(turns)
        return extract(turns, *args, **kwargs)

    monkeypatch.setattr(steps_refresh, "extract_steps", recording)
    driver.tick("landing_ingest_sensor")
    assert driver.attempt(["steps"]).success
    assert [chunk.height for chunk in chunks] == [4, 4, 6]
    for chunk in chunks:  # whole trajectories per chunk, the anonymous turns in the last
        assert set(chunk.group_by("trajectory_id").len().get_column("len")) == {2}
    inferred = bound.lake.scan("steps_open").filter(pl.col("state") == "open").collect()
    assert inferred.height == 2 and inferred.get_column("trajectory_id").n_unique() == 1
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 12
    assert steps.get_column("prefix_consistent").all()
    assert steps.group_by("trajectory_id").agg(pl.col("step_index").sort()).get_column(
        "step_index").to_list() == [[0, 1]] * 6  # fmt: skip
    assert steps.filter(pl.col("is_last")).height == 6
