"""Reading a recipe's retired steps (``batch_retired/<recipe>``): which still stand, and where a
plan may start reading.

The batch asset writes the table (``claw_pipelines.batching.retirements``); it and the inspector's batch preview
plan with it. A retirement stands while no row of its trajectory or group has changed since the
curated_steps version the table is current through, under the recipe it was decided with.
"""

from __future__ import annotations

import hashlib

import polars as pl
from deltalake import DeltaTable

from claw_pipelines.lake import keyed
from claw_pipelines.batching.planner import Recipe

RECIPE_APP = "claw/retired/recipe"
"""App transaction naming the recipe the retirements were decided under (its fingerprint as a
number): a table last written under another recipe (even an earlier one edited back) is voided."""
OPEN_FROM = "claw.open_from"
"""Commit metadata of every retirement commit: where the next plan may start ("" for nowhere)."""
HISTORY_SEARCHED = 20
"""Commits searched back for the last ``claw.open_from`` (past voids and compactions); when
none is found the next plan reads the tables whole, which is always right."""


def retired_table(recipe: str) -> str:
    return f"batch_retired/{recipe}"


def through_app(recipe: str) -> str:
    """App transaction: the curated_steps version the retirements are current through."""
    return f"claw/retired/{recipe}"


def fingerprint(recipe: Recipe) -> int:
    """Everything in the recipe that decides final drops (batch size and exports do not), as a
    60-bit number (an app transaction version)."""
    settings = recipe.model_dump_json(exclude={"exports", "groups_per_batch"})
    return int(hashlib.sha256(settings.encode()).hexdigest()[:15], 16)


def current_through(table: DeltaTable, recipe: Recipe) -> int | None:
    """The curated_steps version ``table`` is current through; None when it holds nothing
    decided under ``recipe`` as it is now."""
    if table.transaction_version(RECIPE_APP) != fingerprint(recipe):
        return None
    return table.transaction_version(through_app(recipe.name))


def recorded_open_from(table: DeltaTable) -> str | None:
    """``claw.open_from`` as the last plan recorded it (None: read everything)."""
    for commit in table.history(HISTORY_SEARCHED):
        if OPEN_FROM in commit:
            return commit[OPEN_FROM] or None
    return None


def voided(retired: pl.LazyFrame, changed: pl.DataFrame) -> pl.Series:
    """The trajectories (sorted) of the retired rows whose trajectory or group has a row in
    ``changed`` (columns trajectory_id, group_id)."""
    return (
        pl.concat(
            [
                keyed(retired, "trajectory_id", changed.get_column("trajectory_id")),
                keyed(retired, "group_id", changed.get_column("group_id")),
            ]
        )
        .select("trajectory_id")
        .unique()
        .sort("trajectory_id")
        .collect()
        .get_column("trajectory_id")
    )


def lowered(open_from: str | None, changed: pl.DataFrame, void: pl.Series) -> str | None:
    """``open_from`` lowered to every changed or voided trajectory (None stays: read all)."""
    if open_from is None:
        return None
    lower = [changed.get_column("trajectory_id").min(), void.min()]
    return min([open_from, *(v for v in lower if v is not None)])
