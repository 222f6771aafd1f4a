"""A lease in the lake: which one of many processes (proxy workers on many machines, a Dagster
run) may do a kind of work now: maintain the lake's tables, or commit a fleet's staged rows.

A lease is the one row of a small Delta table (``maintenance_lease``, ``commit_lease``): its
holder and until when it holds. Taking or renewing it is an overwrite of that row from the
snapshot it was read in, carrying the app transaction ``claw/maintenance/lease`` = one more than
the snapshot's. Two processes that read the same snapshot commit the same transaction version,
and delta-rs rejects the second commit (a concurrent transaction), on a local disk and on an
object store alike, as every Delta commit is a create-if-absent of its log entry
(``lake_store``). So at most one process takes a lease that is free or expired, and a holder
that finds it taken stops.

A holder renews before each step of its work and stops when it cannot, so it holds the lease
while it works as long as no step outlasts the lease; the expiry is compared with each
process's clock, so the machines' clocks must agree to well within the lease.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import commit
from claw_pipelines.lake.properties import TABLE_CONFIGURATION
from claw_pipelines.lake.tables import REOPEN_AFTER_S
from claw_pipelines.schemas import arrow_rows, utc_now

LEASE_TABLE = "maintenance_lease"
LEASE_APP = "claw/maintenance/lease"
COMMIT_LEASE_TABLE = "commit_lease"
"""The lease of the fleet's committer of staged spool segments (``spool.staging``)."""
LEASE_SCHEMA = pa.schema(
    [
        pa.field("holder", pa.string(), nullable=False),
        pa.field("expires_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
LEASE_CONFIGURATION = TABLE_CONFIGURATION | {"delta.logRetentionDuration": "interval 1 hours"}
"""Every take and renewal is a commit; the holder cleans up the lease table's own log and files
after an hour (``maintenance.maintain_lake``)."""


@dataclass(frozen=True)
class Holding:
    """Who holds the lease and until when, as one snapshot of the lease table says."""

    holder: str | None
    expires_at: datetime | None

    def free_for(self, holder: str, now: datetime) -> bool:
        return self.holder in (None, holder) or self.expires_at is None or self.expires_at <= now


@dataclass
class Lease:
    """The maintenance lease as ``holder`` asks for it, for ``duration_s`` at a time."""

    lake: Lake
    holder: str
    duration_s: float
    name: str = LEASE_TABLE
    """The lease's table: one per kind of work (maintenance, ``COMMIT_LEASE_TABLE``)."""

    seen: Holding | None = field(default=None, init=False)
    """The lease as this process last read it."""
    _handle: DeltaTable | None = field(default=None, init=False, repr=False)
    _opened_at: float = field(default=0.0, init=False, repr=False)
    _read_at: int | None = field(default=None, init=False, repr=False)
    """The table version ``seen`` was read at."""

    def table(self) -> DeltaTable:
        """The lease table, up to date. One handle reads on from the version it last saw (on
        an object store a GET or two, where an open lists the log and reads the checkpoint and
        the entries after it), re-opened once ``REOPEN_AFTER_S`` old like a table writer's."""
        if self._handle is not None and time.monotonic() - self._opened_at < REOPEN_AFTER_S:
            with contextlib.suppress(DeltaError):  # say the entries it needs were cleaned up
                self._handle.update_incremental()
                return self._handle
        self._handle = self.lake.ensure(self.name, LEASE_SCHEMA, LEASE_CONFIGURATION)
        self._opened_at = time.monotonic()
        return self._handle

    def holding(self, table: DeltaTable | None = None) -> Holding:
        """The lease as the latest snapshot (or ``table``) says; read again only when its
        version moved."""
        table = table or self.table()
        if self.seen is None or self._read_at != table.version():
            rows = pl.scan_delta(table).collect()
            empty = rows.is_empty()
            self.seen = Holding(None, None) if empty else Holding(*rows.row(0))
            self._read_at = table.version()
        return self.seen

    def acquire(self) -> bool:
        """Take the lease (free, expired or ours already: then this renews it) until
        ``duration_s`` from now; False when another process holds it or took it first."""
        table = self.table()
        now = utc_now()
        if not self.holding(table).free_for(self.holder, now):
            return False
        return self._write(table, now + timedelta(seconds=self.duration_s))

    def _write(self, table: DeltaTable, expires_at: datetime) -> bool:
        """Commit this holder's row against ``table``'s snapshot; False when another process
        committed to the lease since."""
        taken = table.transaction_version(LEASE_APP) or 0
        row = arrow_rows([{"holder": self.holder, "expires_at": expires_at}], LEASE_SCHEMA)
        try:
            commit(
                table,
                row,
                mode="overwrite",
                properties=self.lake.commit_properties({LEASE_APP: taken + 1}),
            )
        except CommitFailedError:
            return False
        return True

    def release(self) -> None:
        """Let the next process take the lease at once, if this one holds it: for a holder
        whose own schedule spaces its passes (Dagster's), not a proxy's maintainer."""
        table = self.table()
        holding = self.holding(table)
        if holding.holder == self.holder:
            self._write(table, utc_now())
