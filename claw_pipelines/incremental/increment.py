"""Watermarks and idempotent commits for the incremental assets.

An asset's watermark is kept in its own output table, not in Dagster: every commit carries one
Delta app transaction per input, ``claw/<asset>/<input>`` = the input's Delta version read up to.
Rows and watermark land in the same atomic commit, so:

* a re-run reads only versions after the watermark and can never re-append what it committed;
* a run that crashed after committing (before Dagster recorded it) is not replayed;
* two runs of the same asset racing from the same snapshot collide on the app id and delta-rs
  rejects the second commit (``Concurrent transaction failed``) instead of duplicating rows,
  and the losing step is retried (``ConcurrentRun``, ``assets.races``), reading on from the
  winner's.

Every such commit also carries ``claw/<asset>/run``, the number of runs that committed: a run
that read nothing new (a sweep closing idle trajectories) commits the same input versions as
the run before it, so only the run number tells the two apart. Each run also has an attempt
id of its own (two racing runs share a run number, not this): ``claw/<asset>/attempt`` on the
commit that moves the watermark tells which attempt made it, and ``claw/<asset>/writer`` on
every commit, the chunks of a backlog included, makes a run's commits collide with any other
run's that landed since its snapshot.

Carried-over state (e.g. the steps of trajectories still open) lives in a side table that is
overwritten *before* the output commit with the same transactions; after a crash between the
two commits, or a run that lost a race, the state table is ahead of the output, and
``state_as_of`` time-travels back to the state written by the attempt that made the output's
last commit.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable

from claw_pipelines.derived_schemas import WRITER, conform
from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import changes
from claw_pipelines.lake.commits import (
    COMPACT_AFTER_FILES,
    ConcurrentRun,
    commit,
    drop_removed_files,
    keep_configured,
    watermark_app,
)
from claw_pipelines.lake.filters import sql_in, within_keys
from claw_pipelines.schemas import empty

CHUNK_TRAJECTORIES = 32_768
"""Trajectories recomputed per commit by ``Increment.recompute``. The step tables hold no token
lists or messages (they point at their turns), so a chunk of a first build takes tens of MiB;
each chunk costs a scan of the input and a commit (~60 ms together), which at 8,192 per chunk
was a second of a 100k-step build."""

SAMPLE_ROWS = 5

STATE_LOOKBACK = 200
"""How many state-table commits to look back through for the one the output's last commit
matches: each attempt that died or lost a race between its state and output commits adds one."""


ATTEMPT_RANDOM_BITS = 24
"""An attempt id is its run number followed by this many random bits: ids grow run after run,
and two attempts of one run (a race, a retry) differ."""


@dataclass
class Written:
    """What ``Increment.recompute`` wrote: the table after it, the first rows (for a sample)
    and the summary columns of every row (for distributions)."""

    table: DeltaTable | None
    head: pl.DataFrame
    summaries: list[pl.DataFrame]

    @property
    def summary(self) -> pl.DataFrame:
        return pl.concat(self.summaries, how="vertical_relaxed")


def _runs(table: DeltaTable | None, asset: str) -> int:
    """How many runs of ``asset`` committed to ``table`` (0 before any)."""
    return 0 if table is None else table.transaction_version(watermark_app(asset, "run")) or 0


def _attempt_of(table: DeltaTable | None, asset: str, app: str = "attempt") -> int | None:
    """The attempt that made ``table``'s last watermark commit of ``asset`` (``app="writer"``:
    its last commit); None before any."""
    return None if table is None else table.transaction_version(watermark_app(asset, app))


def _watermark(table: DeltaTable | None, asset: str, sources: list[str]) -> dict[str, int | None]:
    if table is None:
        return dict.fromkeys(sources)
    return {s: table.transaction_version(watermark_app(asset, s)) for s in sources}


@dataclass
class Increment:
    """One run's view of its inputs: per input the Delta version range ``(after, upto]``."""

    lake: Lake
    asset: str
    output: str
    snapshot: DeltaTable | None
    after: dict[str, int | None]
    upto: dict[str, int | None]
    inputs: dict[str, DeltaTable | None] = field(default_factory=dict)
    """Each input opened once, at the version pinned in ``upto``: every read of the run uses it."""
    rows_read: dict[str, int] = field(default_factory=dict)
    states_read: dict[str, int] = field(default_factory=dict)
    """The version of each state table this run read (``state_as_of``): the run's vacuum keeps
    it, as a run started before this one committed may be reading it still."""
    states_written: dict[str, DeltaTable] = field(default_factory=dict)
    """Each state table as this run wrote it (``replace_state``)."""
    attempt: int = field(init=False)
    """This run's attempt id, carried by each of its commits (see ``ATTEMPT_RANDOM_BITS``)."""
    _chunks_written: int = 0

    def __post_init__(self) -> None:
        self.attempt = self.run << ATTEMPT_RANDOM_BITS | secrets.randbits(ATTEMPT_RANDOM_BITS)

    @property
    def run(self) -> int:
        """This run's number: one more than the runs that committed to the output so far."""
        return _runs(self.snapshot, self.asset) + 1

    @property
    def committed_attempt(self) -> int | None:
        """The attempt that made the output's last watermark commit (None before the first)."""
        return _attempt_of(self.snapshot, self.asset)

    @classmethod
    def begin(cls, lake: Lake, asset: str, output: str, sources: list[str]) -> Increment:
        """Pin the watermark (from the output table) and each input's current version."""
        snapshot = lake.open(output)
        inputs = {s: lake.open(s) for s in sources}
        return cls(
            lake=lake,
            asset=asset,
            output=output,
            snapshot=snapshot,
            after=_watermark(snapshot, asset, sources),
            upto={s: None if t is None else t.version() for s, t in inputs.items()},
            inputs=inputs,
        )

    @property
    def has_new_data(self) -> bool:
        return any(
            upto is not None and (self.after[s] is None or upto > self.after[s])
            for s, upto in self.upto.items()
        )

    def new_rows(
        self,
        source: str,
        columns: list[str] | None = None,
        *,
        with_version: bool = False,
        versions: tuple[int | None, int | None] | None = None,
    ) -> pl.DataFrame | None:
        """``lake.changes`` of ``source`` over this run's range: the rows inserted (None when
        none), ``with_version`` with the ``_commit_version`` each landed in. ``versions`` =
        ``(after, upto]`` reads a part of the range (not counted in ``rows_read``, which counts
        the whole range).
        """
        after, upto = versions or (self.after[source], self.upto[source])
        if upto is None:
            return None
        frame = changes(self.inputs[source], after, upto, columns, with_version=with_version)
        if frame is not None and versions is None:
            self.rows_read[source] = frame.height
        return frame

    def scan(self, source: str) -> pl.LazyFrame | None:
        """The whole input as of the version this run pinned."""
        pinned = self.inputs[source]
        return None if pinned is None else pl.scan_delta(pinned)

    def rows_where(
        self, source: str, column: str, keys: pl.Series, columns: list[str] | None = None
    ) -> pl.DataFrame | None:
        """Every row of ``source`` (as of the pinned version) whose ``column`` is in ``keys``
        (only ``columns`` when given: a projection skips the other column chunks unread).

        The keys' bounds go into the scan (``lake.within_keys``); the rows read are then kept by
        a mask of the keys, or taken as read when the keys are all of them (a first build, a
        refresh of the newest trajectories). ``lake.keyed``'s semi join gathers every column of
        the rows it keeps instead, which for a chunk of a first build (100k keys) took about
        twice as long."""
        frame = self.scan(source)
        if frame is None:
            return None
        if columns is not None:
            frame = frame.select(columns)
        rows = frame.filter(within_keys(column, keys)).collect()
        kept = rows.get_column(column).is_in(keys.implode())
        return rows if kept.all() else rows.filter(kept)

    def _apps(self, watermark: bool = True) -> dict[str, int]:
        """The writer; with ``watermark`` also the input versions, run number and attempt."""
        writer = {watermark_app(self.asset, "writer"): self.attempt}
        if not watermark:
            return writer
        committed = {**self.upto, "run": self.run, "attempt": self.attempt}
        return writer | {
            watermark_app(self.asset, name): version
            for name, version in committed.items()
            if version is not None
        }

    def _properties(self, watermark: bool = True) -> CommitProperties:
        return self.lake.commit_properties(
            self._apps(watermark),
            {
                "claw.asset": self.asset,
                "claw.attempt": str(self.attempt),
                "claw.read": json.dumps(self.ranges()),
            },
        )

    def _target(self, schema: pa.Schema) -> DeltaTable:
        """The table to commit against, so that a commit of another run since this run's
        snapshot (or its own last chunk) conflicts: the snapshot the watermark was read from (the
        table as created, if this run created it); after this run's own chunk commits, the
        latest table, provided no other run has committed since."""
        if not self._chunks_written:
            if self.snapshot is not None:
                return self.snapshot
            return self.lake.as_created(self.output, schema)
        latest = self.lake.open(self.output)
        if _attempt_of(latest, self.asset, "writer") != self.attempt:
            raise ConcurrentRun(f"another run of {self.asset} committed to {self.output}")
        return latest

    def commit(
        self,
        data: pa.Table,
        replace: tuple[str, list[str]] | None = None,
        *,
        watermark: bool = True,
    ) -> DeltaTable:
        """Write this run's rows and advance the watermark in one commit (even with 0 rows).

        ``replace=(column, keys)`` first removes the rows whose ``column`` is in ``keys`` (same
        commit): recomputed trajectories replace their old rows instead of duplicating them. A
        table this run created holds only this run's chunks, whose keys are disjoint: appended,
        so a first build does not rescan its earlier chunks per commit.
        A run that read nothing new writes nothing (no empty versions from periodic sweeps),
        unless the table ``predates`` a column of ``data``: commits merge the schema.
        ``watermark=False`` writes a chunk of the run without moving the watermark.
        """
        if (
            self.snapshot is not None
            and not self.has_new_data
            and data.num_rows == 0
            and not self.predates(data.schema)
        ):
            return self.snapshot
        target = self._target(data.schema)
        replacing = self.snapshot is not None and replace is not None and bool(replace[1])
        commit(
            target,
            data,
            mode="overwrite" if replacing else "append",
            predicate=sql_in(*replace) if replacing else None,
            schema_mode="merge",
            properties=self._properties(watermark),
            writer_properties=WRITER,
            compact_after=COMPACT_AFTER_FILES if watermark else None,
            refused=f"another run of {self.asset} committed to {self.output} while this one ran",
        )
        self._chunks_written += not watermark
        if watermark:
            keep_configured(target, self.lake.commit_properties())
        return target

    def predates(self, schema: pa.Schema) -> bool:
        """The output table lacks columns ``schema`` declares (added since it was written): a
        run then commits even with nothing new, and the commit's schema merge adds them, null in
        the older rows (older versions stay as they were), so the table checks as declared."""
        if self.snapshot is None:
            return False
        return not set(schema.names) <= {f.name for f in self.snapshot.schema().fields}

    def recompute(
        self,
        affected: pl.Series,
        build: Callable[[pl.Series], pl.DataFrame],
        schema: pa.Schema,
        summary: list[str],
    ) -> Written:
        """Rebuild the rows of the ``affected`` trajectories, ``CHUNK_TRAJECTORIES`` per commit.

        Each commit replaces its trajectories' rows, and only the last one moves the watermark:
        after a crash part-way the next run recomputes all of them, which replacing makes
        harmless. Memory is bounded by a chunk, not by the backlog (e.g. a first build).
        A chunk is written as one record batch: delta-rs may write a table's batches in
        another order than given (seen with the four batches of a chunk read from four row
        groups), and the rows should land in the order the transform made them.
        """
        starts = range(0, affected.len(), CHUNK_TRAJECTORIES)
        chunks = [affected.slice(start, CHUNK_TRAJECTORIES) for start in starts] or [affected]
        written = Written(None, empty(schema).head(0), [])
        for index, keys in enumerate(chunks):
            rows = build(keys) if keys.len() else empty(schema)
            final = index == len(chunks) - 1
            data = conform(rows, schema).combine_chunks()
            replace = ("trajectory_id", keys.to_list())
            written.table = self.commit(data, replace=replace, watermark=final)
            if written.head.is_empty():
                written.head = rows.head(SAMPLE_ROWS)
            written.summaries.append(rows.select(summary))
        return written

    def replace_state(self, state_table: str, state: pl.DataFrame, schema: pa.Schema) -> int:
        """Overwrite the carried-over state, tagged with this run's watermark; returns the
        state table's version holding it."""
        target = self.lake.ensure(state_table, schema)
        keep_configured(target, self.lake.commit_properties())
        version = commit(
            target,
            conform(state, schema),
            mode="overwrite",
            schema_mode="overwrite",
            properties=self._properties(),
            writer_properties=WRITER,
        )
        self.states_written[state_table] = target
        return version

    def drop_old_states(self, state_table: str) -> None:
        """Delete the files of ``state_table`` that neither the state this run wrote nor the one
        it read needs, through the table it wrote it with (nothing when it wrote none)."""
        written = self.states_written.get(state_table)
        if written is None:
            return
        kept = [v for v in (written.version(), self.states_read.get(state_table)) if v is not None]
        drop_removed_files(written, keep_versions=kept)

    def state_as_of(self, state_table: str) -> pl.LazyFrame | None:
        """The state written by the attempt that made the output's last commit (a scan, so a
        reader can take the rows and columns it needs): the latest version, or after attempts
        that wrote their state but not their output, an earlier one found in the history."""
        if all(v is None for v in self.after.values()):
            return None
        latest = self.lake.open(state_table)
        if latest is None:
            raise RuntimeError(f"{state_table} is missing but {self.output} has a watermark")
        version = self._state_version(state_table, latest)
        self.states_read[state_table] = version
        return (
            pl.scan_delta(latest)
            if version == latest.version()
            else self.lake.scan(state_table, version)
        )

    def _state_version(self, state_table: str, latest: DeltaTable) -> int:
        attempt = self.committed_attempt
        if _attempt_of(latest, self.asset) == attempt:
            return latest.version()
        for entry in latest.history(STATE_LOOKBACK):
            if entry.get("claw.attempt") == str(attempt):
                return entry["version"]
        raise RuntimeError(
            f"no version of {state_table} was written by the last commit of {self.output}"
        )

    def ranges(self) -> dict[str, list[int | None]]:
        """Per input ``[after, upto]``: the Delta version range this run read."""
        return {s: [self.after[s], self.upto[s]] for s in self.upto}


def trajectory_ids(*frames: pl.DataFrame | None) -> pl.Series:
    """The distinct trajectories present in any of ``frames``, in order: the keys a run
    recomputes. Sorted before deduplicated: new rows mostly come in order already, and a
    sorted column is checked, not sorted (100k ids: 6 ms against 20)."""
    ids = [f.get_column("trajectory_id") for f in frames if f is not None]
    if not ids:
        return pl.Series("trajectory_id", [], pl.String)
    return pl.concat(ids).drop_nulls().sort().unique(maintain_order=True)
