"""``PromptPrefixes.land``: turns of one write may refer to those spooled ahead of them, and
nothing is remembered of a write that failed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from claw_pipelines.capture.prompt_prefixes import PromptPrefixes
from claw_pipelines.schemas import LandingRow, Reward, Turn, rows_to_arrow
from claw_pipelines.turn_prompts import REFERENCE, _earlier_turns, whole_turns, with_whole_prompts

START = datetime(2026, 12, 1, tzinfo=UTC)


class Runtime:
    """The part of ``CaptureRuntime`` that ``land`` uses: a spool that may fail."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.spooled = fail, []

    async def land_durably(self, rows: list[LandingRow]) -> None:
        if self.fail:
            raise OSError("spool write failed")
        self.spooled += rows


def _steps(trajectory: str, count: int, first: int = 0) -> list[Turn]:
    """White-box steps whose prompts grow by the previous response and 10 new IDs."""
    prompt, steps = list(range(100)), []
    for index in range(first + count):
        response = [1000 + index] * 5
        if index >= first:
            at = START + timedelta(microseconds=index)
            steps.append(
                Turn(
                    turn_id=f"{trajectory}-{index}",
                    trajectory_id=trajectory,
                    model="m",
                    call_type="step",
                    started_at=at,
                    ended_at=at,
                    prompt_token_ids=list(prompt),
                    response_token_ids=response,
                )
            )
        prompt += [*response, *range(10)]
    return steps


def test_a_write_refers_to_the_turns_ahead_of_it_and_reads_back_whole() -> None:
    prefixes, runtime = PromptPrefixes(1 << 20), Runtime()
    steps = _steps("a", 3)
    asyncio.run(prefixes.land(runtime, [steps[0], Reward(turn_id="a-0", value=1.0), *steps[1:]]))
    stored = [row for row in runtime.spooled if isinstance(row, Turn)]
    assert [t.prompt_prefix_turn_id for t in stored] == [None, "a-0", "a-1"]
    assert [len(t.prompt_token_ids) for t in stored] == [100, 10, 10]
    table = pl.from_arrow(rows_to_arrow(Turn, [t.model_dump() for t in stored]))
    read = whole_turns(table).sort("turn_id")
    assert read["prompt_token_ids"].to_list() == [t.prompt_token_ids for t in steps]


def test_nothing_is_remembered_of_a_write_that_failed() -> None:
    prefixes = PromptPrefixes(1 << 20)
    with pytest.raises(OSError):
        asyncio.run(prefixes.land(Runtime(fail=True), _steps("a", 2)))
    runtime = Runtime()
    asyncio.run(prefixes.land(runtime, _steps("a", 1, first=2)))
    assert runtime.spooled[0].prompt_prefix_turn_id is None


def _stored(steps: list[Turn], apart: timedelta) -> pl.DataFrame:
    """``steps`` as the proxy stores them (each referring to the one before), ``apart`` apart."""
    runtime = Runtime()
    asyncio.run(PromptPrefixes(1 << 20).land(runtime, steps))
    table = pl.from_arrow(rows_to_arrow(Turn, [t.model_dump() for t in runtime.spooled]))
    return table.with_columns(started_at=pl.lit(START) + pl.int_range(pl.len()) * apart)


def test_a_reference_hours_back_reads_back_whole() -> None:
    """The earlier turns are read in windows reaching further back until every reference
    resolves: a trajectory whose calls are hours apart still reads back exactly."""
    steps = _steps("a", 3)
    table = _stored(steps, timedelta(hours=3))
    last = with_whole_prompts(table.filter(pl.col("turn_id") == "a-2"), table.lazy())
    assert last["prompt_token_ids"].to_list() == [steps[2].prompt_token_ids]


def test_earlier_turns_are_read_back_only_as_far_as_the_references_go() -> None:
    """An older turn of the same trajectory that no reference reaches (its calls from a day
    before, say) is not read: the read follows the trajectory's recent calls, not the table."""
    old = _stored(_steps("a", 1), timedelta(0)).with_columns(
        turn_id=pl.lit("a-old"), started_at=pl.lit(START - timedelta(days=1))
    )
    recent = _stored(_steps("a", 3), timedelta(seconds=5))
    table = pl.concat([old, recent])
    rows = table.filter(pl.col("turn_id") == "a-2").drop("response_token_ids")
    read = _earlier_turns(rows, table.lazy(), ["turn_id", REFERENCE, "response_token_ids"])
    assert sorted(read["turn_id"]) == ["a-0", "a-1", "a-2"]


def test_rows_read_without_responses_have_their_referenced_turns_read_with_them() -> None:
    """A prompt is rebuilt from the turn it extends and that turn's response: a referenced
    turn among rows read without responses must still be read, however far back it started."""
    table = _stored(_steps("a", 3), timedelta(minutes=2))
    rows = table.drop("response_token_ids")
    read = _earlier_turns(rows, table.lazy(), ["turn_id", REFERENCE, "response_token_ids"])
    assert sorted(read["turn_id"]) == ["a-0", "a-1", "a-2"]
