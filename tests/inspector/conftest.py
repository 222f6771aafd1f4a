"""Inspector fixtures: a lake of realistic rollouts, a `claw inspect` process over it, Chromium."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lake_rows import Rollouts, land_rollouts
from stack_fixtures import CHROMIUM, CHROMIUM_ARGS

from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port, start_service


@pytest.fixture(scope="session")
def inspector_lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lake, Rollouts]:
    """Three groups of four rollouts (one still open) and a second policy version."""
    lake = Lake(str(tmp_path_factory.mktemp("inspector") / "lake"))
    rollouts = land_rollouts(lake, groups=2, rollouts=4)
    later = land_rollouts(
        lake, groups=1, rollouts=4, policy_version=2, channel="eval", leave_open=1
    )
    rollouts.trajectories += later.trajectories
    rollouts.groups += later.groups
    rollouts.turns += later.turns
    rollouts.open_trajectories += later.open_trajectories
    return lake, rollouts


@pytest.fixture(scope="session")
def inspector_service(
    inspector_lake: tuple[Lake, Rollouts], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    lake, _ = inspector_lake
    port = free_port()
    service = start_service(
        "inspector",
        [sys.executable, "-m", "claw_pipelines.cli", "inspect", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        tmp_path_factory.mktemp("inspector-log") / "inspector.log",
        env={"CLAW_LAKE_URI": lake.root},
    )
    try:
        service.wait_ready("/api/health", timeout_s=60)
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread while it
    is open, and later modules (Dagster, the demo agent) call ``asyncio.run``."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure_chromium.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium, tmp_path: Path) -> Iterator[object]:
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(20_000)
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def screenshot(page, tmp_path: Path):
    """Save a full-page screenshot in the test's tmp dir, to look at when a test fails (the
    docs' screenshots are of demo data: scripts/screenshots.py)."""

    def take(name: str) -> Path:
        path = tmp_path / f"inspector-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
