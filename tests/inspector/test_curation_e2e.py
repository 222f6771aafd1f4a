"""Curation end to end: a trajectory labelled untrainable in the inspector (in Chromium) leaves the
batch preview at once and is left out of the next materialized batch (the Dagster assets of
assets.definitions, run in-process over the same lake)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pytest
from lake_rows import land_rollouts
from playwright.sync_api import expect

from assets.definitions import build_definitions
from claw_pipelines.processes import Service, free_port
from claw_pipelines.stack import start_inspector
from resources.lake import LakeResource

CHAIN = ["steps", "trajectories", "rewarded_steps", "scored_steps", "curated_steps"]


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[tuple[LakeResource, dg.Definitions, dg.DagsterInstance]]:
    resource = LakeResource(lake_uri=str(tmp_path / "lake"))
    with dg.instance_for_test() as instance:
        yield (
            resource,
            build_definitions(lake=resource, sensor_interval_s=1, sensor_wait_s=0),
            instance,
        )


def materialize(defs: dg.Definitions, instance, keys: list[str], partition_key: str | None = None):
    selection = [dg.AssetKey(k) for k in keys]
    job = defs.resolve_implicit_job_def_def_for_assets(selection)
    result = job.execute_in_process(
        instance=instance, asset_selection=selection, partition_key=partition_key
    )
    assert result.success
    return result


@pytest.fixture
def inspector_over(pipeline, tmp_path: Path) -> Iterator[Service]:
    resource, _, _ = pipeline
    port = free_port()
    service = start_inspector(port, tmp_path, env={"CLAW_LAKE_URI": resource.lake_uri})
    try:
        yield service
    finally:
        service.stop()


def caught_up(service: Service, lake, table: str) -> None:
    """Wait until the inspector's index has read ``table`` up to its current version."""
    want = lake.version(table)
    deadline = time.monotonic() + 60
    while httpx.get(service.url + "/api/health").json()["versions"][table] != want:
        assert time.monotonic() < deadline, f"the inspector never read {table} v{want}"
        time.sleep(0.2)


def planned_trajectories(preview: dict) -> set[str]:
    return {t for group in preview["groups"] for t in group["trajectory_id"]}


def test_untrainable_label_removes_the_trajectory_from_the_next_batch(
    pipeline, inspector_over, page, screenshot
):
    resource, defs, instance = pipeline
    lake = resource.lake()
    landed = land_rollouts(lake, groups=4, rollouts=4)
    materialize(defs, instance, CHAIN)
    victim = landed.trajectories[5]
    victim_turns = set(
        lake.scan("turns").filter(pl.col("trajectory_id") == victim).collect()["turn_id"]
    )
    inspector_over.wait_ready("/api/health", timeout_s=60)
    caught_up(inspector_over, lake, "scored_steps")
    api = inspector_over.url + "/api/batches/grpo"
    before = httpx.get(api, timeout=30).json()
    assert before["ready"] is True
    assert victim in planned_trajectories(before)

    page.goto(f"{inspector_over.url}/trajectories/{victim}")
    form = page.locator('form.label-form[data-kind="trajectory"]')
    form.locator('select[name="trainable"]').select_option("false")
    form.locator('input[name="author"]').fill("curator")
    form.locator("button[type=submit]").click()
    expect(form.locator(".label-status")).to_contain_text("saved 1 trajectory label")

    after = httpx.get(api, timeout=30).json()
    assert victim not in planned_trajectories(after)
    # all four rollouts of the victim's group landed: it is emitted with the other three
    assert after["ready"] is True
    sizes = {group["group_id"]: group["rollouts"] for group in after["groups"]}
    assert sizes == {group: 3 if group == landed.groups[1] else 4 for group in landed.groups}
    assert any(victim in dropped["examples"] for dropped in after["dropped"])
    page.goto(inspector_over.url + "/batches/grpo")
    expect(page.locator("#batch-ready")).to_have_text("yes")
    expect(page.locator("#plan-dropped")).to_contain_text(victim[-8:])
    expect(page.locator("a[href$='/assets/batch_grpo']")).to_be_visible()
    screenshot("batch-preview")

    materialize(defs, instance, CHAIN)
    curated = lake.scan("curated_steps").filter(pl.col("trajectory_id") == victim).collect()
    assert curated["trainable"].to_list() == [False] * len(victim_turns)
    instance.add_dynamic_partitions("batches_grpo", ["grpo-000001"])
    materialize(defs, instance, ["batch_grpo"], partition_key="grpo-000001")
    batch = lake.scan("batches/grpo").collect()
    assert batch["group_id"].n_unique() == 4
    assert not set(batch["turn_id"]) & victim_turns
    assert victim not in set(batch["trajectory_id"])

    caught_up(inspector_over, lake, "scored_steps")
    scored = landed.trajectories[0]
    page.goto(f"{inspector_over.url}/trajectories/{scored}")
    last = page.locator("article.step").nth(1)
    expect(last.locator(".quality-score")).to_have_text(re.compile(r"^\d\.\d\d$"))
    expect(last.locator(".credited-reward")).to_have_text(re.compile(r"^\d\.\d{3}$"))
    expect(last.locator(".reward")).to_contain_text("(pipeline)")
    screenshot("trajectory-scored")
