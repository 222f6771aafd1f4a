"""Rows completed with their turns' columns: the landed scan's file order, and every way
``with_turn_columns`` can match rows to turns giving what a plain left join gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.lake import Lake
from claw_pipelines.lake.files import scan_in_order
from claw_pipelines.transforms.landed_turns import _Read, chunks_with_turn_columns

START = datetime(2026, 12, 1, tzinfo=UTC)


def _turns(first: int, count: int) -> pa.Table:
    index = range(first, first + count)
    return pa.table(
        {
            "turn_id": [f"turn-{i:04d}" for i in index],
            "started_at": pa.array(
                [START + timedelta(seconds=i) for i in index], pa.timestamp("us", "UTC")
            ),
            "prompt_token_ids": [[i, i + 1, i + 2] for i in index],
            "request_messages": [f'[{{"role": "user", "content": "{i}"}}]' for i in index],
        }
    )


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """Turns 0-59 landed in three commits, so delta-rs lists the newest file first."""
    lake = Lake(str(tmp_path / "lake"))
    for first in (0, 20, 40):
        lake.append("turns", _turns(first, 20))
    return lake


def test_the_landed_scan_reads_files_in_landing_order(lake: Lake) -> None:
    ids = lake.scan_landed("turns").select("turn_id").collect().get_column("turn_id")
    assert ids.to_list() == [f"turn-{i:04d}" for i in range(60)]
    delta_order = lake.scan("turns").select("turn_id").collect().get_column("turn_id")
    assert sorted(delta_order.to_list()) == ids.to_list()


def test_a_partitioned_table_is_left_to_the_delta_scan(tmp_path: Path) -> None:
    table = str(tmp_path / "parted")
    rows = _turns(0, 4).append_column("day", pa.array(["a", "a", "b", "b"]))
    write_deltalake(table, rows, partition_by=["day"])
    scanned = scan_in_order(Lake(str(tmp_path)).open("parted"), "started_at").collect()
    assert sorted(scanned.get_column("day").to_list()) == ["a", "a", "b", "b"]


def _expected(rows: pl.DataFrame, turns: pl.DataFrame) -> pl.DataFrame:
    first = turns.unique("turn_id", keep="first", maintain_order=True)
    return rows.join(first.drop("started_at"), on="turn_id", how="left", maintain_order="left")


@pytest.mark.parametrize(
    "picked",
    [
        list(range(60)),  # every turn, in landing order: taken as read
        list(range(59, -1, -1)),  # every turn, reversed: gathered
        [5, 70, 6, 7, 8, 9, *range(10, 40)],  # most of the window, one missing
        [3, 41],  # a few of a wide window: matched by the streaming engine
        [58],
    ],
)
def test_turn_columns_equal_a_left_join(lake: Lake, picked: list[int]) -> None:
    turns = lake.scan_landed("turns").collect()
    rows = pl.DataFrame(
        {
            "turn_id": [f"turn-{i:04d}" for i in picked],
            "started_at": [START + timedelta(seconds=i) for i in picked],
            "reward": [float(i) for i in picked],
        },
        schema_overrides={"started_at": pl.Datetime("us", "UTC")},
    )
    completed = with_turn_columns(rows, lake.scan_landed("turns"), ["prompt_token_ids",
                                                                   "request_messages"])  # fmt: skip
    assert completed.equals(_expected(rows, turns))


def test_a_redelivered_turn_counts_once(lake: Lake) -> None:
    lake.append("turns", _turns(10, 1))
    rows = pl.DataFrame({"turn_id": ["turn-0010", "turn-0011"]})
    completed = with_turn_columns(rows, lake.scan_landed("turns"), ["prompt_token_ids"])
    assert completed.get_column("prompt_token_ids").to_list() == [[10, 11, 12], [11, 12, 13]]


@pytest.mark.parametrize("chunk_rows", [1, 7, 25, 1000])
@pytest.mark.parametrize(
    "picked",
    [
        list(range(60)),
        [*range(30, 60), *range(30)],  # the later half first: held back until read
        [5, 70, 6, *range(7, 50)],  # one turn missing
        [3, 41, 58],
    ],
)
def test_chunks_hold_what_the_whole_read_holds(
    lake: Lake, picked: list[int], chunk_rows: int
) -> None:
    """In any order and chunk size, the chunks put together equal ``with_turn_columns`` of
    all rows, and each begins where a chunk may (here: every fifth row)."""
    lake.append("turns", _turns(10, 1))  # a re-delivered turn: its first read counts
    rows = pl.DataFrame(
        {
            "turn_id": [f"turn-{i:04d}" for i in picked],
            "started_at": [START + timedelta(seconds=i) for i in picked],
        },
        schema_overrides={"started_at": pl.Datetime("us", "UTC")},
    )
    columns = ["prompt_token_ids", "request_messages"]
    starts = np.arange(0, rows.height, 5)
    chunks = list(
        chunks_with_turn_columns(
            rows, lake.open("turns"), columns, chunk_starts=starts, chunk_rows=chunk_rows
        )
    )
    assert pl.concat(chunks).equals(with_turn_columns(rows, lake.scan_landed("turns"), columns))
    begins = np.cumsum([0] + [c.height for c in chunks[:-1]])
    assert set(begins) <= set(starts)
    assert all(c.height >= min(chunk_rows, rows.height) for c in chunks[:-1])


def test_a_read_holds_only_the_turns_its_rows_want(lake: Lake) -> None:
    """A batch of a few turns over a long window keeps those turns, not the window's."""
    window = lake.scan_landed("turns").select("turn_id", "prompt_token_ids").collect()
    wanted = pl.DataFrame({"turn_id": ["turn-0041", "turn-0003", "turn-0058"]})
    read = _Read(wanted.height)
    read.add(window, wanted.with_row_index("_row"))
    assert [frame.height for frame in read.frames] == [3]
    taken = read.take(0, 3).get_column("prompt_token_ids").to_list()
    assert taken == [[41, 42, 43], [3, 4, 5], [58, 59, 60]]
