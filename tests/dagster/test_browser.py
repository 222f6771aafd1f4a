"""The Dagster UI in a real browser (Debian chromium): the lineage reads as the data lifecycle, a
batch is materialized with the UI's Materialize button, and its metadata renders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright
from stack_fixtures import CHROMIUM, CHROMIUM_ARGS

LIFECYCLE = [
    "turns",
    "steps",
    "trajectories",
    "rewarded_steps",
    "scored_steps",
    "curated_steps",
    "labels",
    "batch_grpo",
    "export_grpo",
]


@pytest.fixture
def page(dagster_dev, tmp_path: Path) -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_page(viewport={"width": 1600, "height": 1000})
        context.set_default_timeout(60_000)
        yield context
        browser.close()


def skip_community_modal(page: Page) -> None:
    skip = page.get_by_role("button", name="Skip")
    if skip.count():
        skip.click()


def shoot(page: Page, tmp_path: Path, name: str) -> None:
    """Save into the test's tmp dir, to look at when a test fails (the docs' screenshots are of
    demo data: scripts/screenshots.py)."""
    page.screenshot(path=str(tmp_path / f"dagster-{name}.png"))


def test_lineage_materialize_from_the_ui_and_metadata(
    dagster_dev, first_batch, page: Page, tmp_path: Path
) -> None:
    page.goto(f"{dagster_dev.url}/asset-groups")
    skip_community_modal(page)
    expect(page.get_by_text("Global asset lineage")).to_be_visible()
    expect(page.get_by_text("curation", exact=True).last).to_be_visible()  # graph drawn
    page.keyboard.press("Alt+e")  # expand every group so each asset shows
    for key in LIFECYCLE:
        expect(page.get_by_text(key, exact=True).first).to_be_visible()
    page.wait_for_timeout(3000)  # let the nodes' materialization status colour in
    shoot(page, tmp_path, "lineage")

    before = len(dagster_dev.batch_materializations())
    page.goto(f"{dagster_dev.url}/assets/batch_grpo")
    skip_community_modal(page)
    page.get_by_role("button", name="Materialize…").click()
    page.get_by_text("Select a partition or create one").click()
    page.get_by_placeholder("Filter partitions").fill(first_batch["partition"])
    page.locator("label", has_text=first_batch["partition"]).first.click()
    page.keyboard.press("Escape")
    shoot(page, tmp_path, "launch-batch")
    page.get_by_role("button", name="Launch 1 run").click()
    dagster_dev.wait_for(
        lambda: len(dagster_dev.batch_materializations()) > before,
        "the batch materialization launched from the UI",
    )

    page.goto(f"{dagster_dev.url}/assets/batch_grpo?view=events")
    # the Events tab loads each materialization's run, here a refresh run with the whole chain
    # in it as well as the UI launch: seen taking over 5 s on two loaded cores
    expect(page.get_by_text("pinned_versions")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("reward_distribution")).to_be_visible()
    expect(page.get_by_text("curated_steps").first).to_be_visible()
    shoot(page, tmp_path, "batch-metadata")
    page.get_by_text("[Show Markdown]").first.click()
    expect(page.get_by_text("step 1 of rollout").first).to_be_visible()
    page.wait_for_timeout(500)  # let the dialog's fade-in finish before the screenshot
    shoot(page, tmp_path, "batch-sample")
