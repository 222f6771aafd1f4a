"""The commit rate of a writer: closing rows coalesce into one commit per table per window, and
a completion never lands before the turns spooled ahead of it."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import polars as pl

from claw_pipelines.lake import Lake
from claw_pipelines.schemas import Reward, TrajectoryEventRow, Turn, utc_now
from claw_pipelines.spool.commit_rules import COMMIT_ORDER
from claw_pipelines.spool.flusher import Schedule, SpoolFlusher
from claw_pipelines.spool.writer import SpoolWriter, Waiting

NOTHING = Waiting(None, None, sealed_rows=0)


def _flush_ticks(schedule: Schedule, nudges: list[float], until: float) -> list[float]:
    """The ticks (every 10 ms) at which ``schedule`` flushes, nudged at ``nudges``."""
    flushed, nudged = [], {round(at, 2) for at in nudges}
    for tick in [round(0.01 * i, 2) for i in range(1, int(until * 100) + 1)]:
        if schedule.due(tick, woken=tick in nudged, waiting=NOTHING)[0]:
            flushed.append(tick)
    return flushed


def test_nudges_flush_at_most_once_per_window_and_at_once_after_a_quiet_spell() -> None:
    """A completion every 20 ms for 3 s flushes once per 0.5 s window, not 150 times; the first
    nudge after a quiet spell flushes at once, and one that came inside a window is kept for
    the window's end, not dropped."""
    busy = [round(0.02 * i, 2) for i in range(1, 151)]
    flushed = _flush_ticks(Schedule(1.0, 60.0, 0.0, window_s=0.5), busy, until=4)
    assert flushed[0] == 0.02
    assert all(b - a >= 0.5 - 1e-9 for a, b in itertools.pairwise(flushed))
    assert 6 <= len(flushed) <= 7
    assert flushed[-1] >= 3.0  # the last completions were flushed after the window, not lost
    assert _flush_ticks(Schedule(1.0, 60.0, 0.0, window_s=0.5), [0.3, 2.0], until=3) == [0.3, 2.0]


def test_the_schedule_sleeps_until_the_window_ends_when_a_flush_waits() -> None:
    schedule = Schedule(1.0, 60.0, 0.0, window_s=0.5)
    assert schedule.due(0.1, woken=True, waiting=NOTHING)[0]
    assert schedule.pause(0.1, tick=0.1) == 0.1  # nothing asked for
    assert not schedule.due(0.2, woken=True, waiting=NOTHING)[0]
    assert abs(schedule.pause(0.35, tick=1.0) - 0.25) < 1e-9
    assert schedule.due(0.6, woken=False, waiting=NOTHING)[0]
    assert not schedule.due(0.7, woken=False, waiting=NOTHING, overfull=False)[0]
    assert schedule.due(0.75, woken=False, waiting=NOTHING, overfull=True)[0]


def _trajectory(index: int) -> list[Turn | TrajectoryEventRow | Reward]:
    trajectory, now = f"traj-{index:05d}", utc_now()
    turns = [
        Turn(
            turn_id=f"turn-{index:05d}-{step}",
            trajectory_id=trajectory,
            model="m",
            started_at=now,
            ended_at=now,
            prompt_token_ids=[1, 2, 3],
        )
        for step in range(3)
    ]
    return [
        *turns,
        Reward(trajectory_id=trajectory, value=1.0),
        TrajectoryEventRow(trajectory_id=trajectory),
    ]


def test_a_writer_under_many_closing_rows_commits_each_table_at_the_bounded_rate(
    tmp_path: Path,
) -> None:
    """Eight agents close a trajectory (3 turns, a reward, a completion) every few ms for 3 s:
    each table gets about one commit per 0.5 s window, every row lands once, and each
    completion's commit is no older than the commit of its trajectory's turns."""
    lake = Lake(str(tmp_path / "lake"))
    writer = SpoolWriter(tmp_path / "spool")
    flusher = SpoolFlusher(writer, lake, interval_s=1.0, window_s=0.5, fsync_interval_s=None)
    flusher.start()
    counter = iter(range(1_000_000))
    lock = threading.Lock()
    stop_at = time.monotonic() + 3.0

    def agent() -> None:
        while time.monotonic() < stop_at:
            with lock:
                rows = _trajectory(next(counter))
            for row in rows:
                writer.append(row)
            flusher.nudge(urgent=True)
            time.sleep(0.005)

    agents = [threading.Thread(target=agent) for _ in range(8)]
    for thread in agents:
        thread.start()
    for thread in agents:
        thread.join()
    began = time.monotonic()
    flusher.stop()
    elapsed = 3.0 + (time.monotonic() - began)
    trajectories = next(counter)
    assert trajectories > 200

    for table, rows in (("turns", 3), ("rewards", 1), ("trajectory_events", 1)):
        delta_table = lake.open(table)
        commits = [c for c in delta_table.history() if c["operation"] == "WRITE"]
        assert len(commits) <= elapsed / 0.5 + 2, (table, len(commits))
        landed = lake.scan(table).collect()
        assert landed.height == rows * trajectories, table
        key = {"turns": "turn_id", "rewards": "reward_id", "trajectory_events": "event_id"}
        assert landed.get_column(key[table]).n_unique() == landed.height, table

    def versions(table: str) -> pl.DataFrame:
        return pl.DataFrame(lake.open(table).load_cdf(0).read_all()).select(
            "trajectory_id", pl.col("_commit_version").alias(table)
        )

    turns = versions("turns").group_by("trajectory_id").agg(pl.col("turns").max())
    events = versions("trajectory_events").join(turns, on="trajectory_id")
    assert events.height == trajectories
    # the tables are committed in COMMIT_ORDER: a completion's flush committed its turns first
    assert COMMIT_ORDER.index("turns") < COMMIT_ORDER.index("trajectory_events")
    turn_times = _commit_times(lake, "turns")
    event_times = _commit_times(lake, "trajectory_events")
    late = events.filter(
        pl.col("turns").replace_strict(turn_times, return_dtype=pl.Int64)
        > pl.col("trajectory_events").replace_strict(event_times, return_dtype=pl.Int64)
    )
    assert late.is_empty(), late


def _commit_times(lake: Lake, table: str) -> dict[int, int]:
    """Each version of ``table`` -> its commit's timestamp (ms)."""
    return {c["version"]: c["timestamp"] for c in lake.open(table).history()}
