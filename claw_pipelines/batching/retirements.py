"""Retired steps: what a recipe's plans dropped for good, so later plans need not read it again.

``batch_retired/<recipe>`` holds the rows of each plan's ``final_drops``: a step under the
quality bar, a group whose rewards are all equal, a group that timed out short. Planning leaves
them out like consumed steps, so its work grows with the steps still in play, not with
everything ever dropped (zero-variance groups alone are often a large share of GRPO rollouts).

A retirement stands only while the data it was decided on does. The table is current through a
curated_steps version (app transaction ``claw/retired/<recipe>``); every plan first reads the
curated change feed since then and voids the retirements of each group or trajectory with a
changed row (a late reward, a new label, a new group member). A changed recipe has a new
fingerprint (``claw/retired/recipe``), so it voids them all. Voids and retirements carry the
through transaction: a planner that raced another one fails its commit instead of retiring
from stale data, then plans without retirements (always right, only slower) and retires
nothing.

Each retirement commit also records where the next plan may start reading (``claw.open_since``,
the plan's ``open_since_next``, a start time): every step started before it belongs to a
trajectory consumed or retired, so planning reads the curated table's recent end only, whatever
the trajectory ids look like. A trajectory changed since (a late step, a late reward, one that
ran long) or voided lowers it again to its earliest step. The inspector's batch preview plans
with the retirements that still stand (``current_through``, ``voided``, ``lowered``) the same
way.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime

import polars as pl
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

from claw_pipelines.batches.names import retired_table
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.planner import BatchPlan
from claw_pipelines.derived_schemas import RETIRED, conform
from claw_pipelines.incremental.increment import CHUNK_TRAJECTORIES
from claw_pipelines.lake import Lake, commits
from claw_pipelines.lake.changes import changes
from claw_pipelines.lake.filters import floor_ms, keyed, sql_in
from claw_pipelines.lake.properties import SETTLED_FILE_BYTES

LOG = logging.getLogger(__name__)

RECIPE_APP = "claw/retired/recipe"
"""App transaction naming the recipe the retirements were decided under (its fingerprint as a
number): a table last written under another recipe (even an earlier one edited back) is voided."""
OPEN_SINCE = "claw.open_since"
"""Commit metadata of every retirement commit: the start time (ISO) the next plan may read from
("" for the beginning). Commits made before it carry ``claw.open_from``, a trajectory id, which
is ignored: that plan reads everything once, which is always right."""
HISTORY_SEARCHED = 20
"""Commits searched back for the last ``claw.open_since`` (past voids and compactions); when
none is found the next plan reads the tables whole, which is always right."""
CHANGE_COLUMNS = ["trajectory_id", "group_id", "started_at"]
"""What the curated change feed is read for: the changed trajectories, their groups, and how
far back their steps started (a trajectory's rows are rewritten together)."""


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


def recorded_open_since(table: DeltaTable) -> datetime | None:
    """``claw.open_since`` as the last plan recorded it (None: read everything)."""
    for commit in table.history(HISTORY_SEARCHED):
        if OPEN_SINCE in commit:
            return datetime.fromisoformat(commit[OPEN_SINCE]) if commit[OPEN_SINCE] else None
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


def lowered(
    open_since: datetime | None,
    changed: pl.DataFrame,
    void: pl.Series,
    curated: pl.LazyFrame,
) -> datetime | None:
    """``open_since`` lowered to the earliest step of every changed trajectory (``changed``
    holds each one's rows, with ``started_at``) and of every voided one (looked up in
    ``curated``, only when there are any), to the millisecond (None stays: read all)."""
    if open_since is None:
        return None
    starts = [open_since, changed.get_column("started_at").min()]
    if void.len():
        rows = keyed(curated.select("trajectory_id", "started_at"), "trajectory_id", void)
        starts.append(rows.select(pl.col("started_at").min()).collect().item())
    return floor_ms(min(start for start in starts if start is not None))


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
    recorded_open_since: datetime | None = None
    """``claw.open_since`` as the last plan recorded it."""
    open_since: datetime | None = None
    """Where this plan may start reading: the recorded start, lowered to every trajectory
    changed or voided since (None: read everything)."""
    usable: bool = True

    @property
    def version(self) -> int:
        """The version to pin and plan from; -1 plans without retirements."""
        return self.table.version() if self.usable else -1

    @classmethod
    def current(cls, lake: Lake, recipe: Recipe, curated: DeltaTable) -> Retirements:
        """The recipe's retirements with those that ``curated`` (curated_steps at the plan's
        version) invalidated voided."""
        table = lake.ensure(retired_table(recipe.name), RETIRED)
        retirements = cls(lake, recipe, table, current_through(table, recipe))
        if retirements.through is not None and retirements.through > curated.version():
            retirements.usable = False  # decided on newer data than this plan's
            return retirements
        try:
            retirements._void(curated)
        except CommitFailedError as error:
            retirements._give_up("void", error)
        return retirements

    def _void(self, curated: DeltaTable) -> None:
        """Void what changed since ``through`` up to ``curated``'s version and lower
        ``open_since`` to it."""
        if self.through is None:
            if self.table.file_uris():
                self._delete(None)
            return
        self.recorded_open_since = recorded_open_since(self.table)
        self.open_since = self.recorded_open_since
        changed = changes(curated, self.through, curated.version(), CHANGE_COLUMNS)
        if changed is None:
            return
        void = voided(pl.scan_delta(self.table), changed)
        for start in range(0, void.len(), CHUNK_TRAJECTORIES):
            self._delete(sql_in("trajectory_id", void.slice(start, CHUNK_TRAJECTORIES)))
        self.open_since = lowered(self.open_since, changed, void, pl.scan_delta(curated))

    def _delete(self, predicate: str | None) -> None:
        commits.delete(self.table, predicate, self._commit(self.through))

    def _commit(
        self, through: int | None, metadata: dict[str, str] | None = None
    ) -> CommitProperties:
        apps = None
        if through is not None:
            apps = {through_app(self.recipe.name): through, RECIPE_APP: fingerprint(self.recipe)}
        return self.lake.commit_properties(apps, metadata)

    def _give_up(self, action: str, error: CommitFailedError) -> None:
        self.usable = False
        self.open_since = None
        LOG.warning(
            "another planner changed %s first (%s); this plan %s no retirements",
            retired_table(self.recipe.name),
            error,
            "uses" if action == "void" else "records",
        )

    def record(self, plan: BatchPlan, curated_version: int, now: datetime) -> None:
        """Retire the plan's final drops, now current through ``curated_version``, and record
        where the next plan may start."""
        if not self.usable:
            return
        rows = plan.final.with_columns(retired_at=pl.lit(now))
        unchanged = self.through == curated_version and (
            plan.open_since_next == self.recorded_open_since
        )
        if rows.is_empty() and unchanged:
            return
        try:
            commits.commit(
                self.table,
                conform(rows, RETIRED),
                schema_mode="merge",  # a table from before a column gains it, null in older rows
                properties=self._commit(curated_version, {OPEN_SINCE: _iso(plan)}),
                compact_after=commits.COMPACT_AFTER_FILES,
                target_size=SETTLED_FILE_BYTES,
            )
        except CommitFailedError as error:
            self._give_up("record", error)


def _iso(plan: BatchPlan) -> str:
    """The plan's ``open_since_next`` as ``claw.open_since`` records it."""
    return "" if plan.open_since_next is None else plan.open_since_next.isoformat()
