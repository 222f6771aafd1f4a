"""The Delta Lake tables under one lake root (local path or object-store URI).

Tables are located, created and opened through ``Lake``, so locations, storage options and
commit retries are decided in one place. Rows are written by ``commits.commit`` alone, the
landing tables' through a long-lived ``TableWriter``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from claw_pipelines.lake.commits import commit, commit_properties
from claw_pipelines.lake.files import scan_in_order
from claw_pipelines.lake.properties import landing_writer, table_configuration
from claw_pipelines.lake.store import check_store, is_remote, store_options
from claw_pipelines.schemas import LANDING_MODELS
from claw_pipelines.settings import ClawSettings, get_settings


@dataclass(frozen=True)
class Lake:
    """A lake root plus the storage options every delta-rs call needs.

    The options are completed on construction (``store.store_options``: on S3, the
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
        (``store.check_store``). Raises ``LakeStoreError`` with one line."""
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
        return commit_properties(self.max_commit_retries, apps, metadata)

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
        by their earliest ``started_at`` (``files.scan_in_order``); None if it does not
        exist."""
        delta_table = self.open(table)
        return None if delta_table is None else scan_in_order(delta_table, "started_at")


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
            version = self._commit(snapshot, data, properties)
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
        return self._commit(self._open(data.schema), data, properties)

    def _commit(self, handle: DeltaTable, data: pa.Table, properties: CommitProperties) -> int:
        return commit(
            handle,
            data,
            schema_mode="merge",
            properties=properties,
            writer_properties=self.writer_properties,
        )
