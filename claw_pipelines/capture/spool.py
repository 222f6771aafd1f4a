"""The local spool: where a turn becomes durable before its answer leaves the proxy.

Each proxy process owns one spool directory (named by its writer id and held with an exclusive
``flock``). Rows are appended to one active segment per table, one frame per row written with a
single ``write`` call (format in ``spool_codec``), so a killed process leaves at most a torn
frame, of a turn that was never answered. ``SpoolFlusher`` seals segments and commits them to
Delta, each commit tagged with a Delta app transaction ``(writer_id, segment_seq)``; a segment
is deleted only after its commit, and a commit that landed before a crash is recognised by its
transaction version and never applied twice. Directories whose owner died are adopted and
committed by any live process. Frames that cannot be decoded are moved to a quarantine file
under the spool root (never silently dropped) so they cannot block the rest of the spool.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from claw_pipelines.capture import spool_codec
from claw_pipelines.lake import Lake, TableWriter
from claw_pipelines.schemas import LANDING_MODELS, LandingRow

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
SEGMENT_SUFFIX = ".spool"
QUARANTINE_DIR = "quarantine"


def new_writer_id() -> str:
    """Unique per writer: host, pid, start time (ms) and a random suffix."""
    started = time.time_ns() // 1_000_000
    return f"{socket.gethostname()}-{os.getpid()}-{started}-{secrets.token_hex(3)}"


def segment_name(table: str, seq: int) -> str:
    return f"{table}-{seq:012d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[str, int] | None:
    """``turns-000000000007.spool`` -> ("turns", 7); None for anything else."""
    if not name.endswith(SEGMENT_SUFFIX):
        return None
    table, _, seq = name.removesuffix(SEGMENT_SUFFIX).rpartition("-")
    if table not in LANDING_MODELS or not seq.isdigit():
        return None
    return table, int(seq)


@dataclass
class _ActiveSegment:
    seq: int
    fd: int
    rows: int = 0


@dataclass
class SpoolWriter:
    """Appends landing rows to this process's spool directory."""

    root: Path
    writer_id: str = field(default_factory=new_writer_id)
    fsync_per_answer: bool = False

    def __post_init__(self) -> None:
        self.directory = self.root / self.writer_id
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._mutex = threading.Lock()
        self._active: dict[str, _ActiveSegment] = {}
        self._sealed_rows: dict[tuple[str, int], int] = {}
        self._next_seq: dict[str, int] = {}
        self._dirty: set[int] = set()
        self._fsync_task: asyncio.Future | None = None

    def append(self, row: LandingRow) -> None:
        """Write one row to its table's active segment (one ``write`` of one IPC message)."""
        table = row.table_name
        message = spool_codec.encode(row)
        with self._mutex:
            segment = self._active.get(table)
            if segment is None:
                segment = self._open_segment(table)
            os.write(segment.fd, message)
            segment.rows += 1
            self._dirty.add(segment.fd)

    def _open_segment(self, table: str) -> _ActiveSegment:
        seq = self._next_seq.get(table, 0)
        self._next_seq[table] = seq + 1
        path = self.directory / segment_name(table, seq)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        segment = _ActiveSegment(seq, fd)
        self._active[table] = segment
        return segment

    def is_active(self, table: str, seq: int) -> bool:
        """Whether ``seq`` is the table's segment still being appended to."""
        with self._mutex:
            segment = self._active.get(table)
            return segment is not None and segment.seq == seq

    def active_rows(self) -> int:
        with self._mutex:
            return self._active_rows()

    def spooled_rows(self) -> int:
        """Rows appended and not committed yet: in active segments and in sealed ones waiting
        for (or failing) their commit. Counted in memory, so asking costs no file reads."""
        with self._mutex:
            return self._active_rows() + sum(self._sealed_rows.values())

    def _active_rows(self) -> int:
        """Rows in the active segments (the caller holds the mutex)."""
        return sum(segment.rows for segment in self._active.values())

    def landed(self, table: str, seq: int) -> None:
        """Forget a sealed segment's rows: its commit landed (or an earlier one already had)."""
        with self._mutex:
            self._sealed_rows.pop((table, seq), None)

    def seal(self) -> None:
        """Close every non-empty active segment so the flusher may commit it.

        A segment written since the last sync is fsynced first, so sealing never leaves rows
        less durable than the fsync policy promised.
        """
        with self._mutex:
            for table, segment in list(self._active.items()):
                if segment.rows:
                    if segment.fd in self._dirty:
                        os.fsync(segment.fd)
                    os.close(segment.fd)
                    self._dirty.discard(segment.fd)
                    self._sealed_rows[(table, segment.seq)] = segment.rows
                    del self._active[table]

    def sync(self) -> None:
        """fsync every segment written since the last sync (one call serves many answers)."""
        with self._mutex:
            dirty, self._dirty = self._dirty, set()
        for fd in dirty:
            with contextlib.suppress(OSError):
                os.fsync(fd)

    async def durable(self) -> None:
        """Group commit: with per-answer fsync, wait until the rows appended so far are on disk.

        Concurrent answers share one fsync running in a thread, so the event loop never blocks
        and the cost is amortised over everything appended meanwhile.
        """
        if not self.fsync_per_answer:
            return
        if self._fsync_task is None or self._fsync_task.done():
            self._fsync_task = asyncio.ensure_future(asyncio.to_thread(self.sync))
            await self._fsync_task
            return
        await self._fsync_task
        await self.durable()

    def close(self) -> None:
        self.seal()
        with self._mutex:
            for segment in self._active.values():
                os.close(segment.fd)
            self._active.clear()
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)


