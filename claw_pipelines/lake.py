"""Access to the Delta Lake tables under one lake root (local path or object-store URI).

Tables are located and opened through ``Lake``, so locations, storage options, commit retries
and the change-data-feed reads are decided in one place. Landing rows are appended by
``TableWriter``; the derived tables' writes still call ``write_deltalake`` themselves, on handles
``Lake`` opened (``incremental``, ``batching``, ``lease``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import polars as pl
import pyarrow as pa
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from claw_pipelines.appended import appended_rows
from claw_pipelines.lake_store import check_store, is_remote, store_options
from claw_pipelines.schemas import LANDING_MODELS
from claw_pipelines.settings import ClawSettings, get_settings

TABLE_CONFIGURATION = {
    "delta.enableChangeDataFeed": "true",
    "delta.checkpointInterval": "10",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}
"""Landing and derived tables keep a change data feed so readers can take only what is new, and
a checkpoint every 10 commits: opening a table replays at most 9 JSON commits (~6 ms instead of
~15 ms at 25 commits), and a pipeline run opens tables a few dozen times. A checkpoint lists the
files removed within ``delta.deletedFileRetentionDuration``: Delta's 7 days made it list every
file a derived table's runs replaced or compacted that week (a few a run, ~85 bytes each, read
by every open); the only vacuums of derived tables (``drop_removed_files``) run right after the
removal. Tables made before are set so by their next run (``keep_configured``)."""

LANDING_CHECKPOINT_INTERVAL = 25
"""The landing tables take a commit per writer and commit window (a second or so), and a
checkpoint lists every live file: until maintenance compacts them (``claw_pipelines.maintenance``)
their files grow with the commits, so a checkpoint every 10 commits made the log grow with the
square of the commits between compactions. Every 25 an open replays at most 24 small JSON commits
and the checkpoints written between two compactions weigh a fifth as much."""

FILTERED_COLUMNS = frozenset(
    {"trajectory_id", "group_id", "target_id", "started_at", "ended_at", "created_at", "version"}
)
"""The landing columns readers filter on (besides each table's key): the only ones whose
statistics a landing table keeps, in each file's Parquet chunks and in the Delta log. Statistics
of every column (messages, API bodies, metadata) made ~2.9 KB per file in each checkpoint."""


def stats_columns(table: str) -> list[str]:
    """The columns of landing ``table`` that get statistics: its key and ``FILTERED_COLUMNS``."""
    model = LANDING_MODELS[table]
    return [
        f.name for f in model.arrow_schema() if f.name == model.key or f.name in FILTERED_COLUMNS
    ]


def table_configuration(table: str) -> dict[str, str]:
    """The properties ``table`` is created with: a landing table's checkpoint cadence and
    statistics columns (``delta.dataSkippingStatsColumns``) are its own, and its expired log is
    deleted by maintenance only, which keeps what a lagging reader needs (delta-rs would
    otherwise delete it after each checkpoint a commit writes)."""
    if table not in LANDING_MODELS:
        return TABLE_CONFIGURATION
    return TABLE_CONFIGURATION | {
        "delta.checkpointInterval": str(LANDING_CHECKPOINT_INTERVAL),
        "delta.dataSkippingStatsColumns": ",".join(stats_columns(table)),
        "delta.enableExpiredLogCleanup": "false",
    }


def landing_writer(table: str) -> WriterProperties:
    """How a landing table's files are written (by the proxies and by compaction): chunk
    statistics for ``stats_columns`` only and no dictionaries, like the derived tables'
    (``incremental.increment.WRITER``): min/max over token lists and dictionaries of unique ids
    cost write time and no reader uses them."""
    return WriterProperties(
        default_column_properties=ColumnProperties(
            dictionary_enabled=False, statistics_enabled="NONE"
        ),
        column_properties=dict.fromkeys(
            stats_columns(table),
            ColumnProperties(dictionary_enabled=False, statistics_enabled="CHUNK"),
        ),
    )


@dataclass(frozen=True)
class Lake:
    """A lake root plus the storage options every delta-rs call needs.

    The options are completed on construction (``lake_store.store_options``: on S3, the
    conditional put that makes concurrent commits safe), and a lake configured for unsafe
    commits cannot be made: ``LakeStoreError``.
    """

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)
    max_commit_retries: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage_options", store_options(self.root, self.storage_options))

    @classmethod
    def from_settings(cls, settings: ClawSettings | None = None) -> Lake:
        settings = settings or get_settings()
        return cls(settings.lake_uri, dict(settings.storage_options), settings.max_commit_retries)

    @classmethod
    def checked(cls, settings: ClawSettings | None = None) -> Lake:
        """The lake of the settings as a service takes it at start: ``LakeStoreError`` (one
        line) when it is configured for unsafe commits or its root cannot be written."""
        lake = cls.from_settings(settings)
        lake.check_writable()
        return lake

    @property
    def root_uri(self) -> str:
        """The root's URI; a local root is made absolute so every process agrees on it."""
        if is_remote(self.root):
            return self.root.rstrip("/")
        return str(Path(self.root.removeprefix("file://")).absolute())

    def uri(self, table: str) -> str:
        return f"{self.root_uri}/{table}"

    def check_writable(self) -> None:
        """Fail a process at start rather than in its first commit: the root must take a write
        (``lake_store.check_store``). Raises ``LakeStoreError`` with one line."""
        check_store(self.root_uri, self._options())

    def files_exist(self, paths: list[str]) -> list[bool]:
        """Whether each of ``paths`` (relative to the root) is a file, through delta-rs's store,
        local or object store alike: one HEAD each on an object store (``get_file_info`` adds a
        LIST for every path it does not find, and these are mostly polls that find nothing)."""
        try:
            store = DeltaStorageHandler(self.root_uri, self._options())
        except TableNotFoundError:  # a local lake nothing was written to yet
            return [False] * len(paths)
        return [_is_file(store, path) for path in paths]

    def _options(self) -> dict[str, str] | None:
        return self.storage_options or None

    def open(self, table: str, version: int | None = None) -> DeltaTable | None:
        """The Delta table, or None when nothing was ever written to it."""
        try:
            return DeltaTable(self.uri(table), version=version, storage_options=self._options())
        except TableNotFoundError:
            return None

    def vacuum(
        self,
        table: str,
        retention_hours: int,
        *,
        enforce_retention_duration: bool = True,
        keep_versions: list[int] | None = None,
    ) -> list[str]:
        """Delete the files of ``table`` that no version from the latest on needs and that were
        removed more than ``retention_hours`` ago, except those ``keep_versions`` read (Delta
        vacuum); return them. ``enforce_retention_duration`` refuses a retention shorter than
        the table's ``delta.deletedFileRetentionDuration`` (7 days unless set). Versions older
        than the retention can no longer be read by version (see ``changes``)."""
        delta_table = self.open(table)
        if delta_table is None:
            return []
        return delta_table.vacuum(
            retention_hours=retention_hours,
            enforce_retention_duration=enforce_retention_duration,
            dry_run=False,
            keep_versions=keep_versions,
        )

    def wait_for_commit(
        self, tables: Iterable[str], seen: dict[str, int], timeout_s: float, poll_s: float = 0.25
    ) -> bool:
        """Whether one of ``tables`` gets a version other than its ``seen`` one (a table not in
        ``seen``: any version) within ``timeout_s``. A long poll: each poll reads only the log
        entries new since the last (well under a millisecond a table), not the whole log."""
        deadline = time.monotonic() + timeout_s
        opened: dict[str, DeltaTable] = {}
        while True:
            for table in tables:
                delta_table = opened.get(table)
                if delta_table is None:
                    delta_table = self.open(table)
                    if delta_table is None:
                        continue
                    opened[table] = delta_table
                else:
                    delta_table.update_incremental()
                if delta_table.version() != seen.get(table):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def version(self, table: str) -> int | None:
        delta_table = self.open(table)
        return None if delta_table is None else delta_table.version()

    def ensure(
        self, table: str, schema: pa.Schema, configuration: Mapping[str, str] | None = None
    ) -> DeltaTable:
        """Create the table (empty, with ``configuration``, by default ``table_configuration``)
        if it does not exist yet.

        Several processes may race to create it; whoever loses re-opens the winner's table.
        """
        for _ in range(20):
            existing = self.open(table)
            if existing is not None:
                return existing
            try:
                return DeltaTable.create(
                    self.uri(table),
                    schema,
                    mode="ignore",
                    configuration=dict(configuration or table_configuration(table)),
                    storage_options=self._options(),
                )
            except (CommitFailedError, DeltaError):
                time.sleep(0.05)
        raise RuntimeError(f"could not create Delta table {self.uri(table)}")

    def as_created(self, table: str, schema: pa.Schema) -> DeltaTable:
        """The table at version 0 (creating it if it does not exist): the snapshot for a first
        commit, so that it conflicts with any commit made since the table was created."""
        self.ensure(table, schema)
        return self.open(table, 0)

    def append(
        self,
        table: str,
        data: pa.Table,
        *,
        apps: Mapping[str, int] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> int:
        """Append rows in one commit and return the new table version.

        With ``apps`` (app id: version) the commit carries Delta app transactions, so a caller
        that crashed after committing can ask ``committed_app_version`` and never apply a batch
        twice.
        """
        return self.writer(table).append(data, apps=apps, metadata=metadata)

    def commit_properties(
        self, apps: Mapping[str, int] | None = None, metadata: Mapping[str, str] | None = None
    ) -> CommitProperties:
        """The properties of the lake's commits: the lake's ``max_commit_retries``, an
        app transaction per ``apps`` entry (app id: version; what ``committed_app_version``
        and ``DeltaTable.transaction_version`` read back), and ``metadata`` in the commit info."""
        transactions = [Transaction(app_id=app, version=v) for app, v in (apps or {}).items()]
        return CommitProperties(
            max_commit_retries=self.max_commit_retries,
            app_transactions=transactions or None,
            custom_metadata=None if metadata is None else dict(metadata),
        )

    def writer(self, table: str) -> TableWriter:
        return TableWriter(self, table)

    def committed_app_version(self, table: str, app_id: str) -> int | None:
        """The last app-transaction version committed by ``app_id`` (None if it never committed)."""
        delta_table = self.open(table)
        if delta_table is None:
            return None
        return delta_table.transaction_version(app_id)

    def scan(self, table: str, version: int | None = None) -> pl.LazyFrame | None:
        """A lazy scan of the table at ``version`` (default latest); None if it does not exist."""
        delta_table = self.open(table, version)
        return None if delta_table is None else pl.scan_delta(delta_table)

    def scan_landed(self, table: str) -> pl.LazyFrame | None:
        """The latest landing ``table`` with its rows in about the order they landed: its files
        by their earliest ``started_at`` (``delta_files.scan_in_order``); None if it does not
        exist."""
        from claw_pipelines.delta_files import scan_in_order

        delta_table = self.open(table)
        return None if delta_table is None else scan_in_order(delta_table, "started_at")


NO_DATA_CHANGE = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES"})
"""Operations whose commits change no rows: compaction, the two commits of a vacuum, and
maintenance setting a table's retention properties."""


def data_commits(delta_table: DeltaTable, after_version: int) -> list[dict]:
    """The commits after ``after_version`` that changed rows (newest first), from the history
    of those versions only: compactions and vacuums are left out."""
    newer = delta_table.version() - after_version
    if newer <= 0:
        return []
    commits = delta_table.history(limit=newer)
    return [c for c in commits if c.get("operation") not in NO_DATA_CHANGE]


def watermark_app(asset: str, source: str) -> str:
    """The app transaction that an incremental asset's output commits carry for one input (or
    for its run number and attempt): the input's Delta version it read up to."""
    return f"claw/{asset}/{source}"


def keyed(frame: pl.LazyFrame, column: str, keys: pl.Series) -> pl.LazyFrame:
    """The rows of ``frame`` whose ``column`` is one of ``keys``.

    The keys' bounds go first (``within_keys``). The keys themselves are matched by a semi
    join, not ``is_in``: a long ``is_in`` list inside a scan costs far more than the join (400k
    keys: 1.2 s against 0.04 s), and for a few keys the two are even (2k keys: 8 ms, 6 ms).
    """
    ordered = keys.drop_nulls().unique().sort()
    if ordered.is_empty():
        return frame.head(0)
    return frame.filter(within_keys(column, ordered)).join(
        ordered.to_frame(column).lazy(), on=column, how="semi"
    )


def within_keys(column: str, keys: pl.Series) -> pl.Expr:
    """``column`` between the smallest and the largest of ``keys``: ids are time-ordered, so in
    a Delta scan this skips the files and row groups the keys cannot be in."""
    return pl.col(column).is_between(pl.lit(keys.min(), keys.dtype), pl.lit(keys.max(), keys.dtype))


def floor_ms(moment: datetime) -> datetime:
    """``moment`` down to the millisecond: Delta's file statistics keep timestamps to the
    millisecond, so a scan's lower bound in the same millisecond as a file's latest row would
    skip that file (seen: ``planned_at >= x`` found nothing for a row at exactly ``x``)."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def column_bound(delta_table: DeltaTable, column: str, bound: Literal["min", "max"]):
    """The smallest or largest value of ``column`` (None when empty), from the files'
    statistics when every file has them, so no data is read however big the table; else from
    a scan of the column."""
    files = pl.DataFrame(delta_table.get_add_actions(flatten=True))
    if files.is_empty():
        return None
    value, nulls = pl.col(f"{bound}.{column}"), pl.col(f"null_count.{column}")
    if {f"{bound}.{column}", f"null_count.{column}"} <= set(files.columns):
        known = files.select((value.is_not_null() | (nulls == pl.col("num_records"))).all())
        if known.item():
            return files.select(getattr(value, bound)()).item()
    return pl.scan_delta(delta_table).select(getattr(pl.col(column), bound)()).collect().item()


def sql_in(column: str, values: Iterable[str]) -> str:
    """The delta-rs predicate ``column IN ('a', 'b')``, each value quoted as an SQL string."""
    quoted = ", ".join("'" + value.replace("'", "''") + "'" for value in values)
    return f"{column} IN ({quoted})"


def compact(
    delta_table: DeltaTable, *, max_files: int, writer_properties: WriterProperties | None = None
) -> None:
    """Merge the table's small files once it has more than ``max_files`` (the handle moves to
    the new version). A table that gets a small commit per run would otherwise make every open
    and scan slower as it ages. The commit carries no data change, so change-data-feed readers
    skip it, and earlier versions stay readable until a ``vacuum`` deletes the merged files
    (only the landing tables' are, after a retention: ``assets.maintenance``). It only saves work
    later: when another writer removed files it merged (its commit is rejected), it is skipped,
    and the caller's own commit, already made, stands; a later compaction merges them."""
    if len(delta_table.file_uris()) > max_files:
        with contextlib.suppress(CommitFailedError):
            delta_table.optimize.compact(writer_properties=writer_properties)


def keep_configured(delta_table: DeltaTable, lake: Lake) -> None:
    """Set the ``TABLE_CONFIGURATION`` properties ``delta_table`` (a derived table) lacks or
    holds otherwise: one commit the first time, nothing after (its metadata is in memory)."""
    configured = delta_table.metadata().configuration
    if any(configured.get(key) != value for key, value in TABLE_CONFIGURATION.items()):
        with contextlib.suppress(CommitFailedError):  # another run set them first
            delta_table.alter.set_table_properties(
                TABLE_CONFIGURATION, commit_properties=lake.commit_properties()
            )


def drop_removed_files(delta_table: DeltaTable, keep_versions: list[int] | None = None) -> None:
    """Delete the files no version from the handle's on needs, nor ``keep_versions`` (a vacuum
    with no retention). Only for the steps run's state tables, through the handle that wrote
    them: they are rewritten often, and their old files would otherwise pile up."""
    delta_table.vacuum(
        retention_hours=0,
        enforce_retention_duration=False,
        dry_run=False,
        keep_versions=keep_versions,
    )


class VersionsVacuumed(RuntimeError):
    """A change-data-feed read of versions whose files were compacted and then vacuumed."""


def changes(
    delta_table: DeltaTable,
    after_version: int | None,
    up_to_version: int,
    columns: list[str] | None = None,
    *,
    with_version: bool = False,
) -> pl.DataFrame | None:
    """Rows inserted into an open table in versions ``(after_version, up_to_version]``, read
    from its change data feed (None when the range is empty): the ``columns`` asked for (default
    all), and with ``with_version`` the ``_commit_version`` each row landed in. Commits that
    only appended are read by polars from the files they added (``appended.appended_rows``,
    with the storage options the table was opened with). Every reader of what is new goes
    through here (an ``Increment`` for its run's range).

    The feed reads the log entries of those versions and the files they added. Once the
    entries were cleaned up, or compaction merged the files and a vacuum deleted them (the
    landing tables, ``claw_pipelines.maintenance``), a read from the start of an append-only
    table takes its rows from the snapshot instead (all it ever inserted), each with
    ``up_to_version`` as ``_commit_version`` (committed at or before it); a read from a later
    version raises ``VersionsVacuumed``, as those rows can no longer be told apart (maintenance
    keeps what a reader it knows of has yet to read, so only an outside cleanup gets there).
    A reader whose own version's entry is gone reads on from the entries after it.
    """
    if after_version is not None and up_to_version <= after_version:
        return None
    start = 0 if after_version is None else after_version + 1
    try:
        inserted = appended_rows(delta_table, start, up_to_version, columns)
        if inserted is None:
            inserted = _inserted(delta_table, start, up_to_version, columns)
    except Exception as error:  # delta-rs tells these apart only by a bare Exception's text
        if not any(sign in str(error) for sign in GONE):
            raise
        if after_version is not None or up_to_version != delta_table.version():
            raise VersionsVacuumed(
                f"{delta_table.table_uri}: versions {start} to {up_to_version} can no longer be "
                "read from the change data feed: the files they added were compacted and then "
                "vacuumed, or their log entries cleaned up, as this reader fell further behind "
                "than the vacuum retention or the log retention (claw_pipelines.maintenance)"
            ) from error
        inserted = (
            pl.scan_delta(delta_table)
            .select(columns or pl.all())
            .with_columns(pl.lit(up_to_version, pl.UInt64).alias("_commit_version"))
            .collect()
        )
    kept = ["_commit_version"] if with_version else []
    return inserted.drop(sorted(set(CHANGE_COLUMNS) - set(kept)), strict=False)


GONE = ("not found", "Invalid table version")
"""How delta-rs says a version range cannot be read: a file it added is gone (vacuumed), or a
log entry is (cleaned up: ``Invalid table version``)."""

CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
"""The columns a change-data-feed read adds to a table's own."""


def _inserted(
    delta_table: DeltaTable, start: int, up_to_version: int, columns: list[str] | None
) -> pl.DataFrame:
    wanted = None if columns is None else [*columns, "_change_type", "_commit_version"]
    reader = delta_table.load_cdf(
        starting_version=start,
        ending_version=up_to_version,
        columns=wanted,
        predicate="_change_type = 'insert'",
    )
    return pl.DataFrame(reader.read_all())


def _is_file(store: DeltaStorageHandler, path: str) -> bool:
    try:
        store.open_input_file(path).close()
    except (FileNotFoundError, IsADirectoryError):
        return False
    return True


REOPEN_AFTER_S = 60.0
"""A writer's handle is re-opened once this old: a commit or an update through a handle reads
the log entries since its version, and maintenance deletes entries older than the log
retention (at least ``maintenance.MIN_LOG_RETENTION_MINUTES``), so an idle handle kept longer
would fail with ``Invalid table version``."""


class TableWriter:
    """Appends to one table through a long-lived handle, re-opened every ``reopen_every`` commits
    and once ``REOPEN_AFTER_S`` old.

    Re-using the handle saves a log load per commit; re-opening bounds the snapshot a handle
    accumulates (delta-rs keeps every file it ever saw, and commit latency grows with it).
    Appends merge the schema: a column added to a landing model (say ``turns.api``) is added to
    a table written before it existed, whose older rows read it as null. A commit refused
    because the handle predates another writer's schema change is retried once on a fresh one,
    unless that one holds one of the commit's app transactions at its version or later: then
    another process committed the same rows (say two committers, one whose lease ran out), and
    the refusal stands.
    """

    def __init__(self, lake: Lake, table: str, reopen_every: int = 100) -> None:
        self.lake = lake
        self.table = table
        self.reopen_every = reopen_every
        self.writer_properties = landing_writer(table) if table in LANDING_MODELS else None
        self._handle: DeltaTable | None = None
        self._commits = 0
        self._opened_at = 0.0

    def _current(self) -> DeltaTable | None:
        """The handle, unless it is due to be re-opened (then None)."""
        if (
            self._commits >= self.reopen_every
            or time.monotonic() - self._opened_at > REOPEN_AFTER_S
        ):
            self._handle = None
        return self._handle

    def _open(self, schema: pa.Schema) -> DeltaTable:
        if self._current() is None:
            self._handle = self.lake.ensure(self.table, schema)
            self._commits, self._opened_at = 0, time.monotonic()
        return self._handle

    def committed_app_version(self, app_id: str) -> int | None:
        handle = self._current()
        if handle is None:
            handle = self.lake.open(self.table)
            if handle is None:
                return None
        else:
            handle.update_incremental()
        return handle.transaction_version(app_id)

    def snapshot(self, schema: pa.Schema) -> DeltaTable:
        """The handle brought up to date (the table created if need be): what a caller reads
        from it, say its app transactions, is what ``append(..., snapshot=)`` commits against."""
        handle = self._current()
        if handle is None:
            return self._open(schema)
        handle.update_incremental()
        return handle

    def append(
        self,
        data: pa.Table,
        *,
        apps: Mapping[str, int] | None = None,
        metadata: dict[str, str] | None = None,
        snapshot: DeltaTable | None = None,
    ) -> int:
        """Append rows in one commit, with ``apps`` as its app transactions; the table version
        it made (read from the handle that made it, not from a new open). From a ``snapshot``
        the commit is never retried: any commit since that snapshot with one of ``apps``
        refuses it (``CommitFailedError``), so a caller that read those from it never appends
        what another process appended meanwhile."""
        properties = self.lake.commit_properties(apps, metadata)
        if snapshot is not None:
            version = _write(snapshot, data, properties, self.writer_properties)
            self._commits += 1
            return version
        try:
            version = self._write(data, properties)
        except CommitFailedError:
            self._handle = None
            fresh = self._open(data.schema)
            if any((fresh.transaction_version(app) or -1) >= v for app, v in (apps or {}).items()):
                raise  # another process committed these rows: the caller must not append them
            version = self._write(data, properties)
        self._commits += 1
        return version

    def _write(self, data: pa.Table, properties: CommitProperties) -> int:
        return _write(self._open(data.schema), data, properties, self.writer_properties)


def _write(
    handle: DeltaTable,
    data: pa.Table,
    properties: CommitProperties,
    writer_properties: WriterProperties | None,
) -> int:
    write_deltalake(
        handle,
        data,
        mode="append",
        schema_mode="merge",
        commit_properties=properties,
        writer_properties=writer_properties,
    )
    return handle.version()
