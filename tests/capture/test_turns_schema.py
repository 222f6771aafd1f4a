"""A ``turns`` table written before a column existed takes rows that have it."""

from __future__ import annotations

from pathlib import Path

from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import changes
from claw_pipelines.schemas import Turn, rows_to_arrow, utc_now
from claw_pipelines.spool.flusher import SpoolFlusher
from claw_pipelines.spool.writer import SpoolWriter

NEW_COLUMNS = ("api", "api_request", "api_response")


def _turn(turn_id: str, **values: object) -> Turn:
    now = utc_now()
    return Turn(turn_id=turn_id, model="m", started_at=now, ended_at=now, **values)


def _old_table(lake: Lake) -> None:
    """The table as a proxy without the agent-API columns wrote it."""
    rows = rows_to_arrow(Turn, [_turn("old").model_dump()])
    old = rows.drop_columns(list(NEW_COLUMNS))
    lake.append("turns", old)


def test_the_spool_lands_new_columns_in_a_table_written_without_them(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    _old_table(lake)
    writer = SpoolWriter(tmp_path / "spool")
    flusher = SpoolFlusher(writer, lake)
    writer.append(_turn("new", api="responses", api_request='{"input": "hi"}'))
    assert flusher.flush() == 1
    rows = {row["turn_id"]: row for row in lake.scan("turns").collect().iter_rows(named=True)}
    assert (rows["new"]["api"], rows["new"]["api_request"]) == ("responses", '{"input": "hi"}')
    assert rows["old"]["api"] is None
    assert set(NEW_COLUMNS) <= set(lake.open("turns").schema().to_arrow().names)
    inserted = changes(lake.open("turns"), None, lake.version("turns"))
    assert sorted(inserted["turn_id"]) == ["new", "old"]


def test_a_writer_whose_handle_predates_the_new_columns_still_commits(tmp_path: Path) -> None:
    """Two proxies: one adds the columns while the other holds a handle opened before."""
    lake = Lake(str(tmp_path / "lake"))
    _old_table(lake)
    stale = lake.writer("turns")
    old_schema = rows_to_arrow(Turn, [_turn("x").model_dump()]).drop_columns(list(NEW_COLUMNS))
    stale.append(old_schema.slice(0, 0).cast(old_schema.schema))
    lake.writer("turns").append(rows_to_arrow(Turn, [_turn("first", api="messages").model_dump()]))
    stale.append(rows_to_arrow(Turn, [_turn("second", api="chat").model_dump()]))
    turns = lake.scan("turns").collect()
    assert sorted(turns["turn_id"]) == ["first", "old", "second"]
    assert dict(zip(turns["turn_id"], turns["api"], strict=True))["second"] == "chat"
    assert "api" in lake.open("turns").schema().to_arrow().names
