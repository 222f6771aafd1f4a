"""The inspector in a real browser (Debian's Chromium through Playwright) against `claw inspect`."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import polars as pl
from lake_rows import land_rollouts, rollout_turns
from playwright.sync_api import expect

from claw_pipelines.schemas import Turn, rows_to_arrow


def test_overview_updates_when_new_turns_land(page, inspector_service, inspector_lake, screenshot):
    lake, _ = inspector_lake
    page.goto(inspector_service.url + "/")
    turns = page.locator('[data-field="turns_total"]')
    expect(turns).to_have_text(re.compile(r"^\d+$"))
    before = int(turns.inner_text())
    expect(page.locator('[data-field="trajectories_open"]')).to_have_text("1")
    land_rollouts(lake, groups=1, rollouts=2, policy_version=2, leave_open=2)
    expect(turns).to_have_text(str(before + 4))
    expect(page.locator('[data-field="trajectories_open"]')).to_have_text("3")
    expect(page.locator("#versions")).to_contain_text("2")
    screenshot("overview")


def test_trajectory_shows_each_steps_state_action_and_reward(
    page, inspector_service, inspector_lake, screenshot
):
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.goto(inspector_service.url + "/trajectories?status=completed&reward_min=1")
    rows = page.locator("#trajectory-list tbody tr")
    expect(rows.first.locator("a.tid")).to_be_visible()
    screenshot("trajectories")
    rows.first.locator("a.tid").click()
    steps = page.locator("article.step")
    expect(steps).to_have_count(2)
    first, last = steps.nth(0), steps.nth(1)
    expect(first.locator(".state .msg.role-user")).to_contain_text("What is")
    expect(first.locator(".action .toolcall .fn")).to_have_text("calculator")
    expect(first.locator(".action .tok").first).to_be_visible()
    expect(last.locator(".state .msg.role-tool")).to_be_visible()
    expect(last.locator(".action .response-text")).to_contain_text("The answer is")
    expect(last.locator(".prefix")).to_have_text("prefix consistent")
    expect(page.locator(".traj-reward")).to_have_text("1.000")
    expect(last.locator(".reward")).to_contain_text("outcome = 1.000")
    last.locator("button.prompt-ids").click()
    expect(last.locator(".prompt-tokens .tok").first).to_be_visible()
    screenshot("trajectory")
    page.locator(".meta a[href^='/groups/']").click()
    expect(page.locator(".rollout")).to_have_count(4)
    expect(page.locator(".reward-big").first).to_contain_text("reward")
    screenshot("group")
    assert console_errors == []


def test_labelling_a_trajectory_untrainable_writes_a_labels_row(
    page, inspector_service, inspector_lake, screenshot
):
    lake, rollouts = inspector_lake
    trajectory_id = rollouts.trajectories[1]
    page.goto(f"{inspector_service.url}/trajectories/{trajectory_id}")
    form = page.locator('form.label-form[data-kind="trajectory"]')
    form.locator('input[name="quality_label"]').fill("x" * 150)
    form.locator('input[name="author"]').fill("curator-1")
    form.locator("button[type=submit]").click()
    expect(form.locator(".label-status")).to_have_text(
        "not saved: quality_label: String should have at most 100 characters"
    )
    form.locator('select[name="trainable"]').select_option("false")
    form.locator('input[name="quality_label"]').fill("bad")
    form.locator('input[name="note"]').fill("<b>wrong answer</b> & loops")
    form.locator('input[name="author"]').fill("curator-1")
    form.locator("button[type=submit]").click()
    expect(form.locator(".label-status")).to_contain_text("saved 1 trajectory label")
    expect(page.locator(".meta .badge.untrainable")).to_be_visible()
    form.locator('input[name="author"]').fill("  ")
    form.locator('input[name="note"]').fill("no name")
    form.locator("button[type=submit]").click()
    expect(form.locator(".label-status")).to_contain_text("not saved: author:")
    page.reload()
    expect(form.locator('input[name="author"]')).to_have_value("curator-1")
    labels = lake.scan("labels").filter(pl.col("target_id") == trajectory_id).collect()
    assert labels.height == 1
    row = labels.row(0, named=True)
    assert (row["target_kind"], row["trainable"], row["quality_label"]) == (
        "trajectory",
        False,
        "bad",
    )
    assert (row["author"], row["note"]) == ("curator-1", "<b>wrong answer</b> & loops")
    page.goto(inspector_service.url + "/trajectories?label=untrainable")
    expect(page.locator("#trajectory-list tbody tr")).to_have_count(1)
    expect(page.locator("#trajectory-list tbody tr .badge.lbl")).to_have_text("bad")
    screenshot("curation")


def test_an_open_trajectory_page_follows_new_turns(page, inspector_service, inspector_lake):
    lake, rollouts = inspector_lake
    trajectory_id = rollouts.open_trajectories[0]
    page.goto(f"{inspector_service.url}/trajectories/{trajectory_id}")
    expect(page.locator(".live")).to_be_visible()
    steps = page.locator("article.step")
    expect(steps).to_have_count(2)
    (extra,) = rollout_turns(
        trajectory_id,
        "late",
        5,
        6,
        11,
        start=datetime.now(UTC),
        policy_version=2,
        channel="eval",
        agent="arith-agent",
        seed=9,
        steps=1,
    )
    lake.append("turns", rows_to_arrow(Turn, [extra.model_dump()]))
    expect(steps).to_have_count(3)
    expect(page.locator(f'article.step[data-turn="{extra.turn_id}"]')).to_be_visible()
    note = page.locator('form.label-form[data-kind="trajectory"] input[name="note"]')
    note.fill("half-typed note")
    later = extra.model_copy(update={"turn_id": f"{extra.turn_id}-later"})
    lake.append("turns", rows_to_arrow(Turn, [later.model_dump()]))
    expect(page.locator("#reload-notice")).to_contain_text("new steps arrived")
    expect(steps).to_have_count(3)
    expect(note).to_have_value("half-typed note")
    page.locator("#reload-notice button").click()
    expect(steps).to_have_count(4)


def test_labelling_a_whole_filter_result(page, inspector_service, inspector_lake):
    lake, _ = inspector_lake
    page.goto(inspector_service.url + "/trajectories?channel=eval&status=completed")
    matched = int(page.locator("#matched").inner_text())
    assert matched > 0
    page.on("dialog", lambda dialog: dialog.accept())
    form = page.locator('form.label-form[data-kind="filter"]')
    form.locator('input[name="tags"]').fill("eval-set, reviewed")
    form.locator('input[name="author"]').fill("curator-2")
    form.locator("button[type=submit]").click()
    expect(form.locator(".label-status")).to_contain_text(f"saved {matched} trajectory label")
    labels = lake.scan("labels").filter(pl.col("author") == "curator-2").collect()
    assert labels.height == matched
    assert labels["tags"].to_list() == [["eval-set", "reviewed"]] * matched
    page.goto(inspector_service.url + "/trajectories?text=reviewed")
    expect(page.locator("#matched")).to_have_text(str(matched))
