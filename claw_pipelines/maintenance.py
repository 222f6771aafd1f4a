"""Maintenance of the landing tables, which the proxies append to: compaction, checkpoints, log
cleanup and vacuum, one process at a time across the fleet.

A proxy commits each landing table about once per commit window, so a table gains thousands of
small files and log entries a day, and every open, checkpoint and scan slows down as it ages.
One pass (``maintain_lake``) per table, in this order:

1. sets its retention and statistics properties when they differ (a lake made before them);
2. merges its small files, tier by tier up to ``LANDING_FILE_BYTES``, once more than
   ``compact_after_files`` wait at a tier (``commits.compact``; Delta OPTIMIZE: no data change,
   so change-data-feed readers skip it, and appends running meanwhile stand), in row groups a
   read of a time window skips (``landing_writer``);
3. writes a checkpoint at the version after the merge, which lists the few merged files, so an
   open reads that and the commits after it, however old the table;
4. deletes the log entries and checkpoints older than ``log_retention_minutes`` and than that
   checkpoint (``cleanup_metadata``), and, however young, every checkpoint a newer one
   superseded minutes ago but one a minute (``drop_superseded_checkpoints``): an open reads
   the latest one only and readers of what is new read the entries themselves, while a
   checkpoint every 25 commits, listing every small file since the last merge with its
   statistics, made up most of a small table's log;
5. vacuums the files merged away more than ``vacuum_retention_hours`` ago, then those no
   version refers to any more (the checkpoints list removed files for the log retention only,
   ``Retention.properties``) written that long ago, and at least ``UNCOMMITTED_HOURS`` (a
   full vacuum, by the files' age). Under traffic a file compaction removes was written
   since the last compaction (the small files, and the merged file they joined), so it stays
   the retention, as with Delta's vacuum by removal time; a merged file older than the
   retention that new files join goes at that pass, which only a read begun on the snapshot
   before it can notice (it fails; the next one reads the new).

Each derived asset reads the landing tables by Delta version, from the change data feed after
its watermark (``incremental.increment``): the feed reads the log entries of those versions and
the small files they added. So a pass keeps both for the slowest reader (``LANDING_READERS``):
the vacuum's retention is stretched to the first version it has yet to read, and the log cleanup
waits while the first entry it has yet to read is about as old as the log retention (a pipeline
that lagged, Dagster stopped or an asset failing for days, catches up). A read from the start (a
new derived table, the inspector) takes the table's snapshot instead. A vacuum or cleanup done
outside this module that deletes them makes that reader fail with ``lake.VersionsVacuumed``.

Who runs it: every proxy worker (``Maintainer``, every ``maintenance_interval_s``) and Dagster's
``landing_maintenance`` schedule, all through the lease in the lake (``lease.Lease``), so only
one pass runs at a time. Nothing a pass does can lose a row: each step is a Delta commit or
deletes only what no version from the latest checkpoint on refers to, so a pass killed at any
point leaves the table as the last step it finished left it.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler
from pyarrow.fs import FileSelector
from pydantic import BaseModel, ConfigDict, Field

from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import data_commits
from claw_pipelines.lake.commits import compact, keep_configured, watermark_app
from claw_pipelines.lake.properties import (
    LANDING_FILE_BYTES,
    landing_writer,
    table_configuration,
)
from claw_pipelines.lake.tables import REOPEN_AFTER_S
from claw_pipelines.lease import COMMIT_LEASE_TABLE, LEASE_TABLE, Lease
from claw_pipelines.schemas import LANDING_MODELS, utc_now
from claw_pipelines.settings import ClawSettings

log = logging.getLogger(__name__)

LANDING_READERS: dict[str, list[str]] = {
    "turns": ["steps"],
    "trajectory_events": ["steps", "trajectories", "rewarded_steps"],
    "rewards": ["rewarded_steps"],
    "trajectory_registrations": ["rewarded_steps"],
    "labels": ["curated_steps"],
    "policy_versions": [],
}
"""The incremental assets that read each landing table by Delta version: each records how far it
read as the app transaction ``claw/<asset>/<table>`` on its own output table (``Increment``), and
a pass keeps what the slowest of them has yet to read."""


MIN_LOG_RETENTION_MINUTES = 5
"""Well past the age at which a writer re-opens its handle (``lake.REOPEN_AFTER_S``): a handle
reads the log entries since its version on its next commit."""

UNCOMMITTED_HOURS = 1
"""The full vacuum never takes a file written within this for an orphan: a writer's file is
referenced by no version until its commit lands."""

SUPERSEDED_AFTER = timedelta(seconds=2 * REOPEN_AFTER_S)
"""How long a checkpoint stays after a newer one was written (``drop_superseded_checkpoints``):
twice a writer handle's life. A landing table takes a checkpoint every 25 commits (about every
25 s under traffic), each listing the files removed within the log retention: kept 5 minutes,
with a pass every 5, they made most of the small tables' log (log ÷ data 1.3 in a 10-minute
soak)."""

ANCHOR_SPACING = timedelta(minutes=1)
"""One checkpoint this far apart is kept however superseded (``drop_superseded_checkpoints``),
so the log cleanup always finds one about as old as the log retention to delete up to."""

CLOCK_SKEW = timedelta(minutes=1)
"""How far the writers' clocks (commit timestamps) and the store's (log entries' ages) may
disagree."""


class Retention(BaseModel):
    """How long what maintenance removes stays (``ClawSettings``, or the Dagster job's config)."""

    model_config = ConfigDict(frozen=True)

    vacuum_retention_hours: int = Field(default=168, ge=0)
    enforce_retention_duration: bool = True
    log_retention_minutes: int = Field(
        default=MIN_LOG_RETENTION_MINUTES, ge=MIN_LOG_RETENTION_MINUTES
    )
    compact_after_files: int = Field(default=64, ge=1)

    @classmethod
    def from_settings(cls, settings: ClawSettings) -> Retention:
        return cls(
            vacuum_retention_hours=settings.vacuum_retention_hours,
            enforce_retention_duration=settings.vacuum_enforce_retention,
            log_retention_minutes=settings.log_retention_minutes,
        )

    def properties(self, table: str) -> dict[str, str]:
        """The properties a pass sets on ``table``: its creation ones, the log retention, and
        as long a retention of the tombstones (removed files) each checkpoint lists: Delta's
        7 days made a landing table's checkpoint list every small file compaction merged
        away that week, ~85 bytes each, read by every open (the vacuum finds the files
        without them)."""
        retention = f"interval {self.log_retention_minutes} minutes"
        return table_configuration(table) | {
            "delta.logRetentionDuration": retention,
            "delta.deletedFileRetentionDuration": retention,
        }


@dataclass(frozen=True)
class TablePass:
    """What one pass did to one table."""

    table: str
    files_before: int
    files_after: int
    vacuumed: int
    log_cleaned: bool
    unread_since: datetime | None


def slowest_read(lake: Lake, name: str) -> int | None:
    """The version up to which the slowest reader of landing table ``name`` has read (None when
    none has). A reader that never read it reads its snapshot from the start, which neither
    vacuum nor log cleanup can break, so it does not count."""
    read = [
        version
        for reader in LANDING_READERS[name]
        if (version := lake.committed_app_version(reader, watermark_app(reader, name))) is not None
    ]
    return min(read) if read else None


def first_unread_commit(table: DeltaTable, read: int | None) -> datetime | None:
    """When the first rows after version ``read`` were committed (None when there are none)."""
    unread = data_commits(table, read) if read is not None else []
    if not unread:
        return None
    return datetime.fromtimestamp(min(c["timestamp"] for c in unread) / 1000, UTC)


def first_unread_entry(lake: Lake, table: DeltaTable, read: int | None) -> datetime | None:
    """When the log entry after version ``read`` was written, as the store dates it (the age
    the log cleanup goes by); None when there is none. A reader's next read starts there,
    whatever the entry holds (a compaction, a property change, rows)."""
    if read is None or table.version() <= read:
        return None
    store = DeltaStorageHandler(table.table_uri, lake.storage_options or None)
    (entry,) = store.get_file_info([f"_delta_log/{read + 1:020d}.json"])
    return None if entry.mtime is None else entry.mtime.astimezone(UTC)


def retention_hours(configured: int, unread_since: datetime | None, now: datetime) -> int:
    """The configured retention, stretched (plus an hour for clock skew between writers) to keep
    everything since ``unread_since``: a file or log entry a reader still needs was written
    after the last version it read, so it was merged, and its removal stamped, after that."""
    if unread_since is None:
        return configured
    return max(configured, math.ceil((now - unread_since).total_seconds() / 3600) + 1)


def log_kept(minutes: int, unread_entry: datetime | None, now: datetime) -> bool:
    """Whether the log must stay whole: the first entry a reader has yet to read is (nearly, by
    ``CLOCK_SKEW``) as old as the retention, so the cleanup could delete it."""
    return unread_entry is not None and now - unread_entry > timedelta(minutes=minutes) - CLOCK_SKEW


class LeaseLost(RuntimeError):
    """Another process took the maintenance lease while this one worked: it stops."""


def _renew(lease: Lease) -> None:
    if not lease.acquire():
        raise LeaseLost(f"{lease.holder} lost the maintenance lease")


def drop_superseded_checkpoints(lake: Lake, table: DeltaTable, now: datetime) -> int:
    """Delete each checkpoint whose successor was written ``SUPERSEDED_AFTER`` ago (how many),
    but one every ``ANCHOR_SPACING``. Opening the latest version reads the latest checkpoint and
    the entries after it, and a change-data-feed read of the landing tables reads the entries
    of its versions (``appended.appended_rows``), so only a handle opened before the successor
    was written reads the older one again (delta-rs reads a snapshot's checkpoint lazily, e.g.
    for an app transaction); a writer re-opens its handle within ``lake.REOPEN_AFTER_S``.

    The log cleanup (delta-rs ``cleanup_metadata``) deletes the entries before the newest
    checkpoint older than the log retention, so that every version it keeps can be opened:
    with every superseded checkpoint gone within minutes, none was ever that old and the
    entries were never deleted (a soak's small tables kept every entry). The checkpoints kept
    one per ``ANCHOR_SPACING`` give the cleanup one within that spacing of the retention."""
    store = DeltaStorageHandler(table.table_uri, lake.storage_options or None)
    checkpoints = sorted(
        (int(Path(entry.path).name.split(".")[0]), entry.path, entry.mtime)
        for entry in store.get_file_info_selector(FileSelector("_delta_log"))
        if ".checkpoint." in Path(entry.path).name
    )
    superseded, anchored = [], None
    for (_, path, written), (_, _, successor_written) in itertools.pairwise(checkpoints):
        if written is not None and (anchored is None or written - anchored >= ANCHOR_SPACING):
            anchored = written
        elif successor_written is not None and now - successor_written > SUPERSEDED_AFTER:
            superseded.append(path)
    for path in superseded:
        store.delete_file(path)
    return len(superseded)


def maintain_table(
    lake: Lake, name: str, table: DeltaTable, retention: Retention, lease: Lease
) -> TablePass:
    """One pass over landing table ``name``, open as ``table`` (the module's five steps); the
    lease is renewed before the vacuum, the step that can take longest."""
    keep_configured(table, lake.commit_properties(), retention.properties(name))
    before = len(table.file_uris())
    compact(
        table,
        max_files=retention.compact_after_files,
        writer_properties=landing_writer(name),
        target_size=LANDING_FILE_BYTES,
    )
    table.create_checkpoint()
    read = slowest_read(lake, name)
    unread_since = first_unread_commit(table, read)
    now = utc_now()
    log_cleaned = not log_kept(
        retention.log_retention_minutes, first_unread_entry(lake, table, read), now
    )
    if log_cleaned:
        table.cleanup_metadata()
    _renew(lease)
    hours = retention_hours(retention.vacuum_retention_hours, unread_since, now)
    enforce = retention.enforce_retention_duration
    deleted = table.vacuum(
        retention_hours=hours, enforce_retention_duration=enforce, dry_run=False
    ) + table.vacuum(
        retention_hours=max(hours, UNCOMMITTED_HOURS),
        enforce_retention_duration=enforce,
        dry_run=False,
        full=True,
    )
    drop_superseded_checkpoints(lake, table, now)
    return TablePass(name, before, len(table.file_uris()), len(deleted), log_cleaned, unread_since)


def maintain_lake(lake: Lake, retention: Retention, lease: Lease) -> list[TablePass] | None:
    """A pass over every landing table while holding ``lease``; None when another process
    holds it. The lease is renewed before each table and each vacuum (``LeaseLost`` when it
    cannot be). The lease tables' own superseded rows and logs are cleaned up last."""
    if not lease.acquire():
        return None
    passes = []
    for name in LANDING_MODELS:
        table = lake.open(name)
        if table is None:
            continue
        _renew(lease)
        passes.append(maintain_table(lake, name, table, retention, lease))
        log.info("maintenance of %s: %s", name, passes[-1])
    for name in (LEASE_TABLE, COMMIT_LEASE_TABLE):
        lease_table = lake.open(name)
        if lease_table is not None:
            lease_table.create_checkpoint()
            lease_table.cleanup_metadata()
            lease_table.vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False)
    return passes


@dataclass
class Maintainer:
    """The proxy's maintenance: a pass every ``interval_s`` (jittered, so a fleet started
    together does not ask at once), in a background thread, whenever it gets the lease."""

    lake: Lake
    retention: Retention
    holder: str
    interval_s: float

    def __post_init__(self) -> None:
        self.lease = Lease(self.lake, self.holder, self.interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claw-maintenance", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s * random.uniform(0.5, 1.0)):
            try:
                maintain_lake(self.lake, self.retention, self.lease)
            except Exception:
                log.exception("lake maintenance failed; the next pass retries")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)  # a pass under way is safe to abandon
