"""A tick of the ingest sensor waits for a completion, a reward or a label, so one landing
between two ticks of Dagster's 5 s sensor loop reaches the refresh run within a poll instead of
at the next tick."""

from __future__ import annotations

import threading
import time

import dagster as dg
from dagster_harness import Bound, Driver
from dagster_rollouts import land_rollouts

from assets.definitions import build_definitions
from assets.landing import CLOSING_TABLES
from claw_pipelines.schemas import TrajectoryEventRow, rows_to_arrow

LONG_WAIT_S = 60.0


def _complete_later(bound: Bound, trajectories: list[str], after_s: float) -> threading.Thread:
    def complete() -> None:
        time.sleep(after_s)
        events = [
            TrajectoryEventRow(trajectory_id=t, reward=1.0).model_dump() for t in trajectories
        ]
        bound.lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, events))

    thread = threading.Thread(target=complete)
    thread.start()
    return thread


def test_a_waiting_tick_reports_a_completion_as_soon_as_it_lands(
    bound: Bound, instance: dg.DagsterInstance
) -> None:
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=1, complete=False, seed=3)
    waiting = build_definitions(lake=bound.resource, sensor_interval_s=1, sensor_wait_s=LONG_WAIT_S)
    driver = Driver(Bound(bound.lake, bound.resource, waiting), instance)
    completing = _complete_later(bound, list(landed.rewards), after_s=0.5)
    started = time.monotonic()
    ticked = driver.tick("landing_ingest_sensor")
    waited = time.monotonic() - started
    completing.join()
    assert isinstance(ticked, dg.SensorResult)
    assert {e.asset_key.path[0] for e in ticked.asset_events} == {"turns", "trajectory_events"}
    assert len(ticked.run_requests) == 1
    assert 0.5 <= waited < LONG_WAIT_S / 2  # it waited for the completion, and no longer


def test_the_wait_ends_on_a_closing_table_only(bound: Bound) -> None:
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=4)
    seen = {table: bound.lake.version(table) for table in ["turns", *CLOSING_TABLES]}
    seen = {table: version for table, version in seen.items() if version is not None}
    assert not bound.lake.wait_for_commit(CLOSING_TABLES, seen, timeout_s=0.5)
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, complete=False, seed=5)
    assert not bound.lake.wait_for_commit(CLOSING_TABLES, seen, timeout_s=0.5)  # turns only
    _complete_later(bound, ["t-late"], after_s=0.2).join()
    assert bound.lake.wait_for_commit(CLOSING_TABLES, seen, timeout_s=0.0)
    assert bound.lake.wait_for_commit(CLOSING_TABLES, {}, timeout_s=0.0)  # never seen: moved
