"""Retired steps: what a recipe's plans dropped for good, so later plans need not read it again.

``batch_retired/<recipe>`` holds the rows of each plan's ``final_drops``: a step under the
quality bar, a group whose rewards are all equal, a group that timed out short. Planning leaves
them out like consumed steps, so its work grows with the steps still in play, not with
everything ever dropped (zero-variance groups alone are often a large share of GRPO rollouts).

A retirement stands only while the data it was decided on does. The table is current through a
curated_steps version (app transaction ``claw/retired/<recipe fingerprint>``); every plan first
reads the curated change feed since then and voids the retirements of each group or trajectory
with a changed row (a late reward, a new label, a new group member). A changed recipe has a new
fingerprint, so it voids them all. Voids and retirements carry that transaction: a planner that
raced another one fails its commit instead of retiring from stale data, then plans without
retirements (always right, only slower) and retires nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

import dagster as dg
import polars as pl
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from assets.incremental import CHUNK_TRAJECTORIES, COMPACT_AFTER_FILES
from claw_pipelines.derived_schemas import RETIRED, conform
from claw_pipelines.lake import Lake, changes, compact, sql_in
from claw_pipelines.recipes import BatchPlan, Recipe, final_drops


def retired_table(recipe: str) -> str:
    return f"batch_retired/{recipe}"


def fingerprint(recipe: Recipe) -> str:
    """Everything in the recipe that decides final drops (batch size and exports do not)."""
    settings = recipe.model_dump_json(exclude={"exports", "groups_per_batch"})
    return hashlib.sha256(settings.encode()).hexdigest()[:16]


@dataclass
class Retirements:
    """A recipe's retirements as a plan at one curated_steps version may use them."""

    lake: Lake
    recipe: Recipe
    table: DeltaTable
    """The snapshot every commit of this plan goes through, so a racing planner's commit
    conflicts with it."""
    through: int | None
    """The curated_steps version the retirements are current through (None: none yet)."""
    usable: bool = True

    @property
    def app(self) -> str:
        return f"claw/retired/{fingerprint(self.recipe)}"

    @property
    def version(self) -> int:
        """The version to pin and plan from; -1 plans without retirements."""
        return self.table.version() if self.usable else -1

    @classmethod
    def current(cls, lake: Lake, recipe: Recipe, curated_version: int) -> Retirements:
        """The recipe's retirements with those that ``curated_version`` invalidated voided."""
        table = lake.ensure(retired_table(recipe.name), RETIRED)
        retirements = cls(lake, recipe, table, None)
        retirements.through = table.transaction_version(retirements.app)
        if retirements.through is not None and retirements.through > curated_version:
            retirements.usable = False  # decided on newer data than this plan's
            return retirements
        try:
            retirements._void(curated_version)
        except CommitFailedError as error:
            retirements._give_up("void", error)
        return retirements

    def _void(self, curated_version: int) -> None:
        if not self.table.file_uris():
            return
        if self.through is None:
            self._delete(None)
            return
        changed = changes(
            self.lake.open("curated_steps"),
            self.through,
            curated_version,
            ["trajectory_id", "group_id"],
        )
        if changed is None:
            return
        retired = pl.scan_delta(self.table).select("trajectory_id", "group_id")
        void = (
            pl.concat(
                [
                    retired.join(changed.lazy(), on="trajectory_id", how="semi"),
                    retired.join(
                        changed.lazy().select("group_id").drop_nulls(), on="group_id", how="semi"
                    ),
                ]
            )
            .select("trajectory_id")
            .unique()
            .sort("trajectory_id")
            .collect()
            .get_column("trajectory_id")
        )
        for start in range(0, void.len(), CHUNK_TRAJECTORIES):
            self._delete(sql_in("trajectory_id", void.slice(start, CHUNK_TRAJECTORIES)))

    def _delete(self, predicate: str | None) -> None:
        self.table.delete(predicate, commit_properties=self._commit(self.through))

    def _commit(self, through: int | None) -> CommitProperties:
        transactions = None if through is None else [Transaction(app_id=self.app, version=through)]
        return CommitProperties(
            max_commit_retries=self.lake.max_commit_retries, app_transactions=transactions
        )

    def _give_up(self, action: str, error: CommitFailedError) -> None:
        self.usable = False
        dg.get_dagster_logger().warning(
            "another planner changed %s first (%s); this plan %s no retirements",
            retired_table(self.recipe.name),
            error,
            "uses" if action == "void" else "records",
        )

    def scan(self) -> pl.LazyFrame | None:
        if not self.usable:
            return None
        return self.lake.scan(retired_table(self.recipe.name), self.version)

    def record(self, plan: BatchPlan, curated_version: int, now: datetime) -> None:
        """Retire the plan's final drops, now current through ``curated_version``."""
        if not self.usable:
            return
        rows = final_drops(self.recipe, plan.dropped).with_columns(retired_at=pl.lit(now))
        if rows.is_empty() and (self.through == curated_version or not self.table.file_uris()):
            return
        try:
            write_deltalake(
                self.table,
                conform(rows, RETIRED),
                mode="append",
                commit_properties=self._commit(curated_version),
            )
        except CommitFailedError as error:
            self._give_up("record", error)
            return
        compact(self.table, max_files=COMPACT_AFTER_FILES)
