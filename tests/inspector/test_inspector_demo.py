"""The overview in Chromium while `claw demo` drives real traffic through the capture proxy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from claw_pipelines.processes import Service, free_port, stop_group
from claw_pipelines.stack import start_inspector


@pytest.fixture
def inspector_on_capture(capture_stack, tmp_path: Path) -> Iterator[Service]:
    port = free_port()
    service = start_inspector(
        port, tmp_path, env={"CLAW_LAKE_URI": capture_stack.env["CLAW_LAKE_URI"]}
    )
    try:
        service.wait_ready("/api/health", timeout_s=60)
        yield service
    finally:
        service.stop()


def wait_at_least(page, field: str, value: int, timeout_ms: int = 60_000) -> None:
    """Wait until the overview's live ``field`` shows at least ``value``."""
    page.wait_for_function(
        "([field, value]) => Number(document.querySelector(`[data-field=${field}]`).textContent)"
        " >= value",
        arg=[field, value],
        timeout=timeout_ms,
    )


def test_overview_updates_while_the_demo_runs(
    page, capture_stack, inspector_on_capture, tmp_path, screenshot
):
    page.goto(inspector_on_capture.url + "/")
    turns = page.locator('[data-field="turns_total"]')
    expect(turns).to_have_text(re.compile(r"^\d+$"))
    before_turns = int(turns.inner_text())
    before_completed = int(page.locator('[data-field="trajectories_completed"]').inner_text())
    command = [sys.executable, "-m", "claw_pipelines.cli", "demo"]
    options = ["--proxy-url", capture_stack.proxy_url, "--prompts", "3", "--rollouts", "2"]
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        demo = subprocess.Popen(
            [*command, *options, "--concurrency", "2"],
            env={**os.environ, **capture_stack.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_at_least(page, "turns_total", before_turns + 1)
            assert demo.wait(timeout=240) == 0, log_path.read_text()
        finally:
            stop_group(demo)
    wait_at_least(page, "trajectories_completed", before_completed + 6)
    wait_at_least(page, "turns_total", before_turns + 6)
    screenshot("overview-demo")
