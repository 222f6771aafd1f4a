"""Batches released one after another read only the curated steps still in play, whatever the
trajectory ids look like: agents choose their own (``soak-<agent>-<n>``, uuid4s), and ids that
sort against time made every plan read nearly the whole table."""

from __future__ import annotations

import polars as pl
import pytest
from dagster_harness import Driver
from dagster_rollouts import land_rollouts

from claw_pipelines.batching import ledger, planner
from claw_pipelines.batching.release import BuiltBatch, ExportedBatch, release_ready
from claw_pipelines.config_files import recipes

ROUNDS = 4
GROUPS = 4
"""One grpo batch (``groups_per_batch``) lands per round, of groups of 4 one-step rollouts."""


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
    landed: set[str] = set()
    for round_ in range(ROUNDS):  # each round's ids sort before every earlier round's
        rollouts = land_rollouts(bound.lake, groups=GROUPS, seed=round_, steps=1,
                                 trajectory_prefix=f"r{ROUNDS - round_}")  # fmt: skip
        landed |= {t for members in rollouts.groups.values() for t in members}
        driver.refresh()
        released = list(release_ready(bound.lake, recipe))
        assert [type(r) for r in released] == [BuiltBatch, ExportedBatch]

    assert curated_reads == [GROUPS * 4] * ROUNDS  # the new round's steps, never the earlier ones
    batches = bound.lake.scan("batches/grpo").collect()
    per_trajectory = batches.group_by("trajectory_id").agg(pl.col("batch_id").n_unique())
    assert set(per_trajectory["trajectory_id"]) == landed
    assert per_trajectory["batch_id"].to_list() == [1] * len(landed)

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
