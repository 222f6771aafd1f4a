"""The closed-tails log on its own: which attempts' tails count, and expiry in bulk (skipped when
another run got ahead of it)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import polars as pl

from claw_pipelines.incremental import closed_tails
from claw_pipelines.incremental.closed_tails import ClosedTails
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import utc_now


def test_expired_tails_are_deleted_in_bulk_not_at_every_run(tmp_path: Path) -> None:
    """A delete rewrites every file holding an expired tail, so tails just past the window stay
    (readers skip them) until the oldest is a quarter window past it; then every expired one
    goes at once."""
    lake = Lake(str(tmp_path / "lake"))
    tails = ClosedTails.for_attempt(lake, run=1, attempt=1, committed=None)
    start, window = utc_now(), timedelta(hours=1)
    tails.append(
        pl.DataFrame(
            {
                "state": "closed",
                "trajectory_id": [f"t{i}" for i in range(4)],
                "step_index": 0,
                "closed_at": [start + timedelta(minutes=10 * i) for i in range(4)],
            }
        )
    )
    version = lake.version("steps_tails")

    tails.expire(start + window + timedelta(minutes=10), window)
    assert lake.version("steps_tails") == version

    tails.expire(start + window + timedelta(minutes=20), window)
    kept = lake.scan("steps_tails").collect().get_column("trajectory_id").sort().to_list()
    assert kept == ["t2", "t3"]


def _tail(trajectory_id: str) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "state": "closed",
            "trajectory_id": [trajectory_id],
            "step_index": 0,
            "closed_at": utc_now(),
        }
    )


def _read(tails: ClosedTails) -> set[str]:
    return set(tails.scan().collect().get_column("trajectory_id"))


def test_only_the_tails_of_attempts_that_committed_are_read(tmp_path: Path) -> None:
    """Tails are appended before the steps commit: those of an attempt whose commit never
    landed (it died, or lost a race to another attempt of the same run) are never read. The
    last committer's tails count, and the next run records it before its own commit."""
    lake = Lake(str(tmp_path / "lake"))
    ClosedTails.for_attempt(lake, run=1, attempt=11, committed=None).append(_tail("committed"))
    ClosedTails.for_attempt(lake, run=1, attempt=12, committed=None).append(_tail("lost-race"))

    second = ClosedTails.for_attempt(lake, run=2, attempt=21, committed=11)
    assert _read(second) == {"committed"}
    assert second.unrecorded == 11
    second.append(_tail("second"))
    assert second.unrecorded is None
    assert _read(second) == {"committed", "second"}

    died = ClosedTails.for_attempt(lake, run=3, attempt=31, committed=21)
    died.append(_tail("died"))
    after = ClosedTails.for_attempt(lake, run=3, attempt=32, committed=21)
    assert _read(after) == {"committed", "second"}
    after.record_committed()
    assert ClosedTails.for_attempt(lake, run=4, attempt=41, committed=32).unrecorded is None
    assert _read(ClosedTails.for_attempt(lake, run=4, attempt=41, committed=32)) == {
        "committed",
        "second",
    }


def test_an_expiry_another_run_got_ahead_of_is_skipped(tmp_path: Path, monkeypatch) -> None:
    """Expiry runs after the steps commit: when another run's expiry deleted the same rows
    first, this one's delete is rejected and skipped instead of failing the run."""
    lake = Lake(str(tmp_path / "lake"))
    tails = ClosedTails.for_attempt(lake, run=1, attempt=1, committed=None)
    start, window = utc_now(), timedelta(hours=1)
    tails.append(_tail("old").with_columns(closed_at=pl.lit(start)))
    tails.append(_tail("new").with_columns(closed_at=pl.lit(start + 2 * window)))
    cutoff = f"closed_at < '{(start + window).isoformat()}'"
    oldest = closed_tails.column_bound

    def oldest_after_another_expiry(table, column, bound):
        found = oldest(table, column, bound)
        lake.open("steps_tails").delete(cutoff)
        return found

    monkeypatch.setattr(closed_tails, "column_bound", oldest_after_another_expiry)
    tails.expire(start + 2 * window, window)
    assert lake.scan("steps_tails").collect().get_column("trajectory_id").to_list() == ["new"]
