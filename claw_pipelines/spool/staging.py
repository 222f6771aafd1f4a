"""Staged commits: a fleet's proxies hand their sealed spool segments to one committer through
the lake, instead of each committing every landing table itself.

Every Delta commit is read by every other writer of its table: delta-rs reads each winning log
entry before it retries, and a writer's handle reads them to catch up. So N proxies that each
commit a table once per window make its log cost grow with N², and past a few writers the appends
race (16 writers on one S3 server: six tries an append, one append a second per table; see
docs/benchmarks.md). Staged, a proxy's flush writes its new sealed segments, as spooled, in one
*bundle* under ``_staging/`` in the lake, and the process holding the commit lease
(``lease.COMMIT_LEASE_TABLE``) commits every bundle it finds once per window: one append per
table per window for the whole fleet, which no proxy needs to read.

Exactly once: a bundle keeps its writer's id and segment sequence numbers, and the committer
appends each table's rows with one app transaction per writer (its highest sequence number), as
a proxy's own commit does; a segment at or below its writer's transaction version is already in
the table and is dropped (a bundle staged again by an adopter, or committed just before a crash).
A bundle is deleted only once every table committed it, and a proxy deletes a spooled segment
only once the bundle it went out in is gone. Order: the committer appends turns, then rewards,
then completions (``COMMIT_ORDER``) and stops at a failure, so a row that closes something
never lands before the turns spooled ahead of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from deltalake._internal import DeltaFileSystemHandler  # the public wrapper cannot write bytes
from pydantic import BaseModel

from claw_pipelines.lake.store import is_remote
from claw_pipelines.lake.tables import Lake, TableWriter
from claw_pipelines.lease import COMMIT_LEASE_TABLE, Lease
from claw_pipelines.schemas import LANDING_MODELS, utc_now
from claw_pipelines.spool import codec
from claw_pipelines.spool.commit_rules import (
    COMMIT_ORDER,
    SEGMENT_BYTES,
    dedupe_on_key,
    log_failure,
    runs_of_bytes,
)

log = logging.getLogger(__name__)

STAGING_DIR = "_staging"
QUARANTINE_DIR = "_staging_quarantine"
BUNDLE_SUFFIX = ".bundle"
LEASE_S = 15.0
"""How long the committer holds the commit lease without renewing: how long the fleet's rows
wait when the committer dies, before another proxy takes over."""
TRANSFERS = 16
"""Bundles the committer reads or deletes at once: each is a request or two to the store."""
_HEADER_LENGTH = struct.Struct("<Q")


class StagedSegment(BaseModel):
    """One spool segment in a bundle: its table, sequence number and bytes."""

    table: str
    seq: int
    length: int


class BundleHeader(BaseModel):
    writer_id: str
    segments: list[StagedSegment]


def pack_bundle(writer_id: str, segments: list[tuple[str, int, bytes]]) -> bytes:
    """A bundle: the header's length, the header (JSON), then each segment's bytes as spooled."""
    header = BundleHeader(
        writer_id=writer_id,
        segments=[StagedSegment(table=t, seq=s, length=len(b)) for t, s, b in segments],
    )
    encoded = header.model_dump_json().encode()
    return b"".join([_HEADER_LENGTH.pack(len(encoded)), encoded, *(b for _, _, b in segments)])


def unpack_bundle(data: bytes) -> tuple[BundleHeader, list[bytes]]:
    """The header and the segments' bytes of a bundle (``ValueError`` if it is cut short)."""
    (length,) = _HEADER_LENGTH.unpack_from(data)
    start = _HEADER_LENGTH.size + length
    header = BundleHeader.model_validate(json.loads(data[_HEADER_LENGTH.size : start]))
    bodies = []
    for segment in header.segments:
        bodies.append(data[start : start + segment.length])
        start += segment.length
    if start != len(data):
        raise ValueError(f"a bundle of {len(data)} bytes whose header says {start}")
    return header, bodies


class StagingArea:
    """The lake's ``_staging/`` folder, through delta-rs's store (a local disk or an object
    store, with the lake's options): bundles appear whole or not at all."""

    def __init__(self, lake: Lake) -> None:
        if not is_remote(lake.root_uri):
            Path(lake.root_uri).mkdir(parents=True, exist_ok=True)
        self._store = DeltaFileSystemHandler(lake.root_uri, lake.storage_options or None)

    def put(self, name: str, data: bytes, folder: str = STAGING_DIR) -> None:
        stream = self._store.open_output_stream(f"{folder}/{name}")
        stream.write(data)
        stream.close()

    def listing(self) -> list[tuple[str, int]]:
        """The bundles staged now and their sizes, by name (one LIST)."""
        found = self._store.get_file_info_selector(STAGING_DIR, True, False)
        named = ((info.path.rsplit("/", 1)[-1], info.size) for info in found)
        return sorted((name, size) for name, size in named if name.endswith(BUNDLE_SUFFIX))

    def read(self, name: str) -> bytes:
        file = self._store.open_input_file(f"{STAGING_DIR}/{name}")
        try:
            return file.read(file.size())
        finally:
            file.close()

    def exists(self, name: str) -> bool:
        try:
            self._store.open_input_file(f"{STAGING_DIR}/{name}").close()
        except FileNotFoundError:
            return False
        return True

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # a local store says so; S3 does not
            self._store.delete_file(f"{STAGING_DIR}/{name}")


