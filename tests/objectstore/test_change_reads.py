"""A change read of an S3 lake's table takes the appended-files path (polars on the files the
commits added) with the options the table was opened with, as a local one does."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from s3_lake import S3

from claw_pipelines.lake import changes as lake_changes
from claw_pipelines.lake.changes import appended_rows, changes


def _append(lake, first: int, rows: int) -> None:
    ids = list(range(first, first + rows))
    tokens = pa.array([[i, i + 1] for i in ids], pa.list_(pa.int32()))
    lake.append("t", pa.table({"id": pa.array(ids, pa.int64()), "tokens": tokens}))


def test_a_change_read_on_s3_reads_the_appended_files(s3: S3, monkeypatch: pytest.MonkeyPatch):
    lake = s3.new_lake()
    for first in (0, 10, 20):
        _append(lake, first, 10)
    table = lake.open("t")
    feed = pl.DataFrame(
        table.load_cdf(
            starting_version=2,
            ending_version=table.version(),
            columns=["id", "tokens", "_change_type", "_commit_version"],
        ).read_all()
    ).sort("id")

    fast = appended_rows(table, 2, table.version(), ["id", "tokens"])
    assert fast is not None, "an S3 table opened by the lake is read from its appended files"
    assert fast.sort("id").equals(feed)

    served = []

    def recorded(*args):
        rows = appended_rows(*args)
        served.append(rows)
        return rows

    monkeypatch.setattr(lake_changes, "appended_rows", recorded)
    read = changes(table, 1, table.version(), ["id"], with_version=True)
    assert len(served) == 1 and served[0] is not None, "the feed served the read"
    assert read is not None and read.sort("id").equals(feed.select("id", "_commit_version"))
