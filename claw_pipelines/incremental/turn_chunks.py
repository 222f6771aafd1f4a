"""A backlog of new turns in chunks: the steps run extracts each as if it had run after each
chunk, so its memory follows a chunk, not the backlog (e.g. a first build)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import polars as pl

from claw_pipelines.derived_schemas import STEP_SOURCE_COLUMNS
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.lake.filters import keyed
from claw_pipelines.turn_prompts import PROMPT_REFERENCE

UNREAD = ("request_messages", "request_tools")
"""Request texts the extractor does not read with the chunk: the conversation so far on every
call, which rebuilt whole took as much memory as the prompts, while the extractor needs only
the first message of the few steps that edit their context (``threads.side_threads`` reads
those from ``turns``); the tools it needs not at all."""
_READ = [name for name in STEP_SOURCE_COLUMNS if name not in UNREAD]

CHUNK_TURNS = 16_384
"""New turns extracted per commit, so a backlog (e.g. a first build) needs memory for a chunk."""


@dataclass(frozen=True)
class TurnChunk:
    """The new turns one commit extracts: those landed in ``versions`` = ``(after, upto]``; or,
    when a first build finds every turn in one version (a landing table whose history was
    vacuumed reads as its snapshot, or one bulk commit), the turns of the listed
    ``trajectories`` only, and in the last chunk also the turns without identity, which
    trajectory inference must see together. Either way a chunk's memory is bounded, not the
    table's."""

    versions: tuple[int | None, int | None]
    trajectories: list[str] | None = None
    unidentified: bool = False

    def read(self, increment: Increment) -> pl.DataFrame | None:
        """The chunk's turns (``STEP_SOURCE_COLUMNS``, ``_commit_version`` and the
        ``PROMPT_REFERENCE`` columns ``turns`` has), their prompts as stored: whole prompts
        of a long session take its calls times its context, while the extractor settles most
        steps from the references (``transforms.steps``) and rebuilds only the few prompts it
        needs. The ``UNREAD`` texts are null."""
        landed = increment.scan("turns")
        available = [] if landed is None else landed.collect_schema().names()
        columns = [*_READ, *(name for name in PROMPT_REFERENCE if name in available)]
        if self.trajectories is None:
            turns = increment.new_rows("turns", columns, with_version=True, versions=self.versions)
        else:
            turns = self._trajectory_turns(landed.select(columns))
        if turns is None:
            return None
        unread = [pl.lit(None, pl.String).alias(name) for name in UNREAD]
        return turns.with_columns(unread).select(
            *STEP_SOURCE_COLUMNS, *columns[len(_READ) :], "_commit_version"
        )

    def _trajectory_turns(self, turns: pl.LazyFrame) -> pl.DataFrame:
        identified = keyed(turns, "trajectory_id", pl.Series(self.trajectories, dtype=pl.String))
        unidentified = turns.filter(pl.col("trajectory_id").is_null())
        return (
            pl.concat([identified, unidentified] if self.unidentified else [identified])
            .with_columns(pl.lit(self.versions[1], pl.UInt64).alias("_commit_version"))
            .collect()
        )


class TurnChunks(NamedTuple):
    chunks: list[TurnChunk]
    """At least one (it may read nothing)."""
    last_chunk: pl.DataFrame
    """Per trajectory with new turns, the index of the chunk of its last (``_range``)."""

    def events_by_chunk(self, events: pl.DataFrame | None) -> list[pl.DataFrame | None]:
        """Per chunk, the events of the trajectories whose last new turn is in it; events of
        trajectories without new turns go with the first chunk. One join for all chunks (a
        join per chunk took ~25 ms each for 100k events)."""
        if events is None:
            return [None] * len(self.chunks)
        ranges = events.join(
            self.last_chunk.select("trajectory_id", "_range"),
            on="trajectory_id",
            how="left",
            maintain_order="left",
        )
        chunk = pl.col("_range").fill_null(0)
        return [ranges.filter(chunk == index).drop("_range") for index in range(len(self.chunks))]


def turn_chunks(increment: Increment) -> TurnChunks:
    """Chunks of about ``CHUNK_TURNS`` new turns (one when fewer): consecutive version ranges,
    or for a first build whose turns all share one version, groups of whole trajectories; and
    per trajectory with new turns the index of the chunk of its last."""
    light = increment.new_rows("turns", ["trajectory_id"], with_version=True)
    after, upto = increment.after["turns"], increment.upto["turns"]
    if light is None or light.height <= CHUNK_TURNS:
        last = _last_versions(light).with_columns(pl.lit(0, pl.Int64).alias("_range"))
        return TurnChunks([TurnChunk((after, upto))], last)
    if after is None and light.get_column("_commit_version").n_unique() == 1:
        return _trajectory_chunks(light, upto)
    rows = pl.col("len")
    ends = (
        light.group_by("_commit_version")
        .len()
        .sort("_commit_version")
        .group_by(((rows.cum_sum() - rows) // CHUNK_TURNS).alias("_chunk"))
        .agg(pl.col("_commit_version").max())
        .sort("_chunk")
        .get_column("_commit_version")
        .to_list()
    )
    bounds = [*ends[:-1], upto]
    chunks = [TurnChunk(v) for v in zip([after, *bounds[:-1]], bounds, strict=True)]
    last = _last_versions(light)
    ranges = pl.Series(ends[:-1], dtype=pl.UInt64).search_sorted(last["_commit_version"], "left")
    return TurnChunks(chunks, last.with_columns(ranges.cast(pl.Int64).alias("_range")))


def _last_versions(light: pl.DataFrame | None) -> pl.DataFrame:
    """Per trajectory, the version of its last new turn."""
    if light is None:
        return pl.DataFrame(schema={"trajectory_id": pl.String, "_commit_version": pl.UInt64})
    return (
        light.drop_nulls("trajectory_id")
        .group_by("trajectory_id")
        .agg(pl.col("_commit_version").max())
    )


def _trajectory_chunks(light: pl.DataFrame, upto: int | None) -> TurnChunks:
    """Whole trajectories (in id order, so a chunk's keyed read skips most files) in chunks of
    about ``CHUNK_TURNS`` turns; the turns without identity go with the last."""
    turns = pl.col("len")
    per_trajectory = (
        light.drop_nulls("trajectory_id")
        .group_by("trajectory_id")
        .len()
        .sort("trajectory_id")
        .with_columns(((turns.cum_sum() - turns) // CHUNK_TURNS).cast(pl.Int64).alias("_range"))
    )
    members = per_trajectory.group_by("_range", maintain_order=True).agg("trajectory_id")
    chunks = [
        TurnChunk((None, upto), trajectories=ids)
        for ids in members.get_column("trajectory_id").to_list()
    ] or [TurnChunk((None, upto), trajectories=[])]
    chunks[-1] = replace(chunks[-1], unidentified=True)
    return TurnChunks(chunks, per_trajectory.select("trajectory_id", "_range"))
