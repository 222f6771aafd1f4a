"""Batches planned at once, as an instance without the ``claw_batch_<recipe>`` pool limit allows
(or a UI launch racing the planner sensor): no step is reserved twice, no batch id names two
reservations, and the run or tick that lost goes on (a retried step, the next tick)."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest
from dagster_harness import Driver, retry_reasons
from dagster_rollouts import land_rollouts
from deltalake import DeltaTable

from claw_pipelines.batching import building, ledger
from claw_pipelines.config_files import recipes
from claw_pipelines.schemas import utc_now


def _eight_ready_groups(bound, instance) -> Driver:
    """Eight complete GRPO groups curated: two batches of the shipped recipe."""
    driver = Driver(bound, instance)
    land_rollouts(bound.lake, groups=8, group_size=4, steps=1)
    driver.refresh()
    return driver


def _tick_after_one_lost_to_the_ui(driver, monkeypatch, name: str, stand_in) -> dg.RunRequest:
    """The planner's tick with ``ledger.<name>`` replaced by ``stand_in`` (where the UI reserves
    a batch at that moment) launches nothing; the next one, without it, launches one batch."""
    original = getattr(ledger, name)
    monkeypatch.setattr(ledger, name, stand_in)
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)
    monkeypatch.setattr(ledger, name, original)
    (request,) = driver.tick("batch_grpo_planner").run_requests
    return request


def _reserved(bound) -> list[tuple[str, int]]:
    """(batch_id, steps) per batch in the ledger; no step in two."""
    consumed = bound.lake.scan("batch_ledger/grpo").collect()
    assert consumed.height == consumed.get_column("turn_id").n_unique()
    return consumed.group_by("batch_id").len().sort("batch_id").rows()


@pytest.mark.parametrize("earlier_batches", [0, 1], ids=["first-batches", "later-batches"])
def test_two_batches_reserved_at_once_take_different_groups(
    bound, instance, monkeypatch, earlier_batches: int
) -> None:
    """Without the pool limit two partitions may plan at once: both pick the same groups, the
    second reservation is rejected and its step retried, which plans the groups left over."""
    driver = Driver(bound, instance)
    landed = land_rollouts(bound.lake, groups=4 * (2 + earlier_batches), group_size=4, steps=1)
    driver.refresh()
    names = [f"grpo-{n:06d}" for n in range(1, earlier_batches + 3)]
    instance.add_dynamic_partitions("batches_grpo", names)
    for name in names[:earlier_batches]:
        driver.materialize(["batch_grpo"], partition_key=name)
    winner, loser = names[earlier_batches:]
    planned_alone = ledger.plan_pinned

    def planned_while_another_reserves(recipe, batch_ids, pins, inputs):
        plans = planned_alone(recipe, batch_ids, pins, inputs)
        if batch_ids == [loser] and ledger.pins_of(bound.lake, "grpo", winner) is None:
            assert ledger.reserve(bound.lake, recipe, winner, utc_now()) is not None
        return plans

    monkeypatch.setattr(ledger, "plan_pinned", planned_while_another_reserves)
    raced = driver.attempt(["batch_grpo"], partition_key=loser)
    assert raced.success
    (why,) = retry_reasons(raced)
    assert f"another batch of grpo was reserved while {loser} was planned" in why
    driver.materialize(["batch_grpo"], partition_key=winner)
    written = bound.lake.scan("batches/grpo").collect()
    groups = written.group_by("batch_id").agg(pl.col("group_id").unique()).sort("batch_id")
    assert groups.get_column("batch_id").to_list() == names
    per_batch = [set(g) for g in groups.get_column("group_id").to_list()]
    assert all(len(g) == 4 for g in per_batch) and set().union(*per_batch) == set(landed.groups)
    assert written.height == written.get_column("turn_id").n_unique() == 16 * len(names)


def test_a_batch_rewrite_that_a_compaction_got_ahead_of_is_retried(
    bound, instance, monkeypatch
) -> None:
    """Another batch's compaction of `batches/grpo` merges this batch's file while the batch is
    re-materialized: the rewrite is rejected (the rows it replaces moved) and the step retried
    from the batch's pins, which writes the same rows."""
    driver = _eight_ready_groups(bound, instance)
    names = ["grpo-000001", "grpo-000002"]
    instance.add_dynamic_partitions("batches_grpo", names)
    for name in names:
        driver.materialize(["batch_grpo"], partition_key=name)
    before = bound.lake.scan("batches/grpo").sort("turn_id").collect()
    written_alone = building.commit

    def written_while_another_compacts(table, data, **kwargs):
        if len(table.file_uris()) > 1:
            DeltaTable(table.table_uri).optimize.compact()
        return written_alone(table, data, **kwargs)

    monkeypatch.setattr(building, "commit", written_while_another_compacts)
    raced = driver.attempt(["batch_grpo"], partition_key=names[0])
    assert raced.success
    (why,) = retry_reasons(raced)
    assert f"changed batches/grpo while {names[0]} was written" in why
    after = bound.lake.scan("batches/grpo").sort("turn_id").collect()
    assert after.drop("_commit_version", strict=False).equals(
        before.drop("_commit_version", strict=False)
    )


