"""Turns stored as what they add to their trajectory's last call (``capture.prompt_prefixes``)
read back whole through every reader: ``with_turn_columns``, the export's chunked reader and
the step extractor's new turns; a reference that cannot be followed exactly fails the read."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from claw_pipelines.capture.prompt_prefixes import PromptPrefixes, spooled_call
from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.incremental.turn_chunks import UNREAD, TurnChunk, turn_chunks
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import Turn, rows_to_arrow
from claw_pipelines.transforms.landed_turns import chunks_with_turn_columns
from claw_pipelines.transforms.steps import extract_steps, stored_steps
from claw_pipelines.turn_prompts import (
    PROMPT_REFERENCE,
    BrokenReference,
    prompt_additions,
    whole_prompts,
    whole_turns,
    with_whole_prompts,
)

START = datetime(2026, 12, 1, tzinfo=UTC)
COLUMNS = ["prompt_token_ids", "request_messages", "request_tools", "api_request"]
TOOLS = json.dumps([{"type": "function", "function": {"name": "shell", "description": "é" * 90}}])


def _session(rng: random.Random, trajectory: str, calls: int, offset: int) -> list[Turn]:
    """A growing conversation with a context edit at call 5 and a side call at call 8."""
    prompt = [rng.randrange(5000) for _ in range(300)]
    messages = [{"role": "system", "content": "Rules. " * 40}, {"role": "user", "content": "go"}]
    turns = []
    for call in range(calls):
        if call == 5:
            prompt, messages = prompt[:120] + prompt[200:], messages[:1] + messages[3:]
        asked, sent = (prompt[:150], messages[:1]) if call == 8 else (prompt, messages)
        response = [rng.randrange(5000) for _ in range(rng.randrange(1, 40))]
        at = START + timedelta(seconds=offset + 3 * call)
        turns.append(
            Turn(
                turn_id=f"{trajectory}-{call:03d}",
                trajectory_id=trajectory,
                model="m",
                started_at=at,
                ended_at=at + timedelta(seconds=1),
                token_source="engine",
                prompt_token_ids=list(asked),
                response_token_ids=response,
                request_messages=json.dumps(sent, ensure_ascii=False),
                request_tools=TOOLS,
                api="responses",
                api_request=json.dumps({"input": sent, "tools": TOOLS, "model": "m"}),
            )
        )
        if call != 8:
            prompt = [*prompt, *response, *(rng.randrange(5000) for _ in range(50))]
            messages = [*messages, {"role": "assistant", "content": f"{call}"}]
            messages.append({"role": "tool", "content": "out " * rng.randrange(20, 40)})
    return turns


@pytest.fixture
def landed(tmp_path: Path) -> tuple[Lake, pl.DataFrame]:
    """Three trajectories of 14 calls, interleaved, stored as one proxy process stores them and
    landed in four commits; with the whole turns."""
    rng = random.Random(7)
    turns = [t for i in range(3) for t in _session(rng, f"traj-{i}", 14, i)]
    turns.sort(key=lambda turn: turn.started_at)
    prefixes = PromptPrefixes(max_bytes=1 << 30)
    stored = []
    for turn in turns:
        call = spooled_call(turn)
        stored.append(prefixes.compact(turn, call).model_dump())
        prefixes.remember(turn, call)
    lake = Lake(str(tmp_path / "lake"))
    for part in np.array_split(np.arange(len(stored)), 4):
        lake.append("turns", rows_to_arrow(Turn, [stored[i] for i in part]))
    whole = pl.from_arrow(rows_to_arrow(Turn, [t.model_dump() for t in turns]))
    return lake, whole


def _rows(whole: pl.DataFrame, picked: list[int]) -> pl.DataFrame:
    return whole[picked].select("turn_id", "started_at")


def test_most_turns_are_stored_as_what_they_add(landed: tuple[Lake, pl.DataFrame]) -> None:
    lake, whole = landed
    raw = lake.scan("turns").collect()
    assert raw["prompt_prefix_turn_id"].null_count() == 3  # each trajectory's first call
    stored = raw["prompt_token_ids"].list.len().sum()
    assert stored < 0.2 * whole["prompt_token_ids"].list.len().sum()
    assert (
        raw["request_tools"].str.len_chars().sum()
        < 0.1 * whole["request_tools"].str.len_chars().sum()
    )
    added = prompt_additions(lake.scan("turns")).collect()
    assert added["added_token_ids"].to_list() == raw["prompt_token_ids"].to_list()


@pytest.mark.parametrize(
    "picked",
    [list(range(42)), list(range(41, -1, -1)), [40], [2, 30, 31]],
)
def test_turn_columns_are_whole(landed: tuple[Lake, pl.DataFrame], picked: list[int]) -> None:
    lake, whole = landed
    completed = with_turn_columns(_rows(whole, picked), lake.scan_landed("turns"), COLUMNS)
    assert completed.select(COLUMNS).equals(whole[picked].select(COLUMNS))


@pytest.mark.parametrize("chunk_rows", [5, 1000])
def test_export_chunks_are_whole(landed: tuple[Lake, pl.DataFrame], chunk_rows: int) -> None:
    lake, whole = landed
    rows = _rows(whole, list(range(42)))
    chunks = chunks_with_turn_columns(
        rows,
        lake.open("turns"),
        COLUMNS,
        chunk_starts=np.arange(0, 42, 3),
        chunk_rows=chunk_rows,
    )
    assert pl.concat(list(chunks)).select(COLUMNS).equals(whole.select(COLUMNS))


def test_the_step_extractors_new_turns_are_as_stored(landed: tuple[Lake, pl.DataFrame]) -> None:
    """The extractor reads the prompts as stored, with their references, which rebuild them
    whole also for a run that reads only the last commit (from the turns landed before it);
    the request texts are not read (the extractor reads the few it needs from ``turns``)."""
    lake, whole = landed
    raw = lake.scan("turns").collect()
    increment = Increment.begin(lake, "steps", "steps", ["turns"])
    last = replace(increment, after={"turns": increment.upto["turns"] - 1})
    stored = ["prompt_token_ids", *PROMPT_REFERENCE]
    for run in (increment, last):
        (chunk,) = turn_chunks(run).chunks
        read = chunk.read(run).sort("turn_id")
        expected = whole.join(read.select("turn_id"), on="turn_id", how="semi").sort("turn_id")
        as_stored = raw.join(read.select("turn_id"), on="turn_id", how="semi").sort("turn_id")
        assert read.select(stored).equals(as_stored.select(stored))
        rebuilt = with_whole_prompts(read, lake.scan("turns"))
        assert rebuilt.get_column("prompt_token_ids").equals(
            expected.get_column("prompt_token_ids")
        )
        for text in ("request_messages", "request_tools"):
            assert read.get_column(text).null_count() == read.height
    assert read.height < whole.height


def test_a_reference_that_cannot_be_followed_exactly_fails(
    landed: tuple[Lake, pl.DataFrame],
) -> None:
    lake, _ = landed
    raw = lake.scan("turns").collect()
    lost = raw.filter(pl.col("turn_id") != "traj-0-003")
    with pytest.raises(BrokenReference, match="not found"):
        whole_turns(lost)
    wrong = raw.with_columns(
        pl.when(pl.col("turn_id") == "traj-1-006")
        .then(pl.col("prompt_len") + 1)
        .otherwise(pl.col("prompt_len"))
        .alias("prompt_len")
    )
    with pytest.raises(BrokenReference, match="length"):
        whole_turns(wrong)


def test_memory_is_bounded_least_recently_used_first() -> None:
    rng = random.Random(3)
    sessions = [_session(rng, f"t{i}", 2, i) for i in range(3)]
    first = sessions[0][0]
    size = spooled_call(first).size
    prefixes = PromptPrefixes(max_bytes=2 * size + size // 2)
    for session in sessions:
        prefixes.remember(session[0], spooled_call(session[0]))
    kept = [prefixes.compact(s[1], spooled_call(s[1])).prompt_prefix_turn_id for s in sessions]
    assert kept == [None, "t1-000", "t2-000"]
    earlier = sessions[2][1].model_copy(update={"started_at": START - timedelta(seconds=1)})
    assert prefixes.compact(earlier, spooled_call(earlier)).prompt_prefix_turn_id is None


def _same_steps(stored: pl.DataFrame, whole: pl.DataFrame, raw: pl.DataFrame) -> None:
    """``stored`` (steps extracted from stored turns) are ``whole`` (the same turns whole)
    but for the prompts, which are as stored (``raw``), and the request texts, not read; and
    the ``steps`` table gets the same rows from both."""
    stored, whole = stored.sort("step_id"), whole.sort("step_id")
    compared = pl.exclude(*UNREAD, "prompt_token_ids", "source_version")
    assert stored.select(compared).equals(whole.select(compared))
    as_stored = stored.select("turn_id").join(raw, on="turn_id", maintain_order="left")
    assert stored.get_column("prompt_token_ids").equals(as_stored.get_column("prompt_token_ids"))
    table = pl.exclude("source_version")
    assert stored_steps(stored, 3).select(table).equals(stored_steps(whole, 3).select(table))


def test_steps_from_stored_turns_equal_those_from_whole_turns(
    landed: tuple[Lake, pl.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extractor on the turns as the steps asset reads them (prompts as stored, request
    texts left in ``turns``) emits the steps it emits from the same turns stored whole: the
    steps that extend the one before by their reference are settled from the columns, the
    others (the context edits at calls 5 and 8, call 9 that refers past the side call 8) are
    checked on prompts rebuilt for them; the edits keep their trajectory by its first
    message, read from ``turns`` (without it, calls 5 to 13 became a side trajectory)."""
    lake, whole = landed
    increment = Increment.begin(lake, "steps", "steps", ["turns"])
    (chunk,) = turn_chunks(increment).chunks
    now = START + timedelta(days=1)
    rebuilt = []

    def rebuilding(rows: pl.DataFrame, wanted: pl.Series, landed: pl.LazyFrame) -> pl.DataFrame:
        rebuilt.append(sorted({turn[-3:] for turn in wanted.to_list()}))
        return whole_prompts(rows, wanted, landed)

    monkeypatch.setattr("claw_pipelines.transforms.steps.whole_prompts", rebuilding)
    stored = extract_steps(chunk.read(increment), None, None, now=now, landed=lake.scan("turns"))
    expected = extract_steps(whole, None, None, now=now)
    _same_steps(stored.steps, expected.steps, lake.scan("turns").collect())
    assert rebuilt[0] == ["004", "005", "007", "008", "009"]  # the prefix check's, per session
    edits = stored.steps.filter(pl.col("prefix_break_reason") == "context_edit")
    assert edits.get_column("turn_id").str.slice(-3).unique().sort().to_list() == ["005", "008"]
    assert edits.height == 6
    assert stored.steps.get_column("parent_trajectory_id").null_count() == 42


