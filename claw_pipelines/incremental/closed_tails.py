"""``steps_tails``: the closed tails of emitted trajectories, as a log the steps asset appends to.

A late turn of a closed trajectory needs that trajectory's tail (its last emitted step and the
turn ids already emitted), so tails are kept for the reopen window. Kept in the overwritten
``steps_open`` state, every run rewrote every tail of the window (a day of trajectories); in
this log a run appends only the tails it changed and reads only the ones it touches, so its
cost follows its new data. A trajectory that reopened has several rows; the one with the
highest ``step_index`` is current.

A run appends its tails before its steps commit, so they count only once that commit has
landed. Each row carries the ``attempt`` id of the run that wrote it; readers take the rows of
attempts known to have committed (``state = committed`` rows name them, with the id negated so
that one integer column tells them from tails), of the attempt that made the steps table's last
commit, and their own. The rows of an attempt that died before its
commit, or whose commit lost a race to another run, are never read and leave with the window.
Before its own commit replaces the last one, a run records that last attempt (if it wrote
tails) in the same append as its own tails. Expired rows are deleted (in bulk, see ``expire``)
and small files compacted at the end of a run that committed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from claw_pipelines.derived_schemas import CLOSED_TAILS, OPEN_STATE, WRITER, conform, fit
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import (
    COMPACT_AFTER_FILES,
    commit,
    compact,
    delete,
    drop_removed_files,
    keep_configured,
)
from claw_pipelines.lake.filters import column_bound
from claw_pipelines.schemas import empty, utc_now

TABLE = "steps_tails"

EXPIRY_SLACK = 0.25
"""How far (in windows) the oldest tail may be past the reopen window before expired tails are
deleted: rewrites of the oldest file happen about once per quarter window, not every run."""


COMMITTED = "committed"
"""``state`` of a row recording that the attempt ``-attempt`` made a steps commit."""


@dataclass
class ClosedTails:
    lake: Lake
    run: int
    """The steps run appending: its rows carry this number."""
    attempt: int
    """The attempt appending: its rows carry this id."""
    counted: frozenset[int]
    """The attempts whose rows count: recorded as committed, the last committer, this one."""
    unrecorded: int | None = None
    """The attempt that made the steps table's last commit, when it wrote tails that no row
    records as committed yet: recorded by this run before its own commit."""
    table: DeltaTable | None = None
    """The log as this run last opened or wrote it (None while there is none), kept so the run
    opens it once rather than at each use: on an object store an open costs a dozen requests or
    more. One steps run at a time writes the log (the ``claw_steps`` pool)."""

    @classmethod
    def for_attempt(cls, lake: Lake, run: int, attempt: int, committed: int | None) -> ClosedTails:
        """The log as the attempt ``attempt`` of run ``run`` reads it, the steps table's last
        commit having been made by the attempt ``committed``."""
        table = lake.open(TABLE)
        if table is None:
            return cls(lake, run, attempt, frozenset({attempt}))
        ids = (
            fit(pl.scan_delta(table), CLOSED_TAILS)
            .select("attempt")
            .unique()
            .collect()
            .get_column("attempt")
        )
        recorded = set((-ids.filter(ids < 0)).to_list())
        unrecorded = committed if committed in set(ids) - recorded else None
        counted = frozenset({*recorded, attempt} | ({committed} - {None}))
        return cls(lake, run, attempt, counted, unrecorded, table)

    def scan(self) -> pl.LazyFrame | None:
        """Every tail row that counts (several per reopened trajectory), as this run last opened
        or wrote the log (so with its own appends); None while there is none. Collect it before
        the next ``append`` or ``expire``, which move the table it reads."""
        if self.table is None:
            return None
        counted = pl.col("attempt").is_in(list(self.counted))
        return fit(pl.scan_delta(self.table), CLOSED_TAILS).filter(counted)

    def append(self, tails: pl.DataFrame | pl.LazyFrame) -> None:
        """Append ``tails`` (rows with ``derived_schemas.TAIL_COLUMNS``), streamed, with the
        record of the last committer if it is still due."""
        target = self.table or self.lake.ensure(TABLE, CLOSED_TAILS)
        mine = tails.lazy().with_columns(run=pl.lit(self.run), attempt=pl.lit(self.attempt))
        frames = fit(pl.concat([mine, *self._due_record()], how="diagonal_relaxed"), CLOSED_TAILS)
        batches = (
            b
            for frame in frames.collect_batches()
            for b in conform(frame, CLOSED_TAILS).to_batches()
        )
        commit(
            target,
            pa.RecordBatchReader.from_batches(CLOSED_TAILS, batches),
            schema_mode="merge",
            writer_properties=WRITER,
        )
        self.table, self.unrecorded = target, None

    def record_committed(self) -> None:
        """Record the last committer before this run's commit takes its place (if still due)."""
        if self.unrecorded is not None:
            self.append(pl.DataFrame(schema={"state": pl.String}))

    def _due_record(self) -> list[pl.LazyFrame]:
        if self.unrecorded is None:
            return []
        return [
            pl.LazyFrame(
                {
                    "state": [COMMITTED],
                    "attempt": [-self.unrecorded],
                    "run": [self.run],
                    "closed_at": [utc_now()],
                }
            )
        ]

    def expire(self, now: datetime, window: timedelta) -> None:
        """Delete the tails closed before the reopen ``window``, compact a log of many small
        files, and drop the files these left behind.

        A delete rewrites every file holding an expired row, and a compacted file spans many
        runs' tails, so expiring at every run would rewrite the oldest file each time. Expired
        rows are deleted only once the oldest is ``EXPIRY_SLACK`` of a window past the cutoff
        (readers skip them until then: ``extract_steps`` filters by window). Like compaction,
        expiry only saves work later: a delete that another writer got ahead of is skipped."""
        table = self.table
        if table is None:
            return
        cutoff = now - window
        oldest = column_bound(table, "closed_at", "min")
        if oldest is not None and oldest < cutoff - window * EXPIRY_SLACK:
            with contextlib.suppress(CommitFailedError):
                delete(table, f"closed_at < '{cutoff.isoformat()}'")
        compact(table, max_files=COMPACT_AFTER_FILES, writer_properties=WRITER)
        keep_configured(table, self.lake.commit_properties())
        drop_removed_files(table)


def open_turns_of(state: pl.LazyFrame | None, tails: ClosedTails) -> pl.LazyFrame:
    """The open turns of ``steps_open``. Lakes from before ``steps_tails`` also kept the closed
    tails there: those move to the log (once, as the state this run writes has none)."""
    if state is None:
        return empty(OPEN_STATE).lazy()
    closed = state.filter(pl.col("state") == "closed")
    if closed.select(pl.len()).collect().item():
        tails.append(closed)
    return state.filter(pl.col("state") == "open")