def quarantine_frames(root: Path, writer_id: str, segment: Path, frames: list[bytes]) -> Path:
    """Write undecodable frames to ``<root>/quarantine/<writer>-<segment>.quarantined``.

    The file is in spool format and written atomically under a fixed name, so quarantining the
    same segment again (a retry after a failed commit) rewrites identical content.
    """
    directory = root / QUARANTINE_DIR
    directory.mkdir(exist_ok=True)
    target = directory / f"{writer_id}-{segment.stem}.quarantined"
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as file:
        file.write(b"".join(frames))
        file.flush()
        os.fsync(file.fileno())
    partial.replace(target)
    return target


def dedupe_on_key(data: pa.Table, key: str) -> pa.Table:
    """Keep the first row per key: a replayed or repeated row must not land twice."""
    if data.num_rows < 2 or pc.count_distinct(data.column(key)).as_py() == data.num_rows:
        return data
    indices = pa.table({key: data.column(key), "_i": pa.array(range(data.num_rows))})
    first = indices.group_by(key, use_threads=False).aggregate([("_i", "min")]).column("_i_min")
    return data.take(pc.take(first, pc.sort_indices(first)))


class SpoolCommitError(RuntimeError):
    """Some tables of a spool directory could not be committed; their segments stay on disk."""