@dataclass(frozen=True)
class Sealed:
    """A sealed spool segment as a stager sees it."""

    table: str
    seq: int
    path: Path
    rows: int = 0


@dataclass
class Stager:
    """A proxy's side: stages new sealed segments in bundles and learns which have landed."""

    area: StagingArea
    max_bytes: int = SEGMENT_BYTES
    outstanding: dict[str, dict[str, list[Sealed]]] = field(default_factory=dict)
    """Per writer id, the bundles staged and not seen committed yet, with their segments."""

    def deliver(
        self, writer_id: str, sealed: list[Sealed], landed: Callable[[Sealed], None]
    ) -> int:
        """Call ``landed`` for each segment whose bundle is gone (committed), then, unless a
        bundle of this writer still waits, stage the sealed segments not staged yet (in
        bundles of at most ``max_bytes``, in commit order). The rows landed.

        One bundle at a time per writer is the fleet's back-pressure: while the committer is
        behind, a writer's rows gather into its next bundle instead of more bundles, so a
        round's requests stay about one per writer whatever the backlog."""
        staged = self.outstanding.setdefault(writer_id, {})
        rows = 0
        for name in list(staged):
            if not self.area.exists(name):
                for segment in staged.pop(name):
                    landed(segment)
                    rows += segment.rows
        if staged:
            return rows
        fresh = [s for s in _in_commit_order(sealed) if s.path.exists()]
        for bundle in runs_of_bytes(fresh, lambda s: s.path.stat().st_size, self.max_bytes):
            contents = [(s, s.path.read_bytes()) for s in bundle]
            counted = [
                Sealed(s.table, s.seq, s.path, len(codec.scan(data).frames)) for s, data in contents
            ]
            name = f"{writer_id}.{time.time_ns():020d}.{uuid.uuid4().hex[:8]}{BUNDLE_SUFFIX}"
            self.area.put(name, pack_bundle(writer_id, [(s.table, s.seq, d) for s, d in contents]))
            staged[name] = counted
        return rows

    def waiting(self, writer_id: str) -> bool:
        """Whether bundles of ``writer_id`` wait to be committed."""
        return bool(self.outstanding.get(writer_id))


def _in_commit_order(sealed: list[Sealed]) -> list[Sealed]:
    return sorted(sealed, key=lambda s: (COMMIT_ORDER.index(s.table), s.seq))


@dataclass
class AppVersions:
    """The writers' app transaction versions in one table, as of one version of one handle.

    delta-rs answers ``transaction_version`` by replaying the table's log from its last
    checkpoint, reading every entry again (a GET each on an object store): asked for each of
    16 writers in each round, that was most of a round's requests and time. The committer asks
    once per writer and handle, then adds what it commits itself; a table that moved by any
    other commit, or a handle re-opened, starts over.
    """

    handle: DeltaTable | None = None
    version: int | None = None
    known: dict[str, int | None] = field(default_factory=dict)

    def of(self, snapshot: DeltaTable, writer_id: str) -> int | None:
        """``writer_id``'s version in ``snapshot``."""
        if snapshot is not self.handle or snapshot.version() != self.version:
            self.handle, self.version, self.known = snapshot, snapshot.version(), {}
        if writer_id not in self.known:
            self.known[writer_id] = snapshot.transaction_version(writer_id)
        return self.known[writer_id]

    def committed(self, version: int, apps: dict[str, int]) -> None:
        """Our commit of ``apps`` made ``version``: known still, unless others committed too."""
        if self.version is not None and version == self.version + 1:
            self.version = version
            self.known.update(apps)
        else:
            self.handle = None


