"""Rows appended in a version range, read from the files the commits added, equal the change
data feed's inserts; ranges holding more than appends are left to the feed."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import appended_rows, changes


def _feed(table, start: int, end: int) -> pl.DataFrame:
    reader = table.load_cdf(
        starting_version=start,
        ending_version=end,
        columns=["id", "tokens", "_change_type", "_commit_version"],
        predicate="_change_type = 'insert'",
    )
    return pl.DataFrame(reader.read_all()).sort("id")


def _append(lake: Lake, first: int, rows: int) -> None:
    ids = list(range(first, first + rows))
    tokens = pa.array([[i, i + 1, i + 2] for i in ids], pa.list_(pa.int32()))
    lake.append("t", pa.table({"id": pa.array(ids, pa.int64()), "tokens": tokens}))


def test_appended_rows_equal_the_feed_and_leave_other_commits_to_it(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    for first in (0, 10, 20):
        _append(lake, first, 10)
    table = lake.open("t")
    fast = appended_rows(table, 1, table.version(), ["id", "tokens"])
    assert fast is not None and fast.sort("id").equals(_feed(table, 1, table.version()))
    assert fast.group_by("_commit_version").len().sort("_commit_version")["len"].to_list() == [
        10, 10, 10]  # fmt: skip

    table.optimize.compact()  # its file re-adds old rows without a data change
    _append(lake, 30, 5)
    table = lake.open("t")
    fast = appended_rows(table, 2, table.version(), ["id", "tokens"])
    assert fast is not None and fast["id"].sort().to_list() == list(range(10, 30)) + list(
        range(30, 35)
    )
    assert fast.sort("id").equals(_feed(table, 2, table.version()))

    table.delete("id < 5")
    _append(lake, 40, 5)
    table = lake.open("t")
    assert appended_rows(table, 5, table.version(), ["id", "tokens"]) is None
    read = changes(table, 4, table.version(), ["id", "tokens"])
    assert read is not None
    assert read["id"].sort().to_list() == list(range(30, 35)) + list(range(40, 45))
