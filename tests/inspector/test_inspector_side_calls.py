"""The trajectory page of real agents' sessions: side trajectories linked both ways, turns placed
where step extraction put them, tail edits named, a failed call shown but not as a step."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest
from agent_shapes import claude_code_session, trailing_context_session
from fastapi.testclient import TestClient

from claw_pipelines.derived_schemas import STEPS, conform
from claw_pipelines.inspector.server import create_app
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn, rows_to_arrow
from claw_pipelines.transforms import extract_steps


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"))


@pytest.fixture
def client(lake: Lake) -> Iterator[TestClient]:
    with TestClient(create_app(lake, background=False)) as client:
        yield client


def _land(lake: Lake, rows: list[dict], trajectories: list[str]) -> None:
    """Land the turns and completion events, and the steps the steps asset would extract."""
    turns = rows_to_arrow(Turn, [Turn(**row).model_dump() for row in rows])
    events = rows_to_arrow(
        TrajectoryEventRow,
        [TrajectoryEventRow(trajectory_id=t).model_dump() for t in trajectories],
    )
    lake.append("turns", turns)
    lake.append("trajectory_events", events)
    extraction = extract_steps(pl.from_arrow(turns), None, pl.from_arrow(events),
                               now=datetime.now(UTC))  # fmt: skip
    lake.append("steps", conform(extraction.steps, STEPS))


def test_side_trajectories_are_linked_both_ways_and_hold_their_turns(client, lake):
    start = datetime.now(UTC) - timedelta(minutes=5)
    session = claude_code_session("cc", "cc-1", start=start, group_id="g")
    main, helper = session["main"], session["helper"]
    failed = {**main[1], "turn_id": "cc-failed", "status": "error", "error": "upstream 503",
              "prompt_token_ids": None, "response_token_ids": None, "response_logprobs": None,
              "started_at": start + timedelta(seconds=25),
              "ended_at": start + timedelta(seconds=26)}  # fmt: skip
    _land(lake, [*session["title"], *main, failed, *helper], ["cc-1"])
    client.app.state.inspector.refresh()

    detail = client.get("/api/trajectories/cc-1").json()
    assert detail["parent_trajectory_id"] is None
    assert detail["side_trajectories"] == ["cc-1/side-cc-helper-0", "cc-1/side-cc-title"]
    steps = [(s["turn_id"], s["step_index"]) for s in detail["steps"]]
    assert steps == [("cc-main-0", 0), ("cc-failed", None), ("cc-main-1", 1)]
    assert [s["prefix_consistent"] for s in detail["steps"]] == [None, None, True]

    helper_id = quote("cc-1/side-cc-helper-0", safe="")
    side = client.get(f"/api/trajectories/{helper_id}").json()
    assert side["parent_trajectory_id"] == "cc-1"
    assert [s["turn_id"] for s in side["steps"]] == ["cc-helper-0", "cc-helper-1"]

    page = client.get("/trajectories/cc-1").text
    assert f'href="/trajectories/{helper_id}"' in page
    assert "Failed call" in page and "not a step" in page
    assert (
        'side call of <a href="/trajectories/cc-1">'
        in client.get(f"/trajectories/{helper_id}").text
    )


def test_a_tail_edit_is_named_on_the_page(client, lake):
    rows = trailing_context_session("oc", start=datetime.now(UTC) - timedelta(minutes=5),
                                    trajectory_id="oc-1")  # fmt: skip
    _land(lake, rows, ["oc-1"])
    client.app.state.inspector.refresh()
    steps = client.get("/api/trajectories/oc-1").json()["steps"]
    assert [s["prefix_break_reason"] for s in steps] == [None, *["tail_edit"] * 3]
    assert all(s["prefix_from_pipeline"] for s in steps[1:])
    assert 'title="tail_edit"' in client.get("/trajectories/oc-1").text
