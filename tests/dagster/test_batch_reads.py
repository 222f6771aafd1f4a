"""Batches released one after another read only the curated steps still in play, whatever the
trajectory ids look like: agents choose their own (``soak-<agent>-<n>``, uuid4s), and ids that
sort against time made every plan read nearly the whole table. A consumed trajectory that gains
a step late moves the read start back once, and is not planned again."""

from __future__ import annotations

import polars as pl
import pytest
from dagster_harness import Driver
from dagster_rollouts import land_rollouts, late_turn
from deltalake import write_deltalake

from claw_pipelines.batches.names import ledger_table, retired_table
from claw_pipelines.batching import ledger, planner
from claw_pipelines.batching.release import BuiltBatch, ExportedBatch, release_ready
from claw_pipelines.config_files import recipes
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import Turn, rows_to_arrow

ROUNDS = 4
GROUPS = 4
"""One grpo batch (``groups_per_batch``) lands per round, of groups of 4 one-step rollouts."""
LATE = 2
"""Before this round, a trajectory of the first batch gains a step."""


@pytest.fixture
def curated_reads(monkeypatch) -> list[int]:
    """The curated rows each plan takes in (after its read start), one entry per plan."""
    reads: list[int] = []
    candidates = planner._candidates

    def counted(recipe, curated, *rest):
        reads.append(curated.select(pl.len()).collect().item())
        return candidates(recipe, curated, *rest)

    monkeypatch.setattr(planner, "_candidates", counted)
    return reads


def test_each_plan_reads_only_the_steps_in_play_when_ids_sort_against_time(
    bound, instance, curated_reads
) -> None:
    driver, recipe = Driver(bound, instance), recipes()["grpo"]
    landed: list[dict[str, dict]] = []  # each round's turns by id
    for round_ in range(ROUNDS):  # each round's ids sort before every earlier round's
        if round_ == LATE:
            late = late_turn(max(landed[0].values(), key=lambda turn: turn["started_at"]))
            bound.lake.append("turns", rows_to_arrow(Turn, [late]))
        rollouts = land_rollouts(bound.lake, groups=GROUPS, seed=round_, steps=1,
                                 trajectory_prefix=f"r{ROUNDS - round_}")  # fmt: skip
        landed.append(rollouts.turns)
        driver.refresh()
        released = list(release_ready(bound.lake, recipe))
        assert [type(r) for r in released] == [BuiltBatch, ExportedBatch]

    new_round = GROUPS * 4
    assert curated_reads[:LATE] + curated_reads[LATE + 1 :] == [new_round] * (ROUNDS - 1)
    assert curated_reads[LATE] > new_round  # back to the late trajectory's first step, once
    batches = bound.lake.scan("batches/grpo").collect()
    curated = bound.lake.scan("curated_steps").select("turn_id").collect()
    assert late["turn_id"] in set(curated["turn_id"]) - set(batches["turn_id"])
    assert set(batches["turn_id"]) == {turn for turns in landed for turn in turns}
    per_trajectory = batches.group_by("trajectory_id").agg(pl.col("batch_id").n_unique())
    assert per_trajectory["batch_id"].to_list() == [1] * per_trajectory.height

    for batch_id in batches["batch_id"].unique().sort():
        pins = ledger.pins_of(bound.lake, recipe.name, batch_id)
        assert pins.open_since is not None or batch_id == "grpo-000001"
        again = ledger.plan_from_pins(bound.lake, recipe, batch_id, pins)
        columns = ["turn_id", "group_id", "reward", "advantage", "source_versions"]
        stored = batches.filter(pl.col("batch_id") == batch_id).select(columns).sort("turn_id")
        assert again.planned.select(columns).sort("turn_id").equals(stored)
        assert again.consumed["turn_id"].to_list() == ledger.consumed_turns(
            bound.lake, recipe.name, batch_id
        )


def _as_before_first_starts(lake: Lake, table: str) -> None:
    """Rewrite ``table`` as a version that kept no ``trajectory_started_at`` wrote it."""
    older = pl.scan_delta(lake.open(table)).drop("trajectory_started_at").collect()
    write_deltalake(lake.open(table), older.to_arrow(), mode="overwrite", schema_mode="overwrite")


def test_a_ledger_and_retirements_kept_before_first_starts_still_exclude_their_steps(
    bound, instance
) -> None:
    driver, recipe = Driver(bound, instance), recipes()["grpo"]
    first = land_rollouts(bound.lake, groups=GROUPS, steps=1)
    land_rollouts(bound.lake, groups=2, steps=1, flat=True, seed=1)
    driver.refresh()
    assert [type(r) for r in release_ready(bound.lake, recipe)] == [BuiltBatch, ExportedBatch]
    tables = [ledger_table(recipe.name), retired_table(recipe.name)]
    for table in tables:
        _as_before_first_starts(bound.lake, table)

    late = late_turn(max(first.turns.values(), key=lambda turn: turn["started_at"]))
    bound.lake.append("turns", rows_to_arrow(Turn, [late]))
    second = land_rollouts(bound.lake, groups=GROUPS, steps=1, seed=2)
    land_rollouts(bound.lake, groups=1, steps=1, flat=True, seed=3)
    driver.refresh()
    built, _ = release_ready(bound.lake, recipe)
    batched = bound.lake.scan("batches/grpo").collect()["turn_id"]
    assert batched.sort().to_list() == sorted([*first.turns, *second.turns])  # not the late one
    assert (built.retired_before, built.retired) == (8, {"zero_variance": 4})
    for table, kept_before in zip(tables, [GROUPS * 4, 8], strict=True):
        unknown = bound.lake.scan(table).select(pl.col("trajectory_started_at").null_count())
        assert unknown.collect().item() == kept_before  # the older rows read it as null
