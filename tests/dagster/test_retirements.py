"""Retired steps on real tables: a plan's final drops stay out of later plans until a curated row
of their group changes, a changed recipe voids them, and a racing planner retires nothing."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg
import polars as pl
from dagster_harness import Driver
from dagster_rollouts import land_rollouts
from polars.testing import assert_frame_equal

from claw_pipelines.batches.names import retired_table
from claw_pipelines.batches.pins import Pins
from claw_pipelines.batching import ledger
from claw_pipelines.batching.retirements import Retirements
from claw_pipelines.config_files import recipes
from claw_pipelines.lake.filters import floor_ms
from claw_pipelines.schemas import Label, Reward, rows_to_arrow, utc_now
from claw_pipelines.trainer import Batch

RETIRED = retired_table("grpo")


def _retired(bound, retirements: Retirements) -> pl.DataFrame:
    """The retired steps a plan using ``retirements`` leaves out."""
    return bound.lake.scan(RETIRED, retirements.version).collect()


def test_flat_groups_stay_retired_until_a_late_reward_changes_one(bound, instance) -> None:
    driver = Driver(bound, instance)
    flat = land_rollouts(bound.lake, groups=2, group_size=4, steps=2, flat=True)
    driver.refresh()
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)
    retired = bound.lake.scan(RETIRED).collect()
    assert retired.height == 16 and set(retired["reason"]) == {"zero_variance"}
    version = bound.lake.version(RETIRED)
    assert ledger.reserve(bound.lake, recipes()["grpo"], "grpo-000001", utc_now()) is None
    assert bound.lake.version(RETIRED) == version  # nothing new to retire: no commit

    changed, unchanged = flat.groups
    late = Reward(trajectory_id=flat.groups[changed][0], value=0.0)
    bound.lake.append("rewards", rows_to_arrow(Reward, [late.model_dump()]))
    land_rollouts(bound.lake, groups=3, group_size=4, steps=2, seed=1)
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    result = driver.materialize(["batch_grpo"], partition_key=request.partition_key)
    batch = bound.lake.scan("batches/grpo").collect()
    assert changed in set(batch["group_id"]) and unchanged not in set(batch["group_id"])
    assert set(bound.lake.scan(RETIRED).collect()["group_id"]) == {unchanged}
    pins = driver.metadata(result, "batch_grpo")["pinned_versions"]
    assert pins["batch_retired"] >= 0
    batch_metadata = driver.metadata(result, "batch_grpo")
    assert batch_metadata["retired_before"] == 8 and batch_metadata["retired"] == {}

    driver.materialize(["batch_grpo"], partition_key=request.partition_key)
    again = bound.lake.scan("batches/grpo").collect()
    assert again.select("turn_id", "reward").equals(batch.select("turn_id", "reward"))


def test_a_racing_planner_retires_nothing_and_a_changed_recipe_voids_all(bound, instance) -> None:
    land_rollouts(bound.lake, groups=1, group_size=4, steps=2, flat=True)
    Driver(bound, instance).refresh()
    recipe, curated = recipes()["grpo"], bound.lake.version("curated_steps")
    now = utc_now()
    pins = Pins(curated_steps=curated, steps=bound.lake.version("steps"), batch_ledger=-1,
                planned_at=now)  # fmt: skip
    plan = ledger.plan_from_pins(bound.lake, recipe, "grpo-000001", pins)
    curated_table = bound.lake.open("curated_steps", curated)
    winner = Retirements.current(bound.lake, recipe, curated_table)
    loser = Retirements.current(bound.lake, recipe, curated_table)
    winner.record(plan, curated, now)
    loser.record(plan, curated, now)
    assert winner.usable and not loser.usable and loser.version == -1
    assert bound.lake.scan(RETIRED).collect().height == 8

    same = Retirements.current(bound.lake, recipe.model_copy(update={"groups_per_batch": 9}),
                               curated_table)  # fmt: skip
    assert _retired(bound, same).height == 8
    stricter = recipe.model_copy(update={"straggler_timeout_s": 1.0})
    under_stricter = Retirements.current(bound.lake, stricter, curated_table)
    assert _retired(bound, under_stricter).is_empty()
    assert bound.lake.scan(RETIRED).select(pl.len()).collect().item() == 0
    under_stricter.record(ledger.plan_from_pins(bound.lake, stricter, "grpo-000001", pins),
                          curated, now)  # fmt: skip
    assert bound.lake.scan(RETIRED).select(pl.len()).collect().item() == 8
    edited_back = Retirements.current(bound.lake, recipe, curated_table)
    assert _retired(bound, edited_back).is_empty()  # decided under the other recipe


def test_a_trajectory_started_before_the_read_start_is_still_planned(bound, instance) -> None:
    """Plans read the curated steps started since the earliest one still in play; a trajectory
    landing later that started before it (a long session) lowers that start through the change
    feed."""
    driver = Driver(bound, instance)
    first = land_rollouts(bound.lake, groups=4, group_size=4, steps=1)
    driver.refresh()
    assert len(driver.tick("batch_grpo_planner").run_requests) == 1
    recipe = recipes()["grpo"]
    assert ledger.reserve(bound.lake, recipe, "grpo-000002", utc_now()) is None
    start = Retirements.current(bound.lake, recipe, bound.lake.open("curated_steps")).open_since
    newest = max(turn["started_at"] for turn in first.turns.values())
    assert start == floor_ms(newest) + timedelta(milliseconds=1)

    early = land_rollouts(bound.lake, groups=4, group_size=4, steps=1, trajectory_prefix="z",
                          start=start - timedelta(hours=1))  # fmt: skip
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    result = driver.materialize(["batch_grpo"], partition_key=request.partition_key)
    batch = bound.lake.scan("batches/grpo").filter(pl.col("batch_id") == request.partition_key)
    assert set(batch.collect()["group_id"]) == set(early.groups)
    pins = Pins.model_validate(driver.metadata(result, "batch_grpo")["pinned_versions"])
    assert pins.open_since == floor_ms(min(turn["started_at"] for turn in early.turns.values()))


def test_a_short_group_rebuilds_the_same_batch_and_loads_in_one_call(bound, instance) -> None:
    """One rollout of a group labelled untrainable: all four landed, so the first batch takes
    the group with its other three at once, while the untrainable one is held in play (not
    retired) until then. Re-materializing the batch (re-planned from its pins) writes the same
    rows, every column, and a trainer loads its export in one call."""
    driver = Driver(bound, instance)
    landed = land_rollouts(bound.lake, groups=4, group_size=4, steps=2)
    short = next(iter(landed.groups))
    out = landed.groups[short][0]
    label = Label(target_kind="trajectory", target_id=out, trainable=False)
    bound.lake.append("labels", rows_to_arrow(Label, [label.model_dump()]))
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    batch_id = request.partition_key
    selection = [dg.AssetKey("batch_grpo"), dg.AssetKey("export_grpo")]
    driver.materialize([key.to_user_string() for key in selection], partition_key=batch_id)
    first = bound.lake.scan("batches/grpo").collect()
    members = dict(first.group_by("group_id").agg(pl.col("trajectory_id").n_unique()).iter_rows())
    assert members == {group: 3 if group == short else 4 for group in landed.groups}
    assert out not in set(first["trajectory_id"])
    assert set(bound.lake.scan(RETIRED).collect()["trajectory_id"]) == {out}

    driver.materialize(["batch_grpo"], partition_key=batch_id)
    assert_frame_equal(bound.lake.scan("batches/grpo").collect(), first)
    batch = Batch.load(bound.lake, "grpo", batch_id)
    tensors, non_tensors = batch.to_verl()
    assert tensors["input_ids"].shape[0] == 16  # 15 sequences and a pad row, recipe's multiple
    uids = {uid for uid in non_tensors["uid"] if not uid.startswith("__pad__")}
    assert uids == set(landed.groups)  # verl's GRPO groups, the short one too
    assert len(batch.to_trl("rollouts")) == 15
