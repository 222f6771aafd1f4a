"""Policy versions without a proxy: the state the events add up to, workers following one lake,
the hold and its bound, how a call's identity is stamped, and what the lag counts from."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from fastapi.testclient import TestClient

from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.edge.control import build_control_app
from claw_pipelines.identity import TurnIdentity
from claw_pipelines.lake import Lake
from claw_pipelines.policy.gate import (
    HeldTooLong,
    ServedPolicy,
    served_version,
    stamp_served_version,
)
from claw_pipelines.policy.versions import (
    TABLE,
    highest_announced_version,
    lag_reference,
    newest_events,
    read_state,
    state_of,
)
from claw_pipelines.schemas import PolicyEvent, rows_to_arrow, utc_now
from claw_pipelines.settings import ClawSettings

T0 = utc_now()


def _events(*events: tuple[str, int | None, int]) -> pl.LazyFrame:
    """(event, version, seconds after T0) rows, as the table holds them."""
    rows = [
        PolicyEvent(event=kind, version=version, created_at=T0 + timedelta(seconds=s)).model_dump()
        for kind, version, s in events
    ]
    return pl.from_arrow(rows_to_arrow(PolicyEvent, rows)).lazy()


def _policy(lake: Lake, name: str, max_hold_s: float = 60) -> ServedPolicy:
    policy = ServedPolicy(lake, name, max_hold_s)
    policy.start()
    return policy


def test_the_newest_event_decides_whatever_order_rows_are_read_in() -> None:
    assert not state_of(newest_events(_events())).paused
    state = state_of(newest_events(_events(("announce", 1, 0), ("pause", 1, 1))))
    assert (state.version, state.paused) == (1, True)
    resumed = _events(("pause", 1, 3), ("announce", 1, 0), ("announce", 2, 4), ("pause", 1, 1))
    state = state_of(newest_events(resumed))
    assert (state.version, state.paused, state.paused_at) == (2, False, None)
    older_announce_read_last = pl.concat(
        [
            newest_events(_events(("announce", 2, 4), ("pause", 2, 5))).lazy(),
            _events(("announce", 3, 2)),
        ]
    )
    state = state_of(newest_events(older_announce_read_last))
    assert (state.version, state.paused) == (2, True)


def test_workers_on_one_lake_follow_each_other_and_a_late_one_adopts_at_start(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path / "lake"))
    first, second = _policy(lake, "first"), _policy(lake, "second")
    try:
        assert first.record("announce", 5).version == 5
        second.poll()
        assert (second.state.version, second.state.paused) == (5, False)
        second.record("pause")
        first.poll()
        assert (first.state.version, first.state.paused) == (5, True)
        late = _policy(lake, "late")
        assert (late.state.version, late.state.paused) == (5, True)
        late.stop()
        ahead = PolicyEvent(event="pause", version=5, created_at=utc_now() + timedelta(hours=1))
        lake.append(TABLE, rows_to_arrow(PolicyEvent, [ahead.model_dump()]))
        assert first.record("announce", 6) == read_state(lake)
        assert (read_state(lake).version, read_state(lake).paused) == (6, False)
    finally:
        first.stop()
        second.stop()


def test_a_held_call_is_let_in_by_an_announce_from_another_thread_or_refused_past_the_bound(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path / "lake"))
    policy = _policy(lake, "worker", max_hold_s=0.5)
    try:
        policy.record("announce", 1)
        policy.record("pause")
        with pytest.raises(HeldTooLong):
            asyncio.run(policy.admit())
        assert (policy.held, policy.in_flight) == (0, 0)
        policy.max_hold_s = 60

        async def held_then_admitted() -> int | None:
            task = asyncio.ensure_future(policy.admit())
            while policy.held == 0:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(policy.record, "announce", 2)
            return await task

        assert asyncio.run(held_then_admitted()) == 2
        assert (policy.held, policy.in_flight) == (0, 1)
        policy.release()
        assert policy.in_flight == 0
    finally:
        policy.stop()


def test_a_call_lands_under_the_version_it_was_let_in_with() -> None:
    claimed = TurnIdentity(trajectory_id="t", policy_version=3)
    metadata = {"claw": {"ground_truth": "7"}, "tag": "x"}
    assert stamp_served_version(claimed, metadata) == (claimed, metadata)
    token = served_version.set(10)
    try:
        identity, stamped = stamp_served_version(claimed, metadata)
        assert (identity.trajectory_id, identity.policy_version) == ("t", 10)
        assert stamped == {"claw": {"ground_truth": "7", "agent_policy_version": 3}, "tag": "x"}
        assert metadata == {"claw": {"ground_truth": "7"}, "tag": "x"}
        agreeing = TurnIdentity(policy_version=10)
        assert stamp_served_version(agreeing, None) == (agreeing, None)
        assert stamp_served_version(TurnIdentity(), None)[0].policy_version == 10
    finally:
        served_version.reset(token)


def test_the_policy_routes_refuse_what_is_not_a_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ClawSettings(lake_uri=str(tmp_path / "lake"), spool_dir=tmp_path / "spool")
    monkeypatch.setattr(CaptureRuntime, "_instance", CaptureRuntime(settings))
    client = TestClient(build_control_app())
    try:
        for body in ({"version": "3"}, {"version": 1.0}, {"version": -1}, {}, {"v": 1}):
            answer = client.post("/claw/v1/policy", json=body)
            assert answer.status_code == 400, body
        answer = client.post("/claw/v1/policy/pause", json={"drain_timeout_s": -1})
        assert answer.status_code == 400
        assert "drain_timeout_s" in json.dumps(answer.json())
        assert client.get("/claw/v1/policy").json()["version"] is None
        assert not (tmp_path / "lake" / TABLE).exists()
    finally:
        CaptureRuntime.shutdown_current()


def test_a_white_box_step_keeps_its_agents_version_else_takes_the_announced_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ClawSettings(lake_uri=str(tmp_path / "lake"), spool_dir=tmp_path / "spool")
    runtime = CaptureRuntime(settings)
    monkeypatch.setattr(CaptureRuntime, "_instance", runtime)
    client = TestClient(build_control_app())
    step = {"prompt_token_ids": [1, 2], "response_token_ids": [3]}
    try:
        before = client.post("/claw/v1/steps", json=step).json()["turn_id"]
        assert client.post("/claw/v1/policy", json={"version": 4}).status_code == 200
        unclaimed = client.post("/claw/v1/steps", json=step).json()["turn_id"]
        claimed = client.post("/claw/v1/steps", json={**step, "policy_version": 2}).json()
        runtime.flusher.flush()
        turns = runtime.lake.scan("turns").collect()
        versions = dict(zip(turns["turn_id"], turns["policy_version"], strict=True))
        assert versions == {before: None, unclaimed: 4, claimed["turn_id"]: 2}
    finally:
        CaptureRuntime.shutdown_current()


def test_the_lag_counts_from_the_highest_announced_version_else_the_newest_seen(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path / "lake"))
    lake.append("steps", pl.DataFrame({"policy_version": [1, 3, None]}).to_arrow())
    steps = DeltaTable(lake.uri("steps"))
    assert highest_announced_version(lake) is None
    assert lag_reference(None, steps) == 3
    events = _events(("announce", 9, 0), ("announce", 7, 1), ("pause", 12, 2)).collect()
    lake.append(TABLE, events.to_arrow())
    assert highest_announced_version(lake) == 9
    assert lag_reference(highest_announced_version(lake), steps) == 9
