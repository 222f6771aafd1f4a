"""What each recipe's next batch would hold right now, planned by the pipeline's own planner.

The preview runs ``plan_batch`` over `scored_steps` with the latest labels applied by
``curate_steps`` (so a label shows up here before Dagster refreshes `curated_steps`), against the
recipe's consumption ledger and the retirements that still stand, so its work grows with the
steps still in play, like the batch asset's. Staleness is measured against the newest policy
version among the scored steps, as the planner does over the curated ones (not among all turns:
an open trajectory of a newer policy does not age the others until it is scored). Plans are
cached per input versions: they are recomputed when `scored_steps`, `labels` or the ledger
changed, or when a plan waiting for a straggler timeout is a few seconds old.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import polars as pl

from claw_pipelines.batches.names import ledger_table, retired_table
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.ledger import next_batch_id
from claw_pipelines.batching.planner import BatchPlan, plan_batch
from claw_pipelines.batching.retirements import (
    current_through,
    lowered,
    recorded_open_since,
    voided,
)
from claw_pipelines.inspector.tables import LakeState
from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import changes
from claw_pipelines.lake.commits import watermark_app
from claw_pipelines.policy.versions import highest_announced_version, lag_reference
from claw_pipelines.transforms import curate_steps

DAGSTER_URL_ENV = "CLAW_DAGSTER_URL"


def dagster_asset_url(recipe: str) -> str:
    base = os.environ.get(DAGSTER_URL_ENV, "http://127.0.0.1:3000").rstrip("/")
    return f"{base}/assets/batch_{recipe}"


CHANGE_KEYS = ["trajectory_id", "group_id", "started_at"]


def _labelled(state: LakeState, after_version: int | None) -> pl.DataFrame:
    """(trajectory_id, group_id, started_at) of every step or trajectory labelled after
    ``after_version``."""
    labels = state["labels"]
    if after_version is not None:
        labels = labels.filter(pl.col("_commit_version") > after_version)
    targets = pl.col("target_id")
    steps = labels.filter(pl.col("target_kind") == "step").select(targets.alias("turn_id"))
    trajectories = labels.filter(pl.col("target_kind") == "trajectory").select(
        targets.alias("trajectory_id")
    )
    turns = state["turns"].select("turn_id", *CHANGE_KEYS)
    return pl.concat(
        [
            turns.join(steps, on="turn_id", how="semi").select(CHANGE_KEYS),
            turns.join(trajectories, on="trajectory_id", how="semi").select(CHANGE_KEYS),
        ]
    )


class Standing(NamedTuple):
    """The retirements a preview plans with."""

    retired: pl.LazyFrame | None
    """The retired steps that still stand (None: none)."""
    open_since: datetime | None
    """Where the plan may start reading: a start time (None: everything)."""


def standing_retirements(lake: Lake, state: LakeState, recipe: Recipe) -> Standing:
    """The recipe's retired steps that still stand for a plan over ``state``, and where that plan
    may start reading; (None, None) plans over everything.

    The batch asset decided them at a curated_steps version. Since then rows may have changed in
    the curated change feed, in `scored_steps` rows curated_steps has not read yet, and in labels
    it has not applied yet (this page applies them first): a retirement of a trajectory or group
    with such a row is void, and the start is lowered to it, as the batch asset's next plan does.
    """
    table = lake.open(retired_table(recipe.name))
    curated = lake.open("curated_steps")
    through = None if table is None or curated is None else current_through(table, recipe)
    if through is None:
        return Standing(None, None)
    scored = lake.open("scored_steps")
    feeds = [
        changes(curated, through, curated.version(), CHANGE_KEYS),
        changes(
            scored,
            curated.transaction_version(watermark_app("curated_steps", "scored_steps")),
            state.versions["scored_steps"],
            CHANGE_KEYS,
        ),
        _labelled(state, curated.transaction_version(watermark_app("curated_steps", "labels"))),
    ]
    changed = pl.concat([f.select(CHANGE_KEYS) for f in feeds if f is not None])
    retired = pl.scan_delta(table)
    void = voided(retired, changed)
    standing = retired.join(void.to_frame().lazy(), on="trajectory_id", how="anti")
    since = lowered(recorded_open_since(table), changed, void, pl.scan_delta(curated))
    return Standing(standing, since)


@dataclass(frozen=True)
class Preview:
    recipe: Recipe
    dagster_url: str
    plan: BatchPlan | None
    groups: pl.DataFrame
    dropped: pl.DataFrame
    why_empty: str | None
    planned_at: datetime


def outcomes(rows: pl.DataFrame, consumed: pl.DataFrame) -> pl.DataFrame:
    """(group_id, trajectory_id, steps, r): one row per planned trajectory with its outcome.

    A DPO plan has one row per preference pair: its chosen and its rejected side each count as
    a one-step rollout of the pair's group (the rejected trajectory from ``consumed``, the
    plan's (turn_id, trajectory_id) of every step it uses).
    """
    if "chosen_reward" in rows.columns:
        rejected_trajectory = consumed.select(
            pl.col("turn_id").alias("rejected_turn_id"),
            pl.col("trajectory_id").alias("rejected_trajectory_id"),
        )
        pairs = rows.join(rejected_trajectory, on="rejected_turn_id", how="left")
        return pl.concat(
            [
                pairs.select("group_id", trajectory, steps=pl.lit(1, pl.UInt32), r=reward)
                for trajectory, reward in (
                    ("trajectory_id", "chosen_reward"),
                    (pl.col("rejected_trajectory_id").alias("trajectory_id"), "rejected_reward"),
                )
            ]
        )
    outcome = pl.col("reward")
    if "outcome_reward" in rows.columns:
        outcome = pl.coalesce("outcome_reward", "reward")
    return rows.group_by("group_id", "trajectory_id").agg(
        pl.len().alias("steps"), outcome.first().alias("r")
    )


def group_table(rows: pl.DataFrame, consumed: pl.DataFrame) -> pl.DataFrame:
    """Per group in the plan: rollouts, steps and the spread of trajectory rewards."""
    return (
        outcomes(rows, consumed)
        .group_by("group_id")
        .agg(
            pl.col("trajectory_id").n_unique().alias("rollouts"),
            pl.col("steps").sum(),
            pl.col("r").min().alias("reward_min"),
            pl.col("r").max().alias("reward_max"),
            pl.col("r").mean().alias("reward_mean"),
            pl.col("r").std(ddof=0).alias("reward_std"),
            pl.col("trajectory_id").unique().sort(),
        )
        .sort("group_id")
    )


def dropped_table(dropped: pl.DataFrame) -> pl.DataFrame:
    """Why steps were left out, with counts and a few examples."""
    return (
        dropped.group_by("reason")
        .agg(
            pl.len().alias("steps"),
            pl.col("trajectory_id").n_unique().alias("trajectories"),
            pl.col("trajectory_id").unique().sort().head(5).alias("examples"),
        )
        .sort("steps", descending=True)
    )


def _empty_preview(recipe: Recipe, why: str) -> Preview:
    return Preview(
        recipe,
        dagster_asset_url(recipe.name),
        None,
        pl.DataFrame(),
        pl.DataFrame(),
        why,
        datetime.now(UTC),
    )


def preview(lake: Lake, state: LakeState, recipe: Recipe) -> Preview:
    """Plan over the table versions ``state`` has seen, so the plan matches the rest of the page."""
    if not state.has("scored_steps"):
        return _empty_preview(
            recipe,
            "no scored_steps table yet: Dagster has not materialized the pipeline "
            "(run `claw up`, or `dagster dev -w workspace.yaml`)",
        )
    labels = state["labels"].drop("_commit_version")
    ledger = ledger_table(recipe.name)
    retired, open_since = standing_retirements(lake, state, recipe)
    scored = lake.open("scored_steps", state.versions["scored_steps"])
    ledger_version = state.versions[ledger] if state.has(ledger) else None
    batch_id = None if ledger_version is None else next_batch_id(lake, recipe.name, ledger_version)
    plan = plan_batch(
        recipe,
        curate_steps(pl.scan_delta(scored), labels if labels.height else None),
        lake.scan("turns"),
        None if ledger_version is None else lake.scan(ledger, ledger_version),
        datetime.now(UTC),
        retired=retired,
        open_since=open_since,
        batch_id=batch_id,
        latest_policy_version=lag_reference(highest_announced_version(lake), scored),
    )
    dropped = plan.dropped
    if retired is not None:  # dropped by earlier plans for good: listed, not planned again
        dropped = pl.concat([dropped, retired.select(dropped.columns).collect()])
    why = None
    if plan.planned.is_empty():
        why = "no complete, rewarded groups left that pass the recipe's filters"
    return Preview(
        recipe,
        dagster_asset_url(recipe.name),
        plan,
        group_table(plan.planned, plan.consumed) if plan.planned.height else pl.DataFrame(),
        dropped_table(dropped) if dropped.height else pl.DataFrame(),
        why,
        datetime.now(UTC),
    )


class PreviewCache:
    """Plans keyed by the versions they were computed from.

    A plan with groups waiting for stragglers also depends on the clock (the straggler timeout
    emits or drops them), so it is replanned once it is ``WAITING_REPLAN_S`` old.
    """

    INPUTS = ("scored_steps", "labels")
    WAITING_REPLAN_S = 5.0

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._lock = threading.Lock()
        self._plans: dict[str, tuple[tuple, Preview]] = {}

    def get(self, state: LakeState, recipe: Recipe) -> Preview:
        key = (
            *(state.versions.get(t) for t in self.INPUTS),
            state.versions.get(ledger_table(recipe.name)),
            recipe.model_dump_json(),
        )
        with self._lock:
            cached = self._plans.get(recipe.name)
            if cached is not None and cached[0] == key and not self._timed(cached[1]):
                return cached[1]
            result = preview(self.lake, state, recipe)
            self._plans[recipe.name] = (key, result)
            return result

    def _timed(self, preview: Preview) -> bool:
        """Whether the plan waits for a straggler timeout and is older than the replan period."""
        waiting = (
            preview.plan is not None
            and (preview.plan.dropped.get_column("reason") == "waiting_for_group").any()
        )
        age = (datetime.now(UTC) - preview.planned_at).total_seconds()
        return waiting and age >= self.WAITING_REPLAN_S

    def cached(self, recipe: str) -> Preview | None:
        entry = self._plans.get(recipe)
        return None if entry is None else entry[1]
