"""The local spool: where a row becomes durable before its answer leaves the proxy.

Each proxy process owns one spool directory (named by its writer id and held with an exclusive
``flock``). Rows are appended to one active segment per table, one frame per row (format in
``codec``). A frame is written whole or not at all: a short write (a full disk) is cut back
off the file and the call fails with 503 (``SpoolUnavailable``), so no later frame ever follows a
torn one and no answer is given for a row that is not there. A killed process leaves at most a
torn last frame, of a turn that was never answered. ``flusher`` commits sealed segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from claw_pipelines.schemas import LANDING_MODELS, LandingRow
from claw_pipelines.spool import codec

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
SEGMENT_SUFFIX = ".spool"


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


RETRY_AFTER_S = 2
"""What a 503 for a spool that cannot be written asks the client to wait: about two flushes,
which free the space of the segments they commit."""


class SpoolUnavailable(RuntimeError):
    """A row could not be made durable in the spool (disk full, I/O error, failed fsync).

    The call fails with 503 and ``Retry-After`` instead of answering 200 for a row that may never
    land. ``status_code``, ``headers`` and ``message`` are what LiteLLM's proxy answers with when a
    hook raises an exception that carries them, and what the ``/claw/v1`` endpoints answer.
    """

    status_code = 503

    def __init__(self, what: str, error: OSError) -> None:
        reason = error.strerror or type(error).__name__
        self.message = f"the capture spool cannot {what} ({reason}); retry later"
        self.headers = {"Retry-After": str(RETRY_AFTER_S)}
        super().__init__(self.message)


class SpoolErrorsLoggedOnce(logging.Filter):
    """Drops another logger's record of a ``SpoolUnavailable`` (LiteLLM logs every failed call
    with its traceback): the spool logs a shortage once when it starts and once when it ends."""

    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[1] if record.exc_info else None
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(value, SpoolUnavailable) for value in (raised, *args))


class _Episode:
    """Logs a run of spool failures once when it starts and once when it ends, not per call."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, error: OSError) -> None:
        with self._lock:
            self.failures += 1
            first = self.failures == 1
        if first:
            log.error("spool %s failed (%s); calls get 503 until it works again", self.what, error)

    def succeeded(self) -> None:
        if not self.failures:  # the common case, without taking the lock
            return
        with self._lock:
            failures, self.failures = self.failures, 0
        if failures:
            log.warning("spool %s works again after %d failure(s)", self.what, failures)


@dataclass(frozen=True)
class Waiting:
    """What waits for a commit: when the oldest and the newest row of the active segments were
    appended (``time.monotonic``; None when they are empty), and the rows of sealed segments
    not committed yet."""

    oldest_at: float | None
    newest_at: float | None
    sealed_rows: int


@dataclass
class _ActiveSegment:
    seq: int
    fd: int
    rows: int = 0
    size: int = 0
    """Bytes of the complete frames in the file: where a failed write is cut back to."""
    torn: bool = False
    """A failed write left bytes past ``size`` that could not be cut off yet."""