@dataclass
class SpoolFlusher:
    """Commits sealed spool segments to Delta in micro-batches, in a background thread."""

    writer: SpoolWriter
    lake: Lake
    max_rows: int = 512
    interval_s: float = 1.0
    fsync_interval_s: float | None = 0.1
    adopt_every_s: float = 5.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._commit_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._tables: dict[str, TableWriter] = {}
        self._committed: dict[tuple[str, str], int | None] = {}
        self.committed_rows = 0

    def start(self) -> None:
        self.adopt_orphans()
        self._thread = threading.Thread(target=self._run, name="claw-spool-flusher", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """Ask for an early flush (called when the active segment is large)."""
        if self.writer.active_rows() >= self.max_rows:
            self._wake.set()

    def _run(self) -> None:
        """Flush every interval (or when nudged) and adopt orphans every ``adopt_every_s``.

        Each keeps its own schedule whether or not its last attempt failed: a failing flush
        never skips adoption, and is retried once per interval rather than on every tick.
        """
        next_flush = time.monotonic() + self.interval_s
        next_adopt = time.monotonic() + self.adopt_every_s
        tick = self.fsync_interval_s or self.interval_s
        while not self._stop.is_set():
            self._wake.wait(timeout=min(tick, self.interval_s))
            woken = self._wake.is_set()
            self._wake.clear()
            if self.fsync_interval_s is not None:
                self.writer.sync()
            now = time.monotonic()
            if woken or now >= next_flush:
                next_flush = now + self.interval_s
                _logging_failure(self.flush, "spool flush")
            if now >= next_adopt:
                next_adopt = now + self.adopt_every_s
                _logging_failure(self.adopt_orphans, "orphan adoption")

    def flush(self) -> int:
        """Seal the active segments and commit every sealed segment of this writer."""
        self.writer.seal()
        return self.commit_directory(self.writer.directory, self.writer.writer_id)

    def commit_directory(self, directory: Path, writer_id: str) -> int:
        """Commit the sealed segments in ``directory`` per table, oldest first, then delete them.

        A table that fails does not stop the others; ``SpoolCommitError`` is raised afterwards.
        """
        own = directory == self.writer.directory
        by_table: dict[str, list[tuple[int, Path]]] = {}
        for path in directory.iterdir():
            parsed = parse_segment_name(path.name)
            if parsed is None:
                continue
            table, seq = parsed
            if own and self.writer.is_active(table, seq):
                continue
            by_table.setdefault(table, []).append((seq, path))
        committed = 0
        failures: dict[str, Exception] = {}
        with self._commit_lock:
            for table, segments in by_table.items():
                try:
                    committed += self._commit_segments(table, sorted(segments), writer_id)
                except Exception as error:
                    failures[table] = error
        self.committed_rows += committed
        if failures:
            first = next(iter(failures.values()))
            raise SpoolCommitError(
                f"could not commit {', '.join(failures)} from {directory}"
            ) from first
        return committed

    def _table(self, table: str) -> TableWriter:
        if table not in self._tables:
            self._tables[table] = self.lake.writer(table)
        return self._tables[table]

    def _last_committed(self, table: str, writer_id: str) -> int | None:
        """Ask Delta once per (table, writer); afterwards this flusher knows its own commits."""
        if (table, writer_id) not in self._committed:
            committed = self._table(table).committed_app_version(writer_id)
            self._committed[(table, writer_id)] = committed
        return self._committed[(table, writer_id)]

    def _commit_segments(self, table: str, segments: list[tuple[int, Path]], writer_id: str) -> int:
        already = self._last_committed(table, writer_id)
        pending = [(seq, path) for seq, path in segments if already is None or seq > already]
        for seq, path in segments:
            if already is not None and seq <= already:
                self._remove_committed(table, seq, path, writer_id)
        if not pending:
            return 0
        model = LANDING_MODELS[table]
        parts = [self._decodable_rows(path, table, writer_id) for _, path in pending]
        data = dedupe_on_key(pa.concat_tables(parts), model.key)
        if data.num_rows:
            try:
                self._table(table).append(
                    data,
                    app_id=writer_id,
                    app_version=pending[-1][0],
                    metadata={"claw.writer_id": writer_id, "claw.segments": str(len(pending))},
                )
            except Exception:
                # It may have landed all the same (on an object store, a PUT whose answer was
                # lost): the next try asks Delta again instead of trusting what we knew.
                self._committed.pop((table, writer_id), None)
                raise
            self._committed[(table, writer_id)] = pending[-1][0]
        for seq, path in pending:
            self._remove_committed(table, seq, path, writer_id)
        return data.num_rows

    def _remove_committed(self, table: str, seq: int, path: Path, writer_id: str) -> None:
        path.unlink(missing_ok=True)
        if writer_id == self.writer.writer_id:
            self.writer.landed(table, seq)

    def _decodable_rows(self, path: Path, table: str, writer_id: str) -> pa.Table:
        """The segment's rows; frames that cannot be decoded are quarantined, with an ERROR."""
        rows, undecodable = spool_codec.decode_salvaging(path.read_bytes(), table)
        if undecodable:
            target = quarantine_frames(self.writer.root, writer_id, path, undecodable)
            log.error(
                "%d undecodable %s row(s) of spool segment %s moved to %s",
                len(undecodable),
                table,
                path,
                target,
            )
        return rows

    def adopt_orphans(self) -> int:
        """Commit and remove the spool directories of processes that are gone.

        A directory that fails is logged and left for the next round; it never stops the others,
        nor the proxy from starting.
        """
        adopted = 0
        root = self.writer.root
        for directory in sorted(p for p in root.iterdir() if p.is_dir()):
            if directory == self.writer.directory:
                continue
            lock_path = directory / LOCK_NAME
            try:
                fd = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                adopted += self.commit_directory(directory, directory.name)
                shutil.rmtree(directory, ignore_errors=True)
            except Exception:
                log.exception("adopting %s failed; it stays spooled and is retried", directory)
            finally:
                os.close(fd)
        if adopted:
            log.info("adopted %d spooled rows from stopped writers", adopted)
        return adopted

    def stop(self) -> None:
        """Stop the thread and commit everything still spooled (graceful shutdown)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        _logging_failure(self.flush, "final spool flush")


def _logging_failure(action: Callable[[], object], what: str) -> None:
    """Run a background step; a failure is logged and its rows stay spooled for a later try."""
    try:
        action()
    except Exception:
        log.exception("%s failed; spooled rows stay on disk and are retried", what)