@dataclass
class Committer:
    """The fleet's side: whichever process holds the commit lease commits the staged bundles,
    once per ``window_s``, from a background thread."""

    lake: Lake
    holder: str
    window_s: float = 1.0
    lease_s: float = LEASE_S
    max_bytes: int = SEGMENT_BYTES

    def __post_init__(self) -> None:
        self.area = StagingArea(self.lake)
        self.lease = Lease(self.lake, self.holder, self.lease_s, COMMIT_LEASE_TABLE)
        self.committed_rows = 0
        self._writers: dict[str, TableWriter] = {}
        self._apps = {table: AppVersions() for table in COMMIT_ORDER}
        self._held = False
        self._ask_at = 0.0
        self._round = threading.Lock()
        """One round at a time: a round reads what a table holds from the snapshot it then
        commits from, which another round on the same handle would move."""
        self._pool = ThreadPoolExecutor(TRANSFERS, thread_name_prefix="claw-committer-io")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claw-committer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a holder commits what is staged once more and lets the lease go."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._held:  # after a round still under way (commit_staged waits for it)
            log_failure(self.commit_staged, "final staged commit")
            log_failure(self.lease.release, "commit lease release")

    def _run(self) -> None:
        """A round every ``window_s`` from the start of the last (at once after a longer one),
        so a slow round does not add the window to every row's wait."""
        began = time.monotonic()
        while not self._stop.wait(max(0.0, began + self.window_s - time.monotonic())):
            began = time.monotonic()
            if self._holds():
                log_failure(self.commit_staged, "staged commit")

    def _holds(self) -> bool:
        """Whether this process may commit now. The holder renews the lease every third of
        ``lease_s`` and trusts it until the next ask, so it always has two thirds of the lease
        left; any other process asks again when the lease it saw runs out (a third to all of
        ``lease_s`` later): each ask is a few requests, and a fleet's proxies all ask."""
        now = time.monotonic()
        if now >= self._ask_at:
            try:
                self._held = self.lease.acquire()
            except Exception:
                log.exception("asking for the commit lease failed; asking again later")
                self._held = False
            self._ask_at = now + self._until_next_ask()
        return self._held

    def _until_next_ask(self) -> float:
        seen = self.lease.seen
        if self._held or seen is None or seen.expires_at is None:
            return self.lease_s / 3
        left = (seen.expires_at - utc_now()).total_seconds()
        return min(max(left, self.lease_s / 3), self.lease_s)

    def commit_staged(self) -> int:
        """Commit the staged bundles (oldest first, ``max_bytes`` of them at most) to the
        landing tables, table by table in ``COMMIT_ORDER``, then delete them; the rows
        committed. A table that fails stops the round: nothing is deleted, and the next round
        commits what is still missing."""
        with self._round:
            return self._commit_round()

    def _commit_round(self) -> int:
        began = time.monotonic()
        taken: list[str] = []
        size = 0
        for name, length in self.area.listing():
            if taken and size + length > self.max_bytes:
                break
            taken.append(name)
            size += length
        bundles: list[tuple[BundleHeader, list[bytes]]] = []
        for name, data in zip(taken, self._pool.map(self.area.read, taken), strict=True):
            try:
                bundles.append(unpack_bundle(data))
            except ValueError:
                self.area.put(name, data, folder=QUARANTINE_DIR)
                log.error("staged bundle %s is damaged; moved to %s", name, QUARANTINE_DIR)
        rows = 0
        for table in COMMIT_ORDER:
            if not self._holds():
                log.warning(
                    "lost the commit lease; %d staged bundles left to its holder", len(taken)
                )
                return rows
            rows += self._commit_table(table, bundles)
        list(self._pool.map(self.area.delete, taken))
        self.committed_rows += rows
        if taken:
            log.info("committed %d rows of %d bundles in %.2f s", rows, len(taken),
                     time.monotonic() - began)  # fmt: skip
        return rows

    def _commit_table(self, table: str, bundles: list[tuple[BundleHeader, list[bytes]]]) -> int:
        """One append of ``table``'s segments in ``bundles`` that it does not hold yet, with an
        app transaction per writer; the rows appended. What it holds is read from the snapshot
        the append commits from, so if another committer appended any of these writers' rows
        since, the append is refused instead of landing them twice."""
        writer, known = self._writer(table), self._apps[table]
        snapshot = writer.snapshot(LANDING_MODELS[table].arrow_schema())
        parts: list[pa.Table] = []
        apps: dict[str, int] = {}
        for header, bodies in bundles:
            writer_id = header.writer_id
            if not any(segment.table == table for segment in header.segments):
                continue
            done = known.of(snapshot, writer_id)
            for segment, body in zip(header.segments, bodies, strict=True):
                if segment.table != table or (done is not None and segment.seq <= done):
                    continue
                parts.append(self._rows(table, writer_id, segment, body))
                apps[writer_id] = max(apps.get(writer_id, -1), segment.seq)
        if not apps:
            return 0
        data = dedupe_on_key(pa.concat_tables(parts), LANDING_MODELS[table].key)
        metadata = {"claw.committer": self.holder}
        try:
            version = writer.append(data, apps=apps, metadata=metadata, snapshot=snapshot)
        except Exception:
            known.handle = None  # it may have landed all the same: ask the table again
            raise
        known.committed(version, apps)
        return data.num_rows

    def _writer(self, table: str) -> TableWriter:
        if table not in self._writers:
            self._writers[table] = self.lake.writer(table)
        return self._writers[table]

    def _rows(self, table: str, writer_id: str, segment: StagedSegment, body: bytes) -> pa.Table:
        """The segment's decodable rows; what cannot be decoded is kept in the lake's
        ``_staging_quarantine/`` folder, with an ERROR."""
        scan = codec.scan(body)
        rows, undecodable = codec.decode_salvaging(scan.frames, table)
        lost = [*undecodable, *scan.damaged]
        if lost:
            name = f"{writer_id}-{table}-{segment.seq}.quarantined"
            self.area.put(name, b"".join(lost), folder=QUARANTINE_DIR)
            log.error("%d undecodable piece(s) of a staged segment moved to %s", len(lost), name)
        return rows
