"""Take the docs' screenshots again, of real demo data.

Run it against a stack that ``claw demo`` has fed (a batch exported), e.g.::

    make up                                   # one shell
    .venv/bin/claw demo --online --train-steps 2   # another
    .venv/bin/python scripts/screenshots.py

It drives Debian's /usr/bin/chromium with Playwright (no browser download) and writes
docs/screenshots/{inspector,dagster}-*.png. Curation labels one demo trajectory untrainable
through the inspector's form, as a curator would, so the stack's ``labels`` gain one row.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect, sync_playwright

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--no-first-run"]
DAGSTER_WAIT_MS = 200_000
"""Dagster's UI queries (the lineage, a batch's events) took minutes on two loaded cores."""


def pick_trajectory(inspector: str) -> dict:
    """A rewarded, scored demo trajectory with the most steps: the richest page to show."""
    listing = httpx.get(f"{inspector}/api/trajectories", params={"size": 500}, timeout=30)
    rows = [
        row
        for row in listing.raise_for_status().json()["rows"]
        if row["reward"] is not None and row["quality"] is not None
    ]
    if not rows:
        raise SystemExit("no scored trajectories yet: run `claw demo`, wait for Dagster")
    return max(rows, key=lambda row: (row["num_steps"], row["reward"], row["trajectory_id"]))


def shoot_inspector(page: Page, inspector: str, out: Path) -> None:
    page.goto(f"{inspector}/")
    expect(page.locator("body")).to_contain_text("turns")
    page.wait_for_timeout(1500)  # the overview's figures poll in
    page.screenshot(path=str(out / "inspector-overview.png"), full_page=True)

    page.goto(f"{inspector}/trajectories")
    expect(page.locator("#trajectory-list tbody tr").first).to_be_visible()
    page.screenshot(path=str(out / "inspector-trajectories.png"))

    chosen = pick_trajectory(inspector)
    page.goto(f"{inspector}/trajectories/{chosen['trajectory_id']}")
    expect(page.locator("body")).to_contain_text("reward")
    page.screenshot(path=str(out / "inspector-trajectory.png"), full_page=True)

    page.goto(f"{inspector}/groups/{chosen['group_id']}")
    expect(page.locator(".reward-big").first).to_contain_text("reward")
    page.screenshot(path=str(out / "inspector-group.png"), full_page=True)

    page.goto(f"{inspector}/trajectories/{chosen['trajectory_id']}")
    form = page.locator('form.label-form[data-kind="trajectory"]')
    form.locator('select[name="trainable"]').select_option("false")
    form.locator('input[name="quality_label"]').fill("loops on the tool")
    form.locator('input[name="author"]').fill("curator-1")
    form.locator("button[type=submit]").click()
    expect(form.locator(".label-status")).to_contain_text("saved")
    page.goto(f"{inspector}/trajectories?label=untrainable")
    expect(page.locator("#trajectory-list tbody tr .badge.lbl").first).to_be_visible()
    page.screenshot(path=str(out / "inspector-curation.png"), full_page=True)

    page.goto(f"{inspector}/batches/grpo")
    expect(page.locator("body")).to_contain_text("grpo")
    page.screenshot(path=str(out / "inspector-batch-preview.png"), full_page=True)


def skip_community_modal(page: Page) -> None:
    skip = page.get_by_role("button", name="Skip")
    if skip.count():
        skip.click()


def shoot_dagster(page: Page, dagster: str, out: Path) -> None:
    page.goto(f"{dagster}/asset-groups")
    expect(page.get_by_text("curation", exact=True).last).to_be_visible(timeout=DAGSTER_WAIT_MS)
    skip_community_modal(page)
    page.get_by_role("button", name="Hide navigation").click()  # room for the graph
    page.mouse.click(1000, 250)  # focus the graph, then expand every group so each asset shows
    page.keyboard.press("Alt+e")
    expect(page.get_by_text("curated_steps", exact=True).first).to_be_visible(
        timeout=DAGSTER_WAIT_MS
    )
    page.wait_for_timeout(5000)  # let the nodes' materialization status colour in
    page.screenshot(path=str(out / "dagster-lineage.png"))

    page.goto(f"{dagster}/assets/batch_grpo?view=events")
    skip_community_modal(page)
    expect(page.get_by_text("pinned_versions")).to_be_visible(timeout=DAGSTER_WAIT_MS)
    expect(page.get_by_text("reward_distribution")).to_be_visible()
    page.screenshot(path=str(out / "dagster-batch-metadata.png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inspector", default="http://127.0.0.1:8120")
    parser.add_argument("--dagster", default="http://127.0.0.1:3000")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(30_000)
            shoot_inspector(page, args.inspector.rstrip("/"), args.out)
            shoot_dagster(page, args.dagster.rstrip("/"), args.out)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
