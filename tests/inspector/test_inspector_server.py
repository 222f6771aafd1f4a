"""The inspector's HTTP API and pages in-process (TestClient; the test drives the refreshes)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pyarrow as pa
import pytest
from agent_shapes import claude_code_session, trailing_context_session
from fastapi.testclient import TestClient
from lake_rows import land_rollouts, rollout_turns

from claw_pipelines.derived_schemas import STEPS, conform
from claw_pipelines.inspector import render
from claw_pipelines.inspector.server import create_app
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn, rows_to_arrow
from claw_pipelines.transforms import extract_steps
from claw_pipelines.transforms.steps import stored_steps


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"))


@pytest.fixture
def client(lake: Lake) -> Iterator[TestClient]:
    with TestClient(create_app(lake, background=False)) as client:
        yield client


def refresh(client: TestClient) -> None:
    client.app.state.inspector.refresh()


def test_empty_lake_says_which_tables_are_missing_and_why(client):
    overview = client.get("/api/overview").json()
    assert overview["turns_total"] == 0
    assert any(
        m.startswith("no turns yet: point an agent at the capture proxy")
        for m in overview["missing"]
    )
    assert "No turns yet" in client.get("/trajectories").text
    assert client.get("/api/trajectories").json()["total"] == 0
    assert client.get("/api/trajectories/nope").status_code == 404
    assert "no trajectory" in client.get("/trajectories/nope").text


def test_new_rows_reach_the_list_incrementally(client, lake):
    first = land_rollouts(lake, groups=1, rollouts=2, leave_open=1)
    refresh(client)
    listed = client.get("/api/trajectories").json()
    assert listed["total"] == 2
    assert {r["status"] for r in listed["rows"]} == {"open", "completed"}
    land_rollouts(lake, groups=1, rollouts=2)
    refresh(client)
    assert client.get("/api/trajectories").json()["total"] == 4
    page = client.get("/api/trajectories?size=1&page=2&status=completed").json()
    assert (page["matched"], len(page["rows"]), page["page"]) == (3, 1, 2)
    assert first.open_trajectories[0] in {
        r["trajectory_id"] for r in client.get("/api/trajectories?status=open").json()["rows"]
    }
    assert client.get("/api/trajectories?reward_min=abc").status_code == 422


def test_labels_for_a_step_and_a_filter_result_land_in_the_labels_table(client, lake):
    rollouts = land_rollouts(lake, groups=2, rollouts=2)
    refresh(client)
    step = client.post(
        "/api/labels",
        json={
            "target_kind": "step",
            "target_ids": [rollouts.turns[0]],
            "quality_label": "bad",
            "tags": ["loop", "tool"],
            "author": "ann",
        },
    )
    assert step.json() == {"written": 1, "target_kind": "step", "labels_version": 1}
    whole = client.post(
        "/api/labels",
        json={
            "target_kind": "filter",
            "filter": {"group_id": rollouts.groups[1]},
            "trainable": False,
            "author": "ann",
            "note": "group is broken",
        },
    )
    assert whole.json()["written"] == 2
    labels = lake.scan("labels").collect()
    labelled = labels.filter(pl.col("target_kind") == "trajectory")["target_id"]
    assert sorted(labelled) == sorted(rollouts.trajectories[2:])
    assert labels.filter(pl.col("target_kind") == "step")["tags"].to_list() == [["loop", "tool"]]
    untrainable = client.get("/api/trajectories?label=untrainable").json()
    assert untrainable["matched"] == 2
    unknown = client.post(
        "/api/labels",
        json={
            "target_kind": "trajectory",
            "target_ids": ["nope"],
            "trainable": False,
            "author": "a",
        },
    )
    assert unknown.status_code == 404
    empty = client.post(
        "/api/labels", json={"target_kind": "step", "target_ids": ["x"], "author": "a"}
    )
    assert empty.status_code == 422
    for blank in ["", "  "]:
        label = {"target_kind": "step", "target_ids": rollouts.turns[:1], "quality_label": blank}
        assert client.post("/api/labels", json={**label, "author": "a"}).status_code == 422


def test_a_label_on_a_turn_without_identity_follows_its_step(client, lake):
    (turn, _) = rollout_turns(
        "x", "g", 1, 2, 3, start=datetime.now(UTC), policy_version=1, channel="c", agent="a",
        seed=0,
    )  # fmt: skip
    anonymous = turn.model_copy(update={"trajectory_id": None, "group_id": None})
    lake.append("turns", rows_to_arrow(Turn, [anonymous.model_dump()]))
    refresh(client)
    provisional = f"turn:{turn.turn_id}"
    written = client.post(
        "/api/labels",
        json={"target_kind": "trajectory", "target_ids": [provisional], "trainable": False,
              "author": "ann"},
    )  # fmt: skip
    assert written.json()["written"] == 1
    label = lake.scan("labels").collect().row(0, named=True)
    assert (label["target_kind"], label["target_id"], label["trainable"]) == (
        "step",
        turn.turn_id,
        False,
    )


def test_user_content_is_escaped_on_every_page(client, lake):
    rollouts = land_rollouts(lake, groups=1, rollouts=1)
    refresh(client)
    evil = "<script>alert('x')</script>"
    saved = client.post(
        "/api/labels",
        json={
            "target_kind": "trajectory",
            "target_ids": rollouts.trajectories,
            "note": evil,
            "quality_label": evil,
            "tags": [evil],
            "author": evil,
        },
    )
    assert saved.status_code == 200, saved.text
    assert saved.json()["written"] == 1
    (label,) = lake.scan("labels").collect().iter_rows(named=True)
    assert (label["note"], label["quality_label"], label["tags"]) == (evil, evil, [evil])
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    pages = [
        f"/trajectories/{rollouts.trajectories[0]}",
        f"/groups/{rollouts.groups[0]}",
        "/trajectories",
    ]
    for path in pages:
        html = client.get(path).text
        assert "<script>alert" not in html, path
        assert escaped in html, f"the label is not shown on {path}"


def test_label_notes_are_scrubbed_and_secret_shaped_labels_refused(client, lake):
    rollouts = land_rollouts(lake, groups=1, rollouts=1)
    refresh(client)
    key = "api_key_sk-" + "0f" * 20
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fw"
    note = f"leaked {key} here, bearer {jwt} and ASIAIOSFODNN7EXAMPLE; bearer tokens expire"
    label = {"target_kind": "trajectory", "target_ids": rollouts.trajectories, "author": "ann"}
    saved = client.post("/api/labels", json={**label, "note": note})
    assert saved.status_code == 200, saved.text
    (row,) = lake.scan("labels").collect().iter_rows(named=True)
    assert row["note"] == (
        "leaked api_key_[REDACTED] here, [REDACTED] and [REDACTED]; bearer tokens expire"
    )
    for field, value in [("quality_label", key), ("tags", [key]), ("author", key)]:
        refused = client.post("/api/labels", json={**label, "trainable": False, field: value})
        assert refused.status_code == 422, (field, refused.text)
        assert "looks like a secret" in refused.text
    assert lake.scan("labels").collect().height == 1


def test_a_step_shows_the_tools_its_request_declared(client, lake):
    """The policy saw the tools rendered into its prompt, so the state shows them."""
    calculator = {"type": "function", "function": {"name": "calculator", "parameters": {}}}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    (turn,) = rollout_turns(
        "tooled",
        "g",
        1,
        1,
        3,
        start=start,
        policy_version=1,
        channel="c",
        agent="a",
        seed=0,
        steps=1,
    )
    turn = turn.model_copy(update={"request_tools": json.dumps([calculator])})
    lake.append("turns", rows_to_arrow(Turn, [turn.model_dump()]))
    refresh(client)
    (step,) = client.get("/api/trajectories/tooled").json()["steps"]
    assert step["tools"] == [calculator]
    assert "tools declared (1): calculator" in client.get("/trajectories/tooled").text


def test_a_context_edit_is_reported_as_a_prefix_break(client, lake):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    turns = rollout_turns(
        "edited", "g", 1, 2, 3, start=start, policy_version=1, channel="c", agent="a", seed=0
    )
    second = turns[1].model_copy(update={"prompt_token_ids": [1, *turns[1].prompt_token_ids]})
    lake.append("turns", rows_to_arrow(Turn, [turns[0].model_dump(), second.model_dump()]))
    refresh(client)
    steps = client.get("/api/trajectories/edited").json()["steps"]
    assert [s["prefix_consistent"] for s in steps] == [None, False]
    assert steps[1]["prefix_break_reason"].startswith("context edit")
    assert steps[1]["prefix_from_pipeline"] is False
    tokens = client.get(f"/api/steps/{turns[0].turn_id}/prompt_tokens").json()
    assert tokens["ids"] == turns[0].prompt_token_ids
    assert "".join(tokens["tokens"]["texts"]).startswith("<|im_start|>system")


def test_trajectories_open_after_compaction_and_vacuum(client, lake):
    rollouts = land_rollouts(lake, groups=1, rollouts=2)
    land_rollouts(lake, groups=1, rollouts=2)
    refresh(client)
    table = lake.open("turns")
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    refresh(client)
    assert client.get("/api/trajectories").json()["total"] == 4
    steps = client.get(f"/api/trajectories/{rollouts.trajectories[0]}").json()["steps"]
    assert [s["step_index"] for s in steps] == [0, 1]
    assert steps[1]["response"]["content"].startswith("The answer is")


def test_an_inspector_started_after_a_vacuum_reads_every_turn(lake):
    """Its first read of a landing table cannot come from the change data feed any more (the
    files the early versions added are gone): the snapshot serves it."""
    rollouts = land_rollouts(lake, groups=1, rollouts=2)
    land_rollouts(lake, groups=1, rollouts=2)
    table = lake.open("turns")
    table.optimize.compact()
    assert table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with TestClient(create_app(lake, background=False)) as client:
        assert client.get("/api/trajectories").json()["total"] == 4
        steps = client.get(f"/api/trajectories/{rollouts.trajectories[0]}").json()["steps"]
        assert [s["step_index"] for s in steps] == [0, 1]
        assert steps[1]["response"]["content"].startswith("The answer is")


def test_labels_need_a_json_body_and_a_loopback_server_checks_the_host(lake):
    app = create_app(lake, background=False, allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(app, base_url="http://127.0.0.1") as client:
        body = '{"target_kind": "filter", "filter": {}, "trainable": false, "author": "x"}'
        form_post = client.post("/api/labels", content=body, headers={"content-type": "text/plain"})
        assert form_post.status_code == 422
        assert lake.open("labels") is None
        assert client.get("/api/health").status_code == 200
        rebound = client.get("/api/health", headers={"host": "evil.example:8120"})
        assert rebound.status_code == 400


def test_a_trajectory_note_shows_on_its_page_in_the_list_and_on_its_group(client, lake):
    rollouts = land_rollouts(lake, groups=1, rollouts=2)
    refresh(client)
    trajectory_id = rollouts.trajectories[0]
    client.post(
        "/api/labels",
        json={
            "target_kind": "trajectory",
            "target_ids": [trajectory_id],
            "note": "answers before calling the tool",
            "author": "ann",
        },
    )
    group_page = f"/groups/{rollouts.groups[0]}"
    for path in [f"/trajectories/{trajectory_id}", "/trajectories", group_page]:
        assert "note: answers before calling the tool" in client.get(path).text, path


def test_ids_with_a_slash_open_from_the_list_and_through_the_api(client, lake):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    turns = rollout_turns(
        "team/a/run-1",
        "grp/1",
        1,
        2,
        3,
        start=start,
        policy_version=1,
        channel="c",
        agent="a",
        seed=0,
    )
    lake.append("turns", rows_to_arrow(Turn, [t.model_dump() for t in turns]))
    refresh(client)
    listing = client.get("/trajectories").text
    assert 'href="/trajectories/team%2Fa%2Frun-1"' in listing
    assert 'href="/groups/grp%2F1"' in listing
    assert (
        "Trajectory <code>team/a/run-1</code>" in client.get("/trajectories/team%2Fa%2Frun-1").text
    )
    assert "Group <code>grp/1</code>" in client.get("/groups/grp%2F1").text
    detail = client.get("/api/trajectories/team%2Fa%2Frun-1").json()
    assert len(detail["steps"]) == 2
    summary = client.get("/api/trajectories/team%2Fa%2Frun-1/summary").json()
    assert summary["trajectory_id"] == "team/a/run-1"
    assert client.get("/api/groups/grp%2F1").json()["group_id"] == "grp/1"


def test_a_step_shows_what_it_added_and_a_break_shows_what_changed(client, lake):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    intact = rollout_turns(
        "intact", "g", 1, 2, 3, start=start, policy_version=1, channel="c", agent="a", seed=0
    )
    turns = rollout_turns(
        "edited", "g", 1, 2, 3, start=start, policy_version=1, channel="c", agent="a", seed=0
    )
    messages = json.loads(turns[1].request_messages)
    messages[1]["content"] = "What is 1 + 2? Answer like a pirate."
    edited = turns[1].model_copy(
        update={
            "request_messages": json.dumps(messages),
            "prompt_token_ids": [1, *turns[1].prompt_token_ids],
        }
    )
    rows = [*intact, turns[0], edited]
    lake.append("turns", rows_to_arrow(Turn, [t.model_dump() for t in rows]))
    refresh(client)
    first, second = client.get("/api/trajectories/intact").json()["steps"]
    assert (first["earlier_messages"], second["earlier_messages"]) == (0, 3)
    assert second["message_count"] == len(json.loads(intact[1].request_messages))
    assert [m["role"] for m in second["new_messages"]] == ["tool"]
    previous = len(intact[0].prompt_token_ids) + len(intact[0].response_token_ids)
    assert second["shared_prefix_tokens"] == previous
    assert second["added_token_ids"] == intact[1].prompt_token_ids[previous:]
    assert second["new_messages"][0]["content"] in second["added_text"]
    first, second = client.get("/api/trajectories/edited").json()["steps"]
    assert (second["earlier_messages"], second["shared_prefix_tokens"]) == (1, 0)
    assert second["new_messages"][0]["content"] == "What is 1 + 2? Answer like a pirate."
    assert second["added_token_ids"] == edited.prompt_token_ids
    intact_second = client.get("/trajectories/intact").text.split('<article class="step"')[2]
    assert messages[0]["content"] not in intact_second  # only in the full prompt
    assert 'href="/steps/' + intact[1].turn_id + '/prompt"' in intact_second
    assert "Answer like a pirate." in client.get("/trajectories/edited").text
    prompt = client.get(f"/api/steps/{edited.turn_id}/prompt").json()
    assert prompt["messages"] == [render.message(m) for m in messages]
    assert prompt["token_ids"] == edited.prompt_token_ids
    full = client.get(f"/steps/{edited.turn_id}/prompt").text
    assert "Answer like a pirate." in full and messages[0]["content"] in full
    assert client.get("/api/steps/nope/prompt").status_code == 404


def test_the_first_step_is_called_first_step_even_when_the_pipeline_says_consistent(client, lake):
    rollouts = land_rollouts(lake, groups=1, rollouts=1)
    trajectory_id = rollouts.trajectories[0]
    steps = pa.table(
        {
            "turn_id": rollouts.turns,
            "trajectory_id": [trajectory_id] * 2,
            "step_index": [0, 1],
            "prefix_consistent": [True, True],
        }
    )
    lake.append("steps", steps)
    refresh(client)
    first, second = client.get(f"/trajectories/{trajectory_id}").text.split(
        '<article class="step"'
    )[1:]
    assert "prefix consistent" not in first
    assert 'prefix: <span class="muted">first step</span>' in first
    assert "extends the previous prompt + response exactly" in second


def test_an_unknown_url_gets_the_error_page_and_an_unknown_api_url_gets_json(client):
    unknown = client.get("/anything-unknown")
    assert unknown.status_code == 404
    assert "<h1>Not available</h1>" in unknown.text
    assert client.get("/api/anything-unknown").json() == {"detail": "Not Found"}


def test_a_very_long_message_is_clamped_with_its_full_text_kept(client, lake):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    (turn,) = rollout_turns(
        "long", "g", 1, 2, 3, start=start, policy_version=1, channel="c", agent="a", seed=0, steps=1
    )
    messages = json.loads(turn.request_messages)
    messages[1]["content"] = "word " * 20_000
    long = turn.model_copy(update={"request_messages": json.dumps(messages)})
    lake.append("turns", rows_to_arrow(Turn, [long.model_dump()]))
    refresh(client)
    page = client.get("/trajectories/long").text
    assert f'<div class="content clamped">{"word " * 20_000}</div>' in page
    assert '<button type="button" class="show-all">show all</button>' in page


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
    lake.append("steps", conform(stored_steps(extraction.steps, 4), STEPS))


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


def test_an_inspector_that_fell_behind_a_vacuum_reads_every_turn_again(lake, client):
    """An index left idle past the log retention cannot read on from the change data feed (the
    versions after its own are gone): it reads every table again from its snapshot instead of
    staying stale."""
    land_rollouts(lake, groups=1, rollouts=2)
    refresh(client)
    land_rollouts(lake, groups=1, rollouts=2)
    table = lake.open("turns")
    table.optimize.compact()
    assert table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    refresh(client)
    inspector = client.app.state.inspector
    assert inspector.refresh_error is None
    assert client.get("/api/trajectories").json()["total"] == 4


def test_the_background_refresh_idles_until_a_request_comes(lake, monkeypatch):
    """Nobody looking, nothing refreshed; the first request after brings the index up to
    date before it is answered."""
    from claw_pipelines.inspector import server

    monkeypatch.setattr(server, "REFRESH_S", 0.05)
    monkeypatch.setattr(server, "IDLE_AFTER_S", 0.2)
    app = create_app(lake, background=True)
    with TestClient(app) as client:
        inspector = app.state.inspector
        refreshes = []
        index_refresh = inspector.index.refresh

        def counted():
            refreshes.append(time.monotonic())
            return index_refresh()

        monkeypatch.setattr(inspector.index, "refresh", counted)
        time.sleep(0.5)  # idle by now
        refreshes.clear()
        land_rollouts(lake, groups=1, rollouts=2)
        time.sleep(0.3)
        assert refreshes == []
        assert client.get("/api/trajectories").json()["total"] == 2
        assert refreshes
