"""The inspector's in-memory view of the lake, kept current from each table's change data feed.

Every request is served from this view (light columns only), so no request rescans a table; a
background refresh reads just the rows committed since the last version it saw and rebuilds the
summary rows of the trajectories those rows touched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import polars as pl

from claw_pipelines.batches.names import batches_table, ledger_table
from claw_pipelines.inspector.summary import (
    TURN_COLUMNS,
    summarize,
    trajectories_of,
    turn_index_rows,
    upsert,
)
from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import VersionsVacuumed, changes
from claw_pipelines.schemas import Label, Reward, TrajectoryEventRow, Turn

VERSION = pl.Int64
MAX_CHUNKS = 32
"""Appends add a chunk each; past this many, a frame is compacted once into one chunk."""


def _landing_schema(model: type, columns: list[str]) -> dict[str, pl.DataType]:
    empty = pl.DataFrame(model.arrow_schema().empty_table())
    return {name: empty.schema[name] for name in columns} | {"_commit_version": VERSION}


def conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Select ``schema``'s columns in its types; columns a producer does not write yet are null."""
    return frame.select(
        pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype).alias(name)
        for name, dtype in schema.items()
    )


@dataclass(frozen=True)
class Feed:
    """One table the inspector follows: the columns it keeps and how new rows are prepared."""

    table: str
    schema: dict[str, pl.DataType]
    key: list[str] | None = None
    """Derived tables re-emit rows when an asset recomputes them; the newest row per key wins."""
    prepare: Callable[[pl.DataFrame], pl.DataFrame] | None = None
    read_columns: list[str] | None = None

    def wanted(self) -> list[str]:
        return [c for c in (self.read_columns or list(self.schema)) if c != "_commit_version"]

    def empty(self) -> pl.DataFrame:
        return pl.DataFrame(schema=self.schema)

    def prepared(self, raw: pl.DataFrame) -> pl.DataFrame:
        return conform(self.prepare(raw) if self.prepare else raw, self.schema)

    def absorb(self, current: pl.DataFrame, fresh: pl.DataFrame) -> pl.DataFrame:
        """``current`` plus ``fresh`` without copying ``current`` (its chunks are reused);
        for keyed feeds a fresh row replaces the older row with the same key."""
        if self.key is not None:
            fresh = fresh.sort("_commit_version").unique(self.key, keep="last", maintain_order=True)
            current = current.join(fresh.select(self.key), on=self.key, how="anti")
        merged = pl.concat([current, fresh], how="vertical_relaxed", rechunk=False)
        return merged.rechunk() if merged.n_chunks() > MAX_CHUNKS else merged


_TURN_SCHEMA = turn_index_rows(
    pl.DataFrame(Turn.arrow_schema().empty_table())
    .select([c for c in TURN_COLUMNS if c != "_commit_version"])
    .with_columns(pl.lit(None, VERSION).alias("_commit_version"))
).schema

FEEDS: dict[str, Feed] = {
    "turns": Feed("turns", dict(_TURN_SCHEMA), prepare=turn_index_rows, read_columns=TURN_COLUMNS),
    "trajectory_events": Feed(
        "trajectory_events",
        _landing_schema(
            TrajectoryEventRow, ["trajectory_id", "group_id", "event", "reward", "created_at"]
        ),
    ),
    "rewards": Feed(
        "rewards",
        _landing_schema(
            Reward,
            [
                "reward_id",
                "turn_id",
                "trajectory_id",
                "group_id",
                "value",
                "name",
                "source",
                "created_at",
            ],
        ),
    ),
    "labels": Feed("labels", _landing_schema(Label, list(Label.model_fields))),
    "steps": Feed(
        "steps",
        {
            "turn_id": pl.String,
            "trajectory_id": pl.String,
            "step_index": pl.Int64,
            "prefix_consistent": pl.Boolean,
            "prefix_break_reason": pl.String,
            "shared_prefix_tokens": pl.Int64,
            "trajectory_inferred": pl.Boolean,
            "parent_trajectory_id": pl.String,
            "_commit_version": VERSION,
        },
        key=["turn_id"],
    ),
    "scored_steps": Feed(
        "scored_steps",
        {
            "turn_id": pl.String,
            "reward": pl.Float64,
            "quality_score": pl.Float64,
            "quality_reasons": pl.List(pl.String),
            "_commit_version": VERSION,
        },
        key=["turn_id"],
    ),
    "trajectories": Feed(
        "trajectories",
        {
            "trajectory_id": pl.String,
            "complete": pl.Boolean,
            "outcome": pl.String,
            "outcome_reward": pl.Float64,
            "_commit_version": VERSION,
        },
        key=["trajectory_id"],
    ),
}

BATCH_SCHEMA = {
    "batch_id": pl.String,
    "group_id": pl.String,
    "trajectory_id": pl.String,
    "turn_id": pl.String,
    "reward": pl.Float64,
    "_commit_version": VERSION,
}


def batch_feeds(recipes: list[str]) -> dict[str, Feed]:
    """The batch table and consumption ledger of each recipe (only ids are kept)."""
    feeds = {}
    for recipe in recipes:
        for table in (batches_table(recipe), ledger_table(recipe)):
            feeds[table] = Feed(table, BATCH_SCHEMA, key=["batch_id", "turn_id"])
    return feeds


