"""Two steps runs at once, as an instance without the ``claw_steps`` pool limit allows: the run
whose commit is rejected is retried, and must leave nothing behind that its retry (or any later
run) takes for emitted or open."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
import polars as pl
import pytest
from dagster_harness import Driver, retry_reasons
from dagster_rollouts import Rollouts, land_rollouts

from claw_pipelines.incremental.increment import Increment
from claw_pipelines.schemas import TrajectoryEventRow, rows_to_arrow

WAIT_S = 60.0


class HeldCommits:
    """Stands in for ``Increment.commit``: a steps commit made on a thread named in ``held``
    first says it is ready, then waits to be released, so a test can order racing runs."""

    def __init__(self, commit: Callable, held: set[str], final_only: bool = True) -> None:
        self.commit, self.final_only = commit, final_only
        self.ready = {name: threading.Event() for name in held}
        self.release = {name: threading.Event() for name in held}

    def __call__(self, increment: Increment, *args, **kwargs):
        name = threading.current_thread().name
        final = kwargs.get("watermark", True)
        if increment.asset == "steps" and name in self.ready and (final or not self.final_only):
            self.ready[name].set()
            assert self.release[name].wait(WAIT_S), f"{name} was never released"
        return self.commit(increment, *args, **kwargs)

    def wait_ready(self, name: str) -> None:
        assert self.ready[name].wait(WAIT_S), f"{name} never reached its commit"


@dataclass
class Outcome:
    succeeded: bool
    retried_because: list[str]
    """The message of each error the step was retried on."""


def _run_steps(bound, name: str, results: dict[str, Outcome]) -> threading.Thread:
    """Run ``steps`` on a thread called ``name`` and put how it went in ``results[name]``."""

    def run() -> None:
        with dg.instance_for_test() as instance:
            result = Driver(bound, instance).attempt(["steps"])
            results[name] = Outcome(result.success, retry_reasons(result))

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def _complete(lake, landed: Rollouts) -> None:
    events = [
        TrajectoryEventRow(trajectory_id=t, group_id=g, reward=landed.rewards[t]).model_dump()
        for g, members in landed.groups.items()
        for t in members
    ]
    lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, events))


def _assert_every_turn_emitted_once(lake, landed: Rollouts) -> None:
    steps = lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique()
    assert set(steps.get_column("turn_id")) == set(landed.turns)
    indices = steps.group_by("trajectory_id").agg(pl.col("step_index").sort())
    assert all(i == list(range(len(i))) for i in indices.get_column("step_index").to_list())


@pytest.mark.parametrize("earlier_run", [False, True], ids=["first-run", "later-run"])
def test_a_run_that_read_more_and_lost_the_commit_race_loses_no_turn(
    bound, instance, monkeypatch, earlier_run: bool
) -> None:
    """``first`` reads the turns of open trajectories and is held at its commit; their
    completion events land; ``second`` (same snapshot of ``steps``) closes them, stores its state
    and tails, and is held too. ``first`` commits, ``second`` is rejected. The next run must not
    take ``second``'s state or tails as the truth: those trajectories were never emitted."""
    landed = Rollouts()
    if earlier_run:
        landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=1)
        Driver(bound, instance).materialize(["steps"])
    open_ones = land_rollouts(bound.lake, groups=1, group_size=2, steps=2, complete=False)
    landed.turns.update(open_ones.turns)
    held = HeldCommits(Increment.commit, {"first", "second"})
    monkeypatch.setattr(Increment, "commit", lambda self, *a, **k: held(self, *a, **k))
    results: dict[str, Outcome] = {}
    first = _run_steps(bound, "first", results)
    held.wait_ready("first")
    _complete(bound.lake, open_ones)
    second = _run_steps(bound, "second", results)
    held.wait_ready("second")
    held.release["first"].set()
    first.join(WAIT_S)
    held.release["second"].set()
    second.join(WAIT_S)
    assert results["first"] == Outcome(True, [])
    assert results["second"].succeeded
    (why,) = results["second"].retried_because
    assert "another run of steps committed to steps while this one ran" in why
    _assert_every_turn_emitted_once(bound.lake, landed)

    Driver(bound, instance).materialize(["steps"])
    _assert_every_turn_emitted_once(bound.lake, landed)


@pytest.mark.parametrize("winner", ["first", "second"])
def test_backlog_runs_racing_chunk_by_chunk_write_each_step_once(
    bound, instance, monkeypatch, winner: str
) -> None:
    """A backlog is extracted in chunks, each committed before the last moves the watermark;
    two runs over the same backlog must not both land their chunks."""
    from claw_pipelines.incremental import turn_chunks

    monkeypatch.setattr(turn_chunks, "CHUNK_TURNS", 4)
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2)
    for seed in (1, 2):
        more = land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=seed)
        landed.turns.update(more.turns)
    loser = "second" if winner == "first" else "first"
    held = HeldCommits(Increment.commit, {loser}, final_only=False)
    monkeypatch.setattr(Increment, "commit", lambda self, *a, **k: held(self, *a, **k))
    results: dict[str, Outcome] = {}
    losing = _run_steps(bound, loser, results)
    held.wait_ready(loser)
    winning = _run_steps(bound, winner, results)
    winning.join(WAIT_S)
    held.release[loser].set()
    losing.join(WAIT_S)
    assert results[winner] == Outcome(True, [])
    assert results[loser].succeeded
    (why,) = results[loser].retried_because
    assert "another run of steps committed to steps" in why
    _assert_every_turn_emitted_once(bound.lake, landed)

    Driver(bound, instance).materialize(["steps"])
    _assert_every_turn_emitted_once(bound.lake, landed)


def test_a_run_still_reading_the_state_a_winner_replaced_is_retried(
    bound, instance, monkeypatch
) -> None:
    """``loser`` has opened the state of open trajectories and is about to read it when
    ``winner`` commits, writes the next state and vacuums: the version ``loser`` reads must
    survive that vacuum, so ``loser`` fails only at its commit, and is retried."""
    from claw_pipelines.incremental import steps_refresh

    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2, complete=False)
    Driver(bound, instance).materialize(["steps"])
    _complete(bound.lake, landed)
    reading, release = threading.Event(), threading.Event()
    extracted_alone = steps_refresh.extract_steps

    def held_before_reading(*args, **kwargs):
        if threading.current_thread().name == "loser" and not release.is_set():
            reading.set()
            assert release.wait(WAIT_S)
        return extracted_alone(*args, **kwargs)

    monkeypatch.setattr(steps_refresh, "extract_steps", held_before_reading)
    results: dict[str, Outcome] = {}
    loser = _run_steps(bound, "loser", results)
    assert reading.wait(WAIT_S)
    Driver(bound, instance).materialize(["steps"])
    release.set()
    loser.join(WAIT_S)
    assert results["loser"].succeeded
    (why,) = results["loser"].retried_because
    assert "another run of steps committed to steps" in why
    _assert_every_turn_emitted_once(bound.lake, landed)
