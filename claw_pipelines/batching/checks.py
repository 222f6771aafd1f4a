"""The checks a written batch passes before it is exported, as plain outcomes: the Dagster
layer records them as blocking asset checks, and an export refuses a batch that fails one."""

from __future__ import annotations

import polars as pl
from pydantic import BaseModel, JsonValue

from claw_pipelines.batches.recipe import GROUPED, Recipe
from claw_pipelines.batching.planner import first_start_bound, started_since
from claw_pipelines.lake.filters import keyed

CHECKS = ("groups_complete", "no_step_consumed_twice")


class CheckOutcome(BaseModel):
    name: str
    passed: bool
    facts: dict[str, JsonValue]
    """What the check counted, for a reader of the outcome (plain JSON values)."""


def groups_complete(recipe: Recipe, rows: pl.DataFrame) -> CheckOutcome:
    """Every group of a grouped recipe holds between its minimum (2 when stragglers are
    emitted, else ``group_size``) and ``group_size`` trajectories."""
    if recipe.algorithm not in GROUPED:
        return CheckOutcome(name="groups_complete", passed=True, facts={"grouped": False})
    sizes = rows.group_by("group_id").agg(pl.col("trajectory_id").n_unique().alias("size"))
    minimum = 2 if recipe.straggler_policy == "emit" else recipe.group_size
    bad = sizes.filter((pl.col("size") < minimum) | (pl.col("size") > recipe.group_size))
    return CheckOutcome(
        name="groups_complete",
        passed=bad.is_empty() and sizes.height > 0,
        facts={
            "groups": sizes.height,
            "group_size": recipe.group_size,
            "incomplete_groups": bad.get_column("group_id").sort().to_list(),
        },
    )


def no_step_consumed_twice(ledger: pl.LazyFrame | None, consumed: pl.DataFrame) -> CheckOutcome:
    """No turn of the batch (``consumed``: its ledger rows' turn_id and trajectory_started_at)
    is in the recipe's ledger twice (within or across batches). Only the batch's turns are
    looked up (``lake.keyed`` skips the other files by statistics), among the rows of
    trajectories first started since the batch's earliest (``planner.started_since``): a step
    consumed before keeps a first start at or after the one its trajectory had when this batch
    was planned, so every earlier consumption of the batch's turns is found, and a step
    consumed twice fails the check of the batch that took it again."""
    turn_ids = consumed.get_column("turn_id")
    reused = (
        pl.Series("turn_id", [], pl.String)
        if ledger is None
        else keyed(
            started_since(ledger, first_start_bound(consumed)).select("turn_id"),
            "turn_id",
            turn_ids,
        )
        .group_by("turn_id")
        .len()
        .filter(pl.col("len") > 1)
        .sort("turn_id")
        .collect()
        .get_column("turn_id")
    )
    return CheckOutcome(
        name="no_step_consumed_twice",
        passed=reused.is_empty(),
        facts={
            "checked": turn_ids.len(),
            "turns_consumed_twice": reused.len(),
            "examples": reused.head(20).to_list(),
        },
    )
