"""A 100-call session in a real browser (Debian's Chromium through Playwright) against
`claw inspect`: each step shows what it added, its whole prompt is one click away."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from lake_rows import SYSTEM, rollout_turns
from playwright.sync_api import expect

from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port, start_service
from claw_pipelines.schemas import Turn, rows_to_arrow

CALLS = 100


@pytest.fixture(scope="module")
def long_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, list[Turn]]]:
    """An inspector over a lake holding one 100-call session, each call's prompt the previous
    prompt + reply + tool output, landed ten calls a commit."""
    folder = tmp_path_factory.mktemp("long-session")
    lake = Lake(str(folder / "lake"))
    turns = rollout_turns(
        "long-session", "long-group", 3, 4, 7, start=datetime(2026, 1, 2, tzinfo=UTC),
        policy_version=1, channel="train", agent="coder", seed=0, steps=CALLS,
    )  # fmt: skip
    for first in range(0, CALLS, 10):
        lake.append("turns", rows_to_arrow(Turn, [t.model_dump() for t in turns[first:][:10]]))
    port = free_port()
    service = start_service(
        "inspector",
        [sys.executable, "-m", "claw_pipelines.cli", "inspect", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        folder / "inspector.log",
        env={"CLAW_LAKE_URI": lake.root},
    )
    try:
        service.wait_ready("/api/health", timeout_s=60)
        yield service, turns
    finally:
        service.stop()


def test_each_step_shows_what_it_added_and_its_full_prompt_on_click(long_session, page):
    service, turns = long_session
    opened = httpx.get(f"{service.url}/api/trajectories/long-session", timeout=30)
    assert opened.status_code == 200
    page.goto(f"{service.url}/trajectories/long-session")
    steps = page.locator("article.step")
    expect(steps).to_have_count(CALLS)
    step = steps.nth(50)
    state = step.locator(".state")
    expect(state.locator(".earlier")).to_contain_text("101 earlier messages unchanged")
    expect(state.locator(".msg")).to_have_count(1)
    expect(state.locator(".msg.role-tool")).to_contain_text("7")
    expect(state).not_to_contain_text(SYSTEM)
    added = len(turns[50].prompt_token_ids) - len(turns[49].prompt_token_ids)
    added -= len(turns[49].response_token_ids)
    expect(state.locator(".added-summary")).to_contain_text(f"{added} new")
    state.locator(".added-tokens summary").click()
    expect(state.locator(".added-tokens .tokens")).to_contain_text("tool")
    state.locator("a.full-prompt").click()
    expect(page).to_have_url(f"{service.url}/steps/{turns[50].turn_id}/prompt")
    prompt = page.locator(".full-prompt")
    expect(prompt.locator(".msg")).to_have_count(len(json.loads(turns[50].request_messages)))
    expect(prompt.locator(".msg.role-system")).to_contain_text(SYSTEM)
    prompt.locator("button.prompt-ids").click()
    expect(prompt.locator(".prompt-tokens .tok")).to_have_count(len(turns[50].prompt_token_ids))
