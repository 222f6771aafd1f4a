"""``steps_tails``: the closed tails of emitted trajectories, as a log the steps asset appends to.

A late turn of a closed trajectory needs that trajectory's tail (its last emitted step and the
turn ids already emitted), so tails are kept for the reopen window. Kept in the overwritten
``steps_open`` state, every run rewrote every tail of the window (a day of trajectories); in
this log a run appends only the tails it changed and reads only the ones it touches, so its
cost follows its new data. A trajectory that reopened has several rows; the one with the
highest ``step_index`` is current.

Crash safety without time travel: each row carries the ``run`` number of the steps run that
wrote it, and a run starts by deleting rows of its own number or higher, left by an attempt
that died before its steps commit. Expired rows are deleted (in bulk, see ``expire``) and small
files compacted at the end of a run that committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from assets.incremental import COMPACT_AFTER_FILES, WRITER
from claw_pipelines.derived_schemas import CLOSED_TAILS, conform, fit
from claw_pipelines.lake import Lake, compact

TABLE = "steps_tails"

EXPIRY_SLACK = 0.25
"""How far (in windows) the oldest tail may be past the reopen window before expired tails are
deleted: rewrites of the oldest file happen about once per quarter window, not every run."""


@dataclass(frozen=True)
class ClosedTails:
    lake: Lake
    run: int
    """The steps run appending: its rows carry this number."""

    @classmethod
    def for_run(cls, lake: Lake, run: int) -> ClosedTails:
        """The log as the steps run ``run`` may read it: rows of its failed attempts deleted."""
        table = lake.open(TABLE)
        if table is not None:
            table.delete(f"run >= {run}")
        return cls(lake, run)

    def scan(self) -> pl.LazyFrame | None:
        """Every tail row (several per reopened trajectory); None before the first."""
        return self.lake.scan(TABLE)

    def append(self, tails: pl.DataFrame | pl.LazyFrame) -> None:
        """Append ``tails`` (rows with ``derived_schemas.TAIL_COLUMNS``), streamed."""
        target = self.lake.ensure(TABLE, CLOSED_TAILS)
        frames = fit(tails.lazy().with_columns(run=pl.lit(self.run)), CLOSED_TAILS)
        batches = (
            b
            for frame in frames.collect_batches()
            for b in conform(frame, CLOSED_TAILS).to_batches()
        )
        write_deltalake(
            target,
            pa.RecordBatchReader.from_batches(CLOSED_TAILS, batches),
            mode="append",
            writer_properties=WRITER,
        )

    def expire(self, now: datetime, window: timedelta) -> None:
        """Delete the tails closed before the reopen ``window``, compact a log of many small
        files, and drop the files these left behind.

        A delete rewrites every file holding an expired row, and a compacted file spans many
        runs' tails, so expiring at every run would rewrite the oldest file each time. Expired
        rows are deleted only once the oldest is ``EXPIRY_SLACK`` of a window past the cutoff
        (readers skip them until then: ``extract_steps`` filters by window)."""
        table = self.lake.open(TABLE)
        if table is None:
            return
        cutoff = now - window
        oldest = _oldest_closed_at(table)
        if oldest is not None and oldest < cutoff - window * EXPIRY_SLACK:
            table.delete(f"closed_at < '{cutoff.isoformat()}'")
        compact(table, max_files=COMPACT_AFTER_FILES, writer_properties=WRITER)
        self.lake.drop_removed_files(TABLE)


def _oldest_closed_at(table: DeltaTable) -> datetime | None:
    """The earliest ``closed_at`` in the log, from the files' statistics (no data read)."""
    files = pl.DataFrame(table.get_add_actions(flatten=True))
    if files.is_empty():
        return None
    return files.get_column("min.closed_at").min()