def test_open_turns_carried_as_stored_give_the_same_steps(
    landed: tuple[Lake, pl.DataFrame],
) -> None:
    """Runs over each commit while the trajectories stay open carry their turns in the state
    as stored (references, only the new tokens); the run that closes them rebuilds what it
    needs from the state and emits the steps the whole turns give."""
    lake, whole = landed
    raw = lake.scan("turns").collect()
    increment = Increment.begin(lake, "steps", "steps", ["turns"])
    state = None
    for version in range(increment.upto["turns"] + 1):
        chunk = TurnChunk((version - 1 if version else None, version)).read(increment)
        run = extract_steps(chunk, state, None, now=START, landed=lake.scan("turns"))
        assert run.steps.is_empty()
        state = run.open_turns
    assert state.height == whole.height
    carried = state.sort("turn_id").select("prompt_token_ids", *PROMPT_REFERENCE)
    assert carried.equals(raw.sort("turn_id").select(carried.columns))
    assert carried.get_column("prompt_prefix_turn_id").null_count() == 3
    closed = extract_steps(
        None, state, None, now=START + timedelta(days=1), landed=lake.scan("turns")
    )
    expected = extract_steps(whole, None, None, now=START + timedelta(days=1))
    _same_steps(closed.steps, expected.steps, raw)
