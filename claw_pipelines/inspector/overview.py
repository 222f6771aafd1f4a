"""The overview's figures, computed from the in-memory lake state (pure polars, no table reads)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

import polars as pl
from pydantic import BaseModel

from claw_pipelines.batches.names import batches_table, ledger_table
from claw_pipelines.inspector.tables import LakeState

WINDOW_S = 60
"""Turns/s is measured over the last minute of `turns.ended_at`."""

QUALITY_BINS = 10


class RecipeStatus(BaseModel):
    recipe: str
    ready_groups: int | None
    """Groups the planner would put in the next batch now (None until a plan was computed)."""
    batch_ready: bool | None
    batches_produced: int
    steps_in_batches: int
    steps_consumed: int
    dagster_url: str
    plan_error: str | None = None
    """Why the planner could not plan this recipe over the current tables."""


class Overview(BaseModel):
    refreshed_at: datetime
    turns_total: int
    turns_per_s: float
    turns_per_s_series: list[int]
    """Turns per second over the window, oldest first (for the sparkline)."""
    trajectories_open: int
    trajectories_completed: int
    trajectories_aborted: int
    trajectories_timed_out: int
    reward_coverage: float | None
    """Share of closed trajectories that have a reward."""
    steps_scored: int
    quality_histogram: list[int]
    quality_mean: float | None
    labels_total: int
    policy_versions_in_flight: dict[str, int]
    """Open trajectories per policy version."""
    latest_policy_version: int | None
    recipes: list[RecipeStatus]
    tables: dict[str, int | None]
    missing: list[str]
    """Plain-language reasons for tables that do not exist yet."""


MISSING_REASONS = {
    "turns": "no turns yet: point an agent at the capture proxy (`claw up`, then `claw demo`)",
    "rewards": "no rewards table yet: nothing posted a reward (/claw/v1/rewards) so far",
    "trajectory_events": "no trajectory_events yet: no agent completed a trajectory so far",
    "labels": "no labels yet: nobody labelled a step or trajectory on its page so far",
    "steps": "no steps table yet: Dagster has not materialized `steps` (run `claw up`)",
    "scored_steps": "no scored_steps yet: quality scores appear after Dagster's next refresh",
    "trajectories": "no trajectories table yet: Dagster has not materialized it",
}


def turn_rate(turns: pl.DataFrame, now: datetime) -> list[int]:
    """Turns ended in each of the last ``WINDOW_S`` seconds."""
    start = now - timedelta(seconds=WINDOW_S)
    recent = turns.filter(pl.col("ended_at") > start).select(
        ((pl.col("ended_at") - start).dt.total_milliseconds() // 1000)
        .clip(0, WINDOW_S - 1)
        .alias("s")
    )
    counts = recent.group_by("s").len()
    series = pl.DataFrame({"s": pl.int_range(0, WINDOW_S, eager=True)}).join(
        counts, on="s", how="left"
    )
    return series.sort("s")["len"].fill_null(0).to_list()


def quality_histogram(scored: pl.DataFrame) -> list[int]:
    bins = (pl.col("quality_score").clip(0, 1) * QUALITY_BINS).floor().clip(0, QUALITY_BINS - 1)
    counts = scored.filter(pl.col("quality_score").is_not_null()).group_by(bins.alias("b")).len()
    frame = pl.DataFrame({"b": pl.int_range(0, QUALITY_BINS, eager=True).cast(pl.Float64)})
    return frame.join(counts, on="b", how="left").sort("b")["len"].fill_null(0).to_list()


class RecipeCounts(NamedTuple):
    batches: int
    """Batches produced."""
    steps_in_batches: int
    steps_consumed: int
    """Steps recorded in the consumption ledger."""


def recipe_counts(state: LakeState, recipe: str) -> RecipeCounts:
    batches = state[batches_table(recipe)]
    ledger = state[ledger_table(recipe)]
    return RecipeCounts(
        batches["batch_id"].n_unique(), batches.height, ledger["turn_id"].n_unique()
    )


def compute(state: LakeState, now: datetime, recipes: list[RecipeStatus]) -> Overview:
    summary = state.summary
    status = dict(summary.group_by("status").len().iter_rows())
    closed = summary.filter(pl.col("status") != "open")
    series = turn_rate(state["turns"], now)
    in_flight = (
        summary.filter(pl.col("status") == "open")
        .select(pl.col("policy_versions").list.max().alias("v"))
        .group_by("v")
        .len()
        .sort("v")
    )
    versions = state["turns"]["policy_version"].drop_nulls()
    scored = state["scored_steps"]
    return Overview(
        refreshed_at=state.refreshed_at,
        turns_total=state["turns"].height,
        turns_per_s=round(sum(series) / WINDOW_S, 3),
        turns_per_s_series=series,
        trajectories_open=status.get("open", 0),
        trajectories_completed=status.get("completed", 0),
        trajectories_aborted=status.get("aborted", 0),
        trajectories_timed_out=status.get("timed_out", 0),
        reward_coverage=(
            closed["reward"].is_not_null().mean() if closed.height else None  # type: ignore[arg-type]
        ),
        steps_scored=scored.height,
        quality_histogram=quality_histogram(scored),
        quality_mean=scored["quality_score"].mean() if scored.height else None,  # type: ignore[arg-type]
        labels_total=state["labels"].height,
        policy_versions_in_flight={
            ("none" if v is None else str(v)): n for v, n in in_flight.iter_rows()
        },
        latest_policy_version=versions.max() if versions.len() else None,  # type: ignore[arg-type]
        recipes=recipes,
        tables=dict(state.versions),
        missing=[reason for t, reason in MISSING_REASONS.items() if not state.has(t)],
    )