@dataclass(frozen=True)
class LakeState:
    """An immutable snapshot: handlers read it without locks while a refresh builds the next one."""

    frames: dict[str, pl.DataFrame]
    versions: dict[str, int | None]
    summary: pl.DataFrame
    refreshed_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def has(self, table: str) -> bool:
        return self.versions.get(table) is not None

    def __getitem__(self, table: str) -> pl.DataFrame:
        return self.frames[table]


def _affected(new: dict[str, pl.DataFrame], turns: pl.DataFrame) -> pl.Series:
    """Trajectories whose summary row the new rows can change."""
    ids: list[pl.Series] = []
    if "turns" in new:
        ids.append(new["turns"].get_column("trajectory_id"))
    if "trajectory_events" in new:
        ids.append(new["trajectory_events"].get_column("trajectory_id"))
    if "trajectories" in new:
        ids.append(new["trajectories"].get_column("trajectory_id"))
    if "rewards" in new:
        rewards = new["rewards"]
        ids.append(rewards.get_column("trajectory_id").drop_nulls())
        ids.append(
            trajectories_of(
                turns, rewards["group_id"].drop_nulls(), rewards["turn_id"].drop_nulls()
            )
        )
    if "labels" in new:
        labels = new["labels"]
        ids.append(labels.filter(pl.col("target_kind") == "trajectory").get_column("target_id"))
        steps = labels.filter(pl.col("target_kind") == "step").get_column("target_id")
        ids.append(trajectories_of(turns, pl.Series([], dtype=pl.String), steps))
    if "scored_steps" in new:
        ids.append(
            trajectories_of(turns, pl.Series([], dtype=pl.String), new["scored_steps"]["turn_id"])
        )
    return (
        pl.concat([s.cast(pl.String) for s in ids]).unique()
        if ids
        else pl.Series([], dtype=pl.String)
    )


def adopt_placements(turns: pl.DataFrame, steps: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """Move turns into the trajectories step extraction placed them in: identity-less turns
    into their inferred trajectory, side calls into their side trajectory.

    Returns the updated turns and the trajectory ids (old and new) whose rows changed.
    """
    placed = steps.select("turn_id", pl.col("trajectory_id").alias("_placed"))
    moved = (
        turns.select("turn_id", "trajectory_id")
        .join(placed, on="turn_id")
        .filter(pl.col("trajectory_id") != pl.col("_placed"))
    )
    if moved.is_empty():
        return turns, pl.Series([], dtype=pl.String)
    updated = (
        turns.join(moved.select("turn_id", "_placed"), on="turn_id", how="left")
        .with_columns(pl.coalesce("_placed", "trajectory_id").alias("trajectory_id"))
        .drop("_placed")
    )
    changed = pl.concat([moved["trajectory_id"], moved["_placed"]]).unique()
    return updated, changed


SUMMARY_INPUTS = ["turns", "trajectory_events", "rewards", "labels", "scored_steps", "trajectories"]
"""The frames ``summarize`` takes, in its argument order."""


class LakeIndex:
    """Follows the lake's tables and keeps the latest ``LakeState``."""

    def __init__(self, lake: Lake, recipes: list[str]) -> None:
        self.lake = lake
        self.feeds = FEEDS | batch_feeds(recipes)
        self._lock = threading.Lock()
        self.state = self._unread()

    def _unread(self) -> LakeState:
        """The state before any table was read."""
        frames = {name: feed.empty() for name, feed in self.feeds.items()}
        return LakeState(
            frames,
            dict.fromkeys(self.feeds),
            summarize(*(frames[t] for t in SUMMARY_INPUTS)),
        )

    def _read(self, feed: Feed, after: int | None) -> tuple[pl.DataFrame | None, int | None]:
        table = self.lake.open(feed.table)
        if table is None or (after is not None and table.version() <= after):
            return None, after
        present = {f.name for f in table.schema().fields}
        columns = [c for c in feed.wanted() if c in present]
        latest = table.version()
        return changes(table, after, latest, columns, with_version=True), latest

    def refresh(self) -> LakeState:
        """Read what each table committed since the last refresh and publish a new state. An
        index that fell behind the log retention (the inspector idled, or was paused) reads
        every table again from its snapshot."""
        try:
            return self._refresh(from_scratch=False)
        except VersionsVacuumed:
            return self._refresh(from_scratch=True)

    def _refresh(self, *, from_scratch: bool) -> LakeState:
        with self._lock:
            state = self._unread() if from_scratch else self.state
            frames = dict(state.frames)
            versions = dict(state.versions)
            new: dict[str, pl.DataFrame] = {}
            for name, feed in self.feeds.items():
                raw, version = self._read(feed, versions[name])
                versions[name] = version
                if raw is not None and raw.height:
                    new[name] = feed.prepared(raw)
                    frames[name] = feed.absorb(frames[name], new[name])
            if not new and versions == state.versions:
                self.state = replace(state, refreshed_at=datetime.now(UTC))
                return self.state
            affected = _affected(new, frames["turns"])
            if "steps" in new:
                frames["turns"], moved = adopt_placements(frames["turns"], new["steps"])
                affected = pl.concat([affected, moved]).unique()
            summary = state.summary
            if affected.len():
                turns = frames["turns"].filter(pl.col("trajectory_id").is_in(affected.implode()))
                inputs = [turns, *(frames[t] for t in SUMMARY_INPUTS[1:])]
                summary = upsert(summary, summarize(*inputs), affected)
            self.state = replace(
                state,
                frames=frames,
                versions=versions,
                summary=summary,
                refreshed_at=datetime.now(UTC),
            )
            return self.state
