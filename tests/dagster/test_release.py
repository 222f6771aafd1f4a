"""New landing data launches one refresh run that also builds, checks and exports the batches it
made ready, recorded as their partitions; no second run while one is queued; the planner leaves
a batch to the refresh run on its way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.events import DagsterEvent
from dagster._core.test_utils import create_run_for_test
from dagster_harness import Driver
from dagster_rollouts import land_rollouts

from assets.landing import REFRESH
from claw_pipelines.batching import ledger
from claw_pipelines.batching.checks import no_step_consumed_twice
from claw_pipelines.batching.release import (
    BatchRefused,
    BuiltBatch,
    ExportedBatch,
    build_batch,
    export_batch,
    release_ready,
)
from claw_pipelines.config_files import recipes
from claw_pipelines.derived_schemas import LEDGER, conform, fit
from claw_pipelines.lake import Lake


def _queued_refresh(
    instance: dg.DagsterInstance, status: dg.DagsterRunStatus = dg.DagsterRunStatus.NOT_STARTED
) -> None:
    """A refresh run that has not started its steps: not started (queued), or started and
    waiting for the ``steps`` pool slot (no step began)."""
    create_run_for_test(
        instance, status=status, asset_selection=frozenset(dg.AssetKey(key) for key in REFRESH)
    )


def _refresh_past_its_steps(instance: dg.DagsterInstance) -> None:
    """A refresh run that has started its ``steps`` step: new data is not its to read."""
    run = create_run_for_test(
        instance,
        status=dg.DagsterRunStatus.STARTED,
        asset_selection=frozenset(dg.AssetKey(key) for key in REFRESH),
    )
    started = DagsterEvent(
        event_type_value=dg.DagsterEventType.STEP_START.value, job_name=run.job_name,
        step_key=REFRESH[0],
    )  # fmt: skip
    instance.report_dagster_event(started, run_id=run.run_id)


def test_the_refresh_run_builds_and_exports_the_batch_it_made_ready(bound, instance):
    driver = Driver(bound, instance)
    land_rollouts(bound.lake, groups=4, group_size=4, steps=2, seed=5)
    (request,) = driver.tick("landing_ingest_sensor").run_requests
    assert [key.to_user_string() for key in request.asset_selection] == [*REFRESH]
    result = driver.materialize(REFRESH)
    started = [
        e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START
    ]
    assert started.index("release_grpo") < started.index("trajectories")  # batches first
    assert started.index("release_grpo") < started.index("release_sft")  # batches.yaml order

    recorded = instance.fetch_materializations(dg.AssetKey("batch_grpo"), limit=5).records
    (batch,) = [r.event_log_entry.asset_materialization for r in recorded]
    assert batch.partition == "grpo-000001" and batch.metadata["groups"].value == 4
    assert "pinned_versions" in batch.metadata and "sample" in batch.metadata
    (export,) = instance.fetch_materializations(dg.AssetKey("export_grpo"), limit=5).records
    assert export.event_log_entry.asset_materialization.partition == "grpo-000001"
    checks = [e for e in result.get_asset_check_evaluations() if e.asset_key.path == ["batch_grpo"]]
    assert {(c.check_name, c.partition, c.passed) for c in checks} == {
        ("groups_complete", "grpo-000001", True),
        ("no_step_consumed_twice", "grpo-000001", True),
    }
    assert "grpo-000001" in instance.get_dynamic_partitions("batches_grpo")
    rows = bound.lake.scan("batches/grpo").collect()
    assert rows.height == 32 and rows["batch_id"].unique().to_list() == ["grpo-000001"]
    assert bound.lake.files_exist(["exports/grpo/grpo-000001/manifest.json"]) == [True]
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)  # nothing left to plan


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED])
def test_no_second_refresh_run_while_one_is_yet_to_start(bound, instance, status):
    driver = Driver(bound, instance)
    _queued_refresh(instance, status)
    land_rollouts(bound.lake, groups=1, group_size=4, steps=1, seed=6)
    ticked = driver.tick("landing_ingest_sensor")
    assert ticked.run_requests == [] and {e.asset_key.path[0] for e in ticked.asset_events} == {
        "turns", "trajectory_events",
    }  # fmt: skip


def test_a_second_refresh_run_starts_beside_one_past_its_steps_but_no_third(bound, instance):
    """Runs slower than the data comes must not pile up: each would wait for the others' pool
    slots, polling the run storage, and slow them all; the run after them reads what they left."""
    driver = Driver(bound, instance)
    _refresh_past_its_steps(instance)
    land_rollouts(bound.lake, groups=1, group_size=4, steps=1, seed=8)
    assert len(driver.tick("landing_ingest_sensor").run_requests) == 1
    _refresh_past_its_steps(instance)
    land_rollouts(bound.lake, groups=1, group_size=4, steps=1, seed=9)
    ticked = driver.tick("landing_ingest_sensor")
    assert ticked.run_requests == [] and ticked.asset_events


def test_the_planner_leaves_a_ready_batch_to_the_refresh_run_on_its_way(bound, instance):
    driver = Driver(bound, instance)
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1, seed=7)
    driver.refresh()  # the chain without the releases: four ready groups wait
    _queued_refresh(instance)
    skipped = driver.tick("batch_grpo_planner")
    assert isinstance(skipped, dg.SkipReason) and "refresh run" in skipped.skip_message
    assert bound.lake.scan("batch_ledger/grpo") is None
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.NOT_STARTED])):
        instance.report_run_canceled(run)
    (planned,) = driver.tick("batch_grpo_planner").run_requests
    assert planned.partition_key == "grpo-000001"
    assert pl.Series(instance.get_dynamic_partitions("batches_grpo")).to_list() == ["grpo-000001"]


@pytest.mark.parametrize(("groups", "batches"), [(4, 1), (8, 2), (12, 3)])
def test_a_release_reserves_its_batches_from_one_plan_in_one_commit(
    bound, instance, monkeypatch, groups, batches
):
    """Each plan reads every curated step in play: a release plans once for all the batches
    ready, records them in one ledger commit, and each re-plans alone from its pins (its
    position among them) to the rows written."""
    from claw_pipelines.batching import ledger

    plans: list[list[str]] = []
    reserve_on = ledger.reserve_on

    def counted(lake, recipe, batch_ids, now, snapshot):
        if recipe.name == "grpo":
            plans.append(batch_ids)
        return reserve_on(lake, recipe, batch_ids, now, snapshot)

    monkeypatch.setattr(ledger, "reserve_on", counted)
    land_rollouts(bound.lake, groups=groups, group_size=4, steps=1, seed=5)
    result = Driver(bound, instance).materialize(REFRESH)
    released = result.asset_materializations_for_node("release_grpo")[-1].metadata["batches"]
    assert released.value == [f"grpo-{n:06d}" for n in range(1, batches + 1)]
    assert len(plans) == 1 and plans[0][:batches] == released.value
    reservations = [
        entry
        for entry in bound.lake.open("batch_ledger/grpo").history()
        if "claw.batch_id" in entry
    ]
    assert [entry["claw.batch_id"] for entry in reservations] == [",".join(released.value)]
    stored = bound.lake.scan("batches/grpo").collect()
    grpo = recipes()["grpo"]
    for position, batch_id in enumerate(released.value):
        again = build_batch(bound.lake, grpo, batch_id)  # refused unless it re-plans the same
        assert again.pins.position == position and again.groups == 4
        assert again.rows == stored.filter(pl.col("batch_id") == batch_id).height == 16


def test_a_batch_is_one_library_call_with_plain_results(bound, instance, monkeypatch):
    """``release_ready`` yields each batch built (checks passed) and then exported; building it
    again re-plans it from its pins; a re-plan that differs from the ledger, or an export of a
    batch with no rows, is refused."""
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1, seed=8)
    Driver(bound, instance).refresh()
    grpo = recipes()["grpo"]
    built, exported = release_ready(bound.lake, grpo)
    assert isinstance(built, BuiltBatch) and isinstance(exported, ExportedBatch)
    assert (built.batch_id, built.groups, built.rows, built.passed) == ("grpo-000001", 4, 16, True)
    assert [c.name for c in built.checks] == ["groups_complete", "no_step_consumed_twice"]
    assert exported.manifest.planned_with == built.pins and exported.manifest.rows == 16
    again = build_batch(bound.lake, grpo, "grpo-000001")
    assert again.pins == built.pins and again.rows == 16 and not again.recipe_edited
    monkeypatch.setattr(ledger, "consumed_turns", lambda *args: ["another-turn"])
    with pytest.raises(BatchRefused, match="did not reproduce its ledger"):
        build_batch(bound.lake, grpo, "grpo-000001")
    with pytest.raises(BatchRefused, match="has no rows"):
        export_batch(bound.lake, grpo, "grpo-000009")


def test_a_step_consumed_twice_is_found_in_the_ledger_files_of_its_trajectory_only(tmp_path):
    """The check looks the batch's turns up among the ledger rows of trajectories first started
    since the batch's earliest (the older files are gone from disk here), which holds every
    earlier consumption of them: a trajectory's first start only moves earlier."""
    lake, table, t0 = Lake(str(tmp_path)), "batch_ledger/grpo", datetime(2026, 1, 1, tzinfo=UTC)

    def reserve(batch_id: str, turns: list[str], first_start: timedelta) -> None:
        rows = pl.DataFrame({"turn_id": turns}).with_columns(
            recipe=pl.lit("grpo"),
            batch_id=pl.lit(batch_id),
            trajectory_started_at=pl.lit(t0 + first_start),
        )
        lake.append(table, conform(fit(rows, LEDGER), LEDGER))

    for n in range(5):  # turn ids in the range of the later batches' (they need not sort by time)
        reserve(f"grpo-{n:06d}", [f"b{n}", f"c{n}"], timedelta(minutes=n))
    old = lake.open(table).file_uris()
    reserve("grpo-000005", ["a", "b"], timedelta(hours=2))
    reserve("grpo-000006", ["b", "c"], timedelta(hours=1))  # b's trajectory gained a step
    reserve("grpo-000007", ["d"], timedelta(hours=3))
    for path in old:
        Path(path).unlink()

    def check(batch_id: str):
        consumed = ledger.consumed_steps(lake, "grpo", batch_id)
        return no_step_consumed_twice(lake.scan(table), consumed)

    twice = check("grpo-000006")
    assert not twice.passed and twice.facts["examples"] == ["b"]
    assert check("grpo-000007").passed
