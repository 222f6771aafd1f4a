"""The closed-tails log on its own: expiry in bulk."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import polars as pl

from assets.closed_tails import ClosedTails
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import utc_now


def test_expired_tails_are_deleted_in_bulk_not_at_every_run(tmp_path: Path) -> None:
    """A delete rewrites every file holding an expired tail, so tails just past the window stay
    (readers skip them) until the oldest is a quarter window past it; then every expired one
    goes at once."""
    lake = Lake(str(tmp_path / "lake"))
    tails = ClosedTails.for_run(lake, 1)
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