def test_a_planner_tick_that_a_ui_launch_reserved_ahead_of_launches_the_rest_later(
    bound, instance, monkeypatch
) -> None:
    """A partition materialized from the UI reserves its batch while the planner sensor plans
    the same groups: the tick launches nothing instead of failing, and the next one plans the
    groups left over."""
    driver = _eight_ready_groups(bound, instance)
    planned_alone = ledger.plan_pinned

    def planned_while_the_ui_reserves(recipe, batch_ids, pins, inputs):
        plans = planned_alone(recipe, batch_ids, pins, inputs)
        lake = bound.lake
        if batch_ids != ["from-the-ui"] and ledger.pins_of(lake, "grpo", "from-the-ui") is None:
            assert ledger.reserve(lake, recipe, "from-the-ui", utc_now()) is not None
        return plans

    request = _tick_after_one_lost_to_the_ui(
        driver, monkeypatch, "plan_pinned", planned_while_the_ui_reserves
    )
    assert request.partition_key == "grpo-000002"
    assert _reserved(bound) == [("from-the-ui", 16), ("grpo-000002", 16)]


def test_the_planner_skips_a_batch_id_a_ui_partition_already_reserved(bound, instance) -> None:
    """A user added and materialized ``grpo-000002`` before the planner got there: the planner's
    next batch is ``grpo-000003``, not a second reservation under the same id."""
    driver = _eight_ready_groups(bound, instance)
    instance.add_dynamic_partitions("batches_grpo", ["grpo-000002"])
    driver.materialize(["batch_grpo"], partition_key="grpo-000002")
    (request,) = driver.tick("batch_grpo_planner").run_requests
    assert request.partition_key == "grpo-000003"
    assert _reserved(bound) == [("grpo-000002", 16), ("grpo-000003", 16)]


def test_a_batch_id_reserved_between_naming_and_planning_is_not_reserved_twice(
    bound, instance, monkeypatch
) -> None:
    """The UI reserves the very id the planner just picked, before the planner plans it: the
    planner's reservation is refused (no second set of steps under one id) and it moves on."""
    driver = _eight_ready_groups(bound, instance)
    named_alone = ledger.next_batch_id

    def named_then_taken(lake, recipe):
        batch_id = named_alone(lake, recipe)
        assert ledger.reserve(lake, recipes()[recipe], batch_id, utc_now()) is not None
        return batch_id

    request = _tick_after_one_lost_to_the_ui(driver, monkeypatch, "next_batch_id", named_then_taken)
    assert request.partition_key == "grpo-000002"
    assert _reserved(bound) == [("grpo-000001", 16), ("grpo-000002", 16)]