@dataclass
class SpoolWriter:
    """Appends landing rows to this process's spool directory.

    An append writes the whole frame or fails: a short write (a full disk) is cut back off the
    file before the error is raised, so a later frame never follows a torn one, and the caller
    fails the call (``SpoolUnavailable``) instead of answering for a row that is not there.
    """

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
        self._sync_error: OSError | None = None
        self._oldest_at: float | None = None
        self._newest_at: float | None = None
        self._fsync_task: asyncio.Future | None = None
        self.write_failures = _Episode("write")
        self.fsync_failures = _Episode("fsync")

    def append(self, row: LandingRow) -> None:
        """Write one row to its table's active segment whole, or raise ``SpoolUnavailable``."""
        table = row.table_name
        message = codec.encode(row)
        with self._mutex:
            try:
                segment = self._active.get(table) or self._open_segment(table)
                _write_frame(segment, message)
            except OSError as error:
                self.write_failures.failed(error)
                raise SpoolUnavailable("store this row", error) from error
            segment.rows += 1
            segment.size += len(message)
            self._dirty.add(segment.fd)
            self._newest_at = time.monotonic()
            self._oldest_at = self._oldest_at or self._newest_at
        self.write_failures.succeeded()

    def _open_segment(self, table: str) -> _ActiveSegment:
        seq = self._next_seq.get(table, 0)
        path = self.directory / segment_name(table, seq)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        self._next_seq[table] = seq + 1
        segment = _ActiveSegment(seq, fd)
        self._active[table] = segment
        return segment

    def is_active(self, table: str, seq: int) -> bool:
        """Whether ``seq`` is the table's segment still being appended to."""
        with self._mutex:
            segment = self._active.get(table)
            return segment is not None and segment.seq == seq

    def active_load(self) -> tuple[int, int]:
        """Rows and bytes in the active segments (what the next flush would seal)."""
        with self._mutex:
            return self._active_rows(), sum(s.size for s in self._active.values())

    def waiting(self) -> Waiting:
        with self._mutex:
            return Waiting(self._oldest_at, self._newest_at, sum(self._sealed_rows.values()))

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
        less durable than the fsync policy promised; a failed fsync is raised by the next
        ``sync`` (the answers waiting for it fail), and the rows are committed all the same.
        """
        with self._mutex:
            for table, segment in list(self._active.items()):
                if not segment.rows:
                    continue
                if segment.torn:  # what is left past the last frame was never answered
                    with contextlib.suppress(OSError):
                        os.ftruncate(segment.fd, segment.size)
                if segment.fd in self._dirty:
                    self._dirty.discard(segment.fd)
                    try:
                        os.fsync(segment.fd)
                    except OSError as error:
                        self._sync_error = self._sync_error or error
                os.close(segment.fd)
                self._sealed_rows[(table, segment.seq)] = segment.rows
                del self._active[table]
            self._oldest_at = self._newest_at = None

    def sync(self) -> None:
        """fsync every segment written since the last sync (one call serves many answers).

        Raises ``SpoolUnavailable`` if an fsync failed (here or in a seal since the last sync):
        the rows it covered may not survive a power loss.
        """
        with self._mutex:
            dirty, self._dirty = self._dirty, set()
            failure, self._sync_error = self._sync_error, None
            fds = [os.dup(fd) for fd in dirty]  # a seal may close the originals meanwhile
        try:
            for fd in fds:
                try:
                    os.fsync(fd)
                except OSError as error:
                    failure = failure or error
        finally:
            for fd in fds:
                os.close(fd)
        if failure is not None:
            self.fsync_failures.failed(failure)
            raise SpoolUnavailable("make this row durable", failure) from failure
        self.fsync_failures.succeeded()

    async def durable(self) -> None:
        """Group commit: with per-answer fsync, wait until the rows appended so far are on disk.

        Concurrent answers share one fsync running in a thread, so the event loop never blocks
        and the cost is amortised over everything appended meanwhile. An fsync that was already
        running may have started before this row was written, so it is waited out and the next
        one, which covers the row, decides. Raises ``SpoolUnavailable`` if that fsync failed.
        """
        if not self.fsync_per_answer:
            return
        while True:
            running = self._fsync_task
            if running is None or running.done():
                task = asyncio.ensure_future(asyncio.to_thread(self.sync))
                task.add_done_callback(_retrieve_exception)
                self._fsync_task = task
                await asyncio.shield(task)
                return
            await asyncio.wait([running])

    def close(self) -> None:
        self.seal()
        with self._mutex:
            for segment in self._active.values():
                os.close(segment.fd)
            self._active.clear()
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)


def _write_frame(segment: _ActiveSegment, frame: bytes) -> None:
    """Append ``frame`` whole, or cut the file back to its last complete frame and raise.

    A torn write left by an earlier failure is cut off first; if it cannot be, nothing is
    appended after it.
    """
    if segment.torn:
        os.ftruncate(segment.fd, segment.size)
        segment.torn = False
    view = memoryview(frame)
    written = 0
    try:
        while written < len(frame):
            written += os.write(segment.fd, view[written:])
    except OSError:
        if written:
            segment.torn = True
            with contextlib.suppress(OSError):
                os.ftruncate(segment.fd, segment.size)
                segment.torn = False
        raise


def _retrieve_exception(task: asyncio.Future) -> None:
    """Mark a shared fsync's failure as seen: the answers that waited for it have raised it."""
    if not task.cancelled():
        task.exception()
