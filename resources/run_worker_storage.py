"""A run's Dagster storage: the instance's SQLite files, with the run's connections kept.

Dagster's SQLite event log builds a new SQLAlchemy engine and opens a new connection for every
statement (``NullPool``), and closing a database's last connection checkpoints its write-ahead
log into the file. A refresh run stores about 85 events (step starts and ends, materializations,
check evaluations) and claims and frees a pool slot per step, and each asset event is written to
the run's file and to ``index.db``: 1.7 ms of CPU a plain event and 4.8 ms an asset event on the
development machine, several times that in wall time under a soak, where every refresh run,
sensor and the webserver share ``index.db``.

A forked run worker (``run_launcher.ForkedRunLauncher``) uses this storage instead: one engine
per database for the run's life, and one connection to ``index.db`` kept open between
statements (0.4 and 1.4 ms). A run's own file still closes its connection after each statement:
the webserver follows a running run by watching that file change, which, in SQLite's WAL mode,
it does at the checkpoint a close makes. What is stored, where and in which transaction is
Dagster's own code; the instance's other processes (daemon, webserver) keep Dagster's storage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as db
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    SqliteStorageConfig,
    _event_logs_directory,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool, QueuePool


class KeptConnectionsEventLogStorage(SqliteEventLogStorage):
    """``SqliteEventLogStorage`` with an engine per database kept, and the connection to
    ``index.db`` kept open between statements."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: dict[str, db.Engine] = {}
        super().__init__(base_dir, inst_data)

    def _engine(self, shard: str) -> db.Engine:
        engine = self._engines.get(shard)
        if engine is None:
            engine = db.create_engine(
                self.conn_string_for_shard(shard),
                poolclass=QueuePool if shard == INDEX_SHARD_NAME else NullPool,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            )
            self._engines[shard] = engine
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def dispose(self) -> None:
        super().dispose()
        with self._db_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()


class RunWorkerSqliteStorage(DagsterSqliteStorage):
    """The instance's ``DagsterSqliteStorage`` (same files), with ``KeptConnectionsEventLogStorage``
    as its event log."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        super().__init__(base_dir, inst_data)
        self._event_log_storage = KeptConnectionsEventLogStorage(_event_logs_directory(base_dir))

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: SqliteStorageConfig
    ) -> RunWorkerSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)


def run_worker_ref(ref: InstanceRef) -> InstanceRef:
    """The instance a forked run worker loads: ``ref`` with ``RunWorkerSqliteStorage`` when its
    storage is Dagster's default SQLite storage (any other storage, say Postgres, is kept)."""
    data = ref.storage_data
    if data is None or (data.module_name, data.class_name) != (
        DagsterSqliteStorage.__module__,
        DagsterSqliteStorage.__name__,
    ):
        return ref
    kept = ConfigurableClassData(__name__, RunWorkerSqliteStorage.__name__, data.config_yaml)
    return ref._replace(storage_data=kept)
