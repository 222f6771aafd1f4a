"""Commits the spool to Delta: sealed segments in micro-batches, from a background thread.

Each commit is tagged with a Delta app transaction ``(writer_id, segment_seq)``; a segment is
deleted only after its commit, and a commit that landed before a crash is recognised by its
transaction version and never applied twice. Directories whose owner died are adopted and
committed by any live process. Nothing a segment holds is dropped unseen: frames that cannot be
decoded and damaged bytes are moved to a quarantine file under the spool root, so they cannot
block the rest of the spool.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from claw_pipelines.lake.tables import Lake, TableWriter
from claw_pipelines.schemas import LANDING_MODELS
from claw_pipelines.spool import codec
from claw_pipelines.spool.commit_rules import (
    COMMIT_ORDER,
    SEGMENT_BYTES,
    dedupe_on_key,
    log_failure,
    runs_of_bytes,
)
from claw_pipelines.spool.staging import Sealed, Stager
from claw_pipelines.spool.writer import (
    LOCK_NAME,
    SpoolUnavailable,
    SpoolWriter,
    Waiting,
    parse_segment_name,
)

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"


def quarantine(
    root: Path, writer_id: str, segment: Path, pieces: list[bytes], kind: str = "quarantined"
) -> Path:
    """Keep what a segment holds but cannot land: undecodable frames (``quarantined``, in spool
    format) or damaged bytes (``damaged``), in ``<root>/quarantine/<writer>-<segment>.<kind>``.

    The file is written atomically under a fixed name, so quarantining the same segment again
    (a retry after a failed commit) rewrites identical content.
    """
    directory = root / QUARANTINE_DIR
    directory.mkdir(exist_ok=True)
    target = directory / f"{writer_id}-{segment.stem}.{kind}"
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as file:
        file.write(b"".join(pieces))
        file.flush()
        os.fsync(file.fileno())
    partial.replace(target)
    return target


@dataclass
class Schedule:
    """When the flusher flushes and adopts.

    A Delta commit costs about the same CPU whatever its size (tens of ms, measured by
    ``bench/capture_overhead.py``), and every commit is a version each reader of the table
    replays, so under traffic turns are committed by count or once the oldest has waited
    ``max_wait_s``, and otherwise once appends have paused for ``interval_s``: a busy proxy
    commits every few seconds instead of every second. A nudge (``woken``: ``max_rows`` reached,
    or a row that closes something landed, a trajectory's completion or a reward) asks for a
    flush at once, so what a batch waits for is in Delta with every turn before it; but no flush
    starts sooner than ``window_s`` after the last one started, so however many rows close
    trajectories, each table gets at most one commit per window, the closing rows of a window
    coalesced into it (``overfull``, rows past ``SpoolFlusher.max_bytes``, is the one exception:
    memory comes first). Sealed rows whose commit failed are retried once per ``interval_s``, not
    on every tick. Adoption keeps its own period, so a failing flush never holds it back.
    """

    interval_s: float
    adopt_every_s: float
    start: float
    max_wait_s: float = 5.0
    window_s: float = 0.0

    def __post_init__(self) -> None:
        self._next_flush = self.start + self.interval_s
        self._next_adopt = self.start + self.adopt_every_s
        self._window_ends = self.start
        self._wanted = False

    def due(
        self, now: float, woken: bool, waiting: Waiting, overfull: bool = False
    ) -> tuple[bool, bool]:
        """Whether to flush (a nudge or rows waiting as the class says, once the window since
        the last flush is over) and whether to adopt."""
        timed = now >= self._next_flush and self._rows_due(now, waiting)
        self._wanted = self._wanted or woken or timed
        flush = overfull or (self._wanted and now >= self._window_ends)
        if flush:
            self._wanted = False
            self._next_flush = now + self.interval_s
            self._window_ends = now + self.window_s
        adopt = now >= self._next_adopt
        if adopt:
            self._next_adopt = now + self.adopt_every_s
        return flush, adopt

    def pause(self, now: float, tick: float) -> float:
        """How long the flusher may sleep: ``tick``, or less when a flush asked for waits for
        its window to end."""
        if self._wanted:
            return max(0.0, min(tick, self._window_ends - now))
        return tick

    def _rows_due(self, now: float, waiting: Waiting) -> bool:
        if waiting.sealed_rows:
            return True
        if waiting.oldest_at is None or waiting.newest_at is None:
            return False
        paused = now - waiting.newest_at >= self.interval_s
        return paused or now - waiting.oldest_at >= self.max_wait_s


class SpoolCommitError(RuntimeError):
    """Some tables of a spool directory could not be committed; their segments stay on disk."""


@dataclass
class SpoolFlusher:
    """Commits sealed spool segments to Delta in micro-batches, in a background thread."""

    writer: SpoolWriter
    lake: Lake
    max_rows: int = 512
    max_bytes: int = SEGMENT_BYTES
    interval_s: float = 1.0
    max_wait_s: float = 5.0
    fsync_interval_s: float | None = 0.1
    adopt_every_s: float = 5.0
    window_s: float = 1.0
    """At most one flush per window (``Schedule``): the commit rate of each table."""
    stager: Stager | None = None
    """Set on a fleet that stages its segments for one committer (``spool.staging``): a
    flush stages them instead of committing them."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._overfull = threading.Event()
        self._commit_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._tables: dict[str, TableWriter] = {}
        self._committed: dict[tuple[str, str], int | None] = {}
        self.committed_rows = 0

    def start(self) -> None:
        self.adopt_orphans()
        self._thread = threading.Thread(target=self._run, name="claw-spool-flusher", daemon=True)
        self._thread.start()

    def nudge(self, urgent: bool = False) -> None:
        """Ask for an early flush, in the window's next commit: when ``urgent`` (a row that
        closes something landed) or the active segments hold ``max_rows``; at once when they
        hold ``max_bytes``."""
        rows, size = self.writer.active_load()
        if size >= self.max_bytes:
            self._overfull.set()
        if urgent or rows >= self.max_rows or self._overfull.is_set():
            self._wake.set()

    def _run(self) -> None:
        """Flush and adopt orphans when the ``Schedule`` says, which no attempt's outcome
        changes."""
        schedule = Schedule(
            self.interval_s, self.adopt_every_s, time.monotonic(), self.max_wait_s, self.window_s
        )
        tick = min(self.fsync_interval_s or self.interval_s, self.interval_s)
        while not self._stop.is_set():
            self._wake.wait(timeout=schedule.pause(time.monotonic(), tick))
            woken, overfull = self._wake.is_set(), self._overfull.is_set()
            self._wake.clear()
            self._overfull.clear()
            if self.fsync_interval_s is not None:
                with contextlib.suppress(SpoolUnavailable):  # logged once per episode
                    self.writer.sync()
            waiting = self.writer.waiting()
            flush, adopt = schedule.due(time.monotonic(), woken, waiting, overfull)
            if flush:
                log_failure(self.flush, "spool flush")
            if adopt:
                log_failure(self.adopt_orphans, "orphan adoption")

    def flush(self) -> int:
        """Seal the active segments and commit every sealed segment of this writer."""
        self.writer.seal()
        return self.commit_directory(self.writer.directory, self.writer.writer_id)

    def commit_directory(self, directory: Path, writer_id: str) -> int:
        """Commit the sealed segments in ``directory``, one commit per table (``max_bytes`` at
        most each), oldest first, then delete them; the rows landed. With a ``stager``, stage
        them instead, and delete those whose bundle was committed since.

        The tables go in ``COMMIT_ORDER``: the rows that close something (completions,
        rewards) land after the turns spooled before them, never first; so a closing table
        waits for the next flush when a table before it failed. Any other failing table does
        not stop the others; ``SpoolCommitError`` is raised afterwards.
        """
        by_table = self._sealed(directory)
        if self.stager is not None:
            sealed = [
                Sealed(t, seq, path) for t, segments in by_table.items() for seq, path in segments
            ]
            with self._commit_lock:
                landed = self.stager.deliver(
                    writer_id,
                    sealed,
                    lambda s: self._remove_committed(s.table, s.seq, s.path, writer_id),
                )
            self.committed_rows += landed
            return landed
        committed = 0
        failures: dict[str, Exception] = {}
        with self._commit_lock:
            for table in sorted(by_table, key=COMMIT_ORDER.index):
                if failures and LANDING_MODELS[table].closes:
                    failures[table] = SpoolCommitError(f"{table} waits for {', '.join(failures)}")
                    continue
                segments = by_table[table]
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

    def _sealed(self, directory: Path) -> dict[str, list[tuple[int, Path]]]:
        """Per table, the (sequence number, path) of the sealed segments in ``directory``."""
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
        return by_table

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
        return sum(
            self._commit_batch(table, batch, writer_id)
            for batch in runs_of_bytes(pending, lambda s: s[1].stat().st_size, self.max_bytes)
        )

    def _commit_batch(self, table: str, segments: list[tuple[int, Path]], writer_id: str) -> int:
        """One Delta commit of ``segments``' rows, tagged with the last one's sequence number."""
        model = LANDING_MODELS[table]
        parts = [self._decodable_rows(path, table, writer_id) for _, path in segments]
        data = dedupe_on_key(pa.concat_tables(parts), model.key)
        if data.num_rows:
            try:
                self._table(table).append(
                    data,
                    apps={writer_id: segments[-1][0]},
                    metadata={"claw.writer_id": writer_id, "claw.segments": str(len(segments))},
                )
            except Exception:
                # It may have landed all the same (on an object store, a PUT whose answer was
                # lost): the next try asks Delta again instead of trusting what we knew.
                self._committed.pop((table, writer_id), None)
                raise
            self._committed[(table, writer_id)] = segments[-1][0]
        for seq, path in segments:
            self._remove_committed(table, seq, path, writer_id)
        return data.num_rows

    def _remove_committed(self, table: str, seq: int, path: Path, writer_id: str) -> None:
        path.unlink(missing_ok=True)
        if writer_id == self.writer.writer_id:
            self.writer.landed(table, seq)

    def _decodable_rows(self, path: Path, table: str, writer_id: str) -> pa.Table:
        """The segment's rows. Nothing it holds is dropped unseen: frames that cannot be decoded
        and damaged bytes are quarantined, with an ERROR; a torn tail (a write a crash cut
        short, whose call was never answered) is dropped with a WARNING."""
        scan = codec.scan(path.read_bytes())
        rows, undecodable = codec.decode_salvaging(scan.frames, table)
        root = self.writer.root
        if undecodable:
            target = quarantine(root, writer_id, path, undecodable)
            log.error("%d undecodable row(s) of %s moved to %s", len(undecodable), path, target)
        if scan.damaged:
            target = quarantine(root, writer_id, path, scan.damaged, kind="damaged")
            log.error("%d damaged stretch(es) of %s moved to %s", len(scan.damaged), path, target)
        if scan.torn_tail:
            log.warning(
                "dropped the torn last %d bytes of %s: a write cut short by a crash, whose call "
                "was never answered",
                scan.torn_tail,
                path,
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
                if not self._sealed(directory):  # staged segments stay until committed
                    shutil.rmtree(directory, ignore_errors=True)
            except Exception:
                log.exception("adopting %s failed; it stays spooled and is retried", directory)
            finally:
                os.close(fd)
        if adopted:
            log.info("adopted %d spooled rows from stopped writers", adopted)
        return adopted

    def stop(self, staged_wait_s: float = 10.0) -> None:
        """Stop the thread and commit everything still spooled (graceful shutdown); staged,
        wait up to ``staged_wait_s`` for the committer. What does not land stays spooled, for
        the next process on this spool (or any that adopts it) to stage again."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        log_failure(self.flush, "final spool flush")
        deadline = time.monotonic() + staged_wait_s
        writer_id = self.writer.writer_id
        while self.stager is not None and self.stager.waiting(writer_id):
            if time.monotonic() > deadline:
                log.warning(
                    "staged rows were not committed within %s s; they stay spooled", staged_wait_s
                )
                return
            time.sleep(0.2)
            log_failure(self.flush, "final spool flush")
