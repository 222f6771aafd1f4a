"""Maintenance without Dagster (``claw_pipelines.maintenance``): a pass compacts, checkpoints and
cleans up the landing tables and keeps every row, even killed part-way; one process at a time
holds the lease; a refresh's reads do not grow with the table's age."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from claw_pipelines import maintenance
from claw_pipelines.lake import Lake, properties
from claw_pipelines.lake.changes import changes, data_commits
from claw_pipelines.lake.commits import watermark_app
from claw_pipelines.lease import Lease
from claw_pipelines.maintenance import (
    SUPERSEDED_AFTER,
    LeaseLost,
    Maintainer,
    Retention,
    drop_superseded_checkpoints,
    maintain_lake,
    maintain_table,
)
from claw_pipelines.schemas import Turn, rows_to_arrow, utc_now

NOW = Retention(
    vacuum_retention_hours=0,
    enforce_retention_duration=False,
    log_retention_minutes=60,
    compact_after_files=16,
)
"""Vacuum at once; log entries go after an hour (the tests age them with ``_age_log``)."""


def _turn(index: int) -> Turn:
    now = utc_now()
    return Turn(
        turn_id=f"turn-{index:06d}",
        trajectory_id=f"traj-{index // 3:06d}",
        model="m",
        started_at=now,
        ended_at=now,
        prompt_token_ids=[1, 2, 3],
    )


def _land(lake: Lake, commits: int, first: int = 0) -> None:
    """``commits`` commits of one turn each, as a proxy under steady traffic makes them."""
    writer = lake.writer("turns")
    for index in range(first, first + commits):
        writer.append(rows_to_arrow(Turn, [_turn(index).model_dump()]))


def _age_log(lake: Lake, hours: float = 2, relative: bool = False) -> None:
    """Date the log entries written so far ``hours`` back (log cleanup goes by their age):
    to that time, or with ``relative`` each by that much (the clock moved on)."""
    then = time.time() - hours * 3600
    for entry in Path(lake.uri("turns"), "_delta_log").iterdir():
        when = entry.stat().st_mtime - hours * 3600 if relative else then
        os.utime(entry, (when, when))


def _log_bytes(lake: Lake) -> int:
    return sum(entry.stat().st_size for entry in Path(lake.uri("turns"), "_delta_log").iterdir())


def _data_files(lake: Lake) -> int:
    return len(list(Path(lake.uri("turns")).glob("*.parquet")))


def _turn_ids(lake: Lake) -> list[str]:
    return sorted(lake.scan("turns").collect().get_column("turn_id"))


def test_a_pass_compacts_checkpoints_and_cleans_up_and_keeps_every_row(tmp_path: Path) -> None:
    """The first pass merges the files and deletes the aged log before the last checkpoint,
    which lists every small file: it goes once the commits after it are as old (second pass)."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 120)
    _age_log(lake)
    landed, log_bytes, files = _turn_ids(lake), _log_bytes(lake), _data_files(lake)
    lease = Lease(lake, "proxy-1", 60)
    passes = maintain_lake(lake, NOW, lease)
    assert [(p.table, p.files_before, p.files_after) for p in passes] == [("turns", 120, 1)]
    assert passes[0].log_cleaned and passes[0].vacuumed == 120
    assert _data_files(lake) == 1 < files
    assert _log_bytes(lake) < log_bytes * 0.75
    _age_log(lake)
    maintain_lake(lake, NOW, lease)
    assert _log_bytes(lake) < log_bytes / 10
    assert _turn_ids(lake) == landed
    _land(lake, 2, first=120)  # the proxies append on
    assert len(_turn_ids(lake)) == 122


def _codecs(lake: Lake) -> set[str]:
    """The compression of every column chunk of ``turns``' live files."""
    chunks = set()
    for uri in lake.open("turns").file_uris():
        metadata = pq.ParquetFile(uri.removeprefix("file://")).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            chunks |= {row_group.column(i).compression for i in range(row_group.num_columns)}
    return chunks


def test_the_proxies_and_compaction_write_zstd_files(tmp_path: Path) -> None:
    """Writer properties that name no codec make delta-rs write uncompressed Parquet: the
    landing tables' files were, until they named zstd, as the proxies append them and as
    maintenance merges them."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 20)
    appended = _codecs(lake)
    (merged,) = maintain_lake(lake, NOW, Lease(lake, "proxy-1", 60))
    assert merged.files_after < merged.files_before
    assert appended == _codecs(lake) == {"ZSTD"}


def test_the_log_and_files_a_lagging_reader_has_yet_to_read_are_kept(tmp_path: Path) -> None:
    """``steps`` read turns up to version 10: the pass compacts, but neither deletes the log
    entries after it nor vacuums the files they added, so the reader reads on by version."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 40)
    lake.append("steps", pa.table({"step_id": ["s"]}),
                apps={watermark_app("steps", "turns"): 10})  # fmt: skip
    _age_log(lake)
    (done,) = maintain_lake(lake, NOW, Lease(lake, "proxy-1", 60))
    assert done.files_after == 1 and not done.log_cleaned and done.vacuumed == 0
    turns = lake.open("turns")
    new = changes(turns, 10, turns.version(), ["turn_id"])
    assert new.height == 30


def _listed_removes(lake: Lake) -> int:
    """Removed files (tombstones) the latest checkpoint of ``turns`` lists."""
    checkpoint = max(Path(lake.uri("turns"), "_delta_log").glob("*.checkpoint.parquet"))
    return pl.read_parquet(checkpoint).get_column("remove").is_not_null().sum()


def test_checkpoints_list_removed_files_for_the_log_retention_only(tmp_path: Path) -> None:
    """Delta keeps a removed file in every checkpoint for 7 days, so a landing table's
    checkpoints grew with every small file compaction merged away. They list them for the log
    retention only (here 0), and the vacuum still deletes them once old enough: from what no
    version refers to, by their age."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 40)
    short = Retention.model_construct(
        **(NOW.model_dump() | {"log_retention_minutes": 0, "vacuum_retention_hours": 1})
    )
    (done,) = maintain_lake(lake, short, Lease(lake, "proxy-1", 60))
    assert (done.files_after, done.vacuumed, _listed_removes(lake)) == (1, 0, 0)
    assert _data_files(lake) == 41  # merged away an instant ago: kept for the retention
    then = time.time() - 2 * 3600
    for data_file in Path(lake.uri("turns")).glob("*.parquet"):
        os.utime(data_file, (then, then))
    (done,) = maintain_lake(lake, short, Lease(lake, "proxy-1", 60))
    assert done.vacuumed == 40 and _data_files(lake) == 1
    assert _turn_ids(lake) == [f"turn-{i:06d}" for i in range(40)]


def test_checkpoints_superseded_minutes_ago_are_deleted_however_young(tmp_path: Path) -> None:
    """A checkpoint every 25 commits made up most of a small table's log. A pass deletes each
    checkpoint whose successor is older than ``SUPERSEDED_AFTER`` (a handle opened before it
    may still read it) but one per ``ANCHOR_SPACING`` (the log cleanup's), keeps the latest,
    and the table opens and reads whole."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 105)  # checkpoints at 24, 49, 74 and 99
    log = Path(lake.uri("turns"), "_delta_log")
    checkpoints = sorted(log.glob("*.checkpoint.parquet"))
    assert len(checkpoints) == 4
    then = time.time() - SUPERSEDED_AFTER.total_seconds() - 60
    for seconds, checkpoint in zip([0, 10, 20], checkpoints, strict=False):  # 99 stays young
        os.utime(checkpoint, (then + seconds, then + seconds))
    # 24 anchors the cleanup, 74 is superseded only just now: 49 goes
    assert drop_superseded_checkpoints(lake, lake.open("turns"), utc_now()) == 1
    assert sorted(log.glob("*.checkpoint.parquet")) == [checkpoints[0], *checkpoints[2:]]
    assert len(_turn_ids(lake)) == 105
    maintain_lake(lake, NOW, Lease(lake, "proxy-1", 60))  # its checkpoint supersedes 99 now
    assert len(list(log.glob("*.checkpoint.parquet"))) == 4  # 24, 74, 99 and the pass's own
    assert len(_turn_ids(lake)) == 105


def test_under_steady_traffic_the_log_keeps_about_the_retention(tmp_path: Path) -> None:
    """Twelve minutes of commits with a pass each minute (the clock moved by dating the log
    back): the cleanup deletes the entries older than the log retention, up to a checkpoint
    that old (``ANCHOR_SPACING``). Dropping every superseded checkpoint within minutes had
    left none that old, and the log kept every entry ever written."""
    lake = Lake(str(tmp_path / "lake"))
    retention = Retention(
        vacuum_retention_hours=0,
        enforce_retention_duration=False,
        log_retention_minutes=5,
        compact_after_files=16,
    )
    lease = Lease(lake, "proxy-1", 60)
    log = Path(lake.uri("turns"), "_delta_log")
    for minute in range(12):
        _land(lake, 20, first=20 * minute)
        maintain_lake(lake, retention, lease)
        _age_log(lake, hours=1 / 60, relative=True)
    entries = sorted(int(e.name.split(".")[0]) for e in log.glob("*.json"))
    assert entries[-1] - entries[0] < 8 * 25  # about 7 minutes of the 12 (~25 versions each)
    assert len(list(log.glob("*.checkpoint.parquet"))) <= 12
    assert _turn_ids(lake) == [f"turn-{i:06d}" for i in range(240)]


def _read_up_to(lake: Lake, version: int) -> None:
    """``steps`` records that it read turns up to ``version`` (its watermark)."""
    lake.append("steps", pa.table({"step_id": [f"s{version}"]}),
                apps={watermark_app("steps", "turns"): version})  # fmt: skip


def _new_turn_ids(lake: Lake, after: int | None) -> list[str]:
    """The turns a reader whose watermark is ``after`` reads next (an ``Increment``'s read)."""
    turns = lake.open("turns")
    return sorted(changes(turns, after, turns.version(), ["turn_id"]).get_column("turn_id"))


def test_a_reader_whose_read_log_was_cleaned_up_reads_every_new_row_once(tmp_path: Path) -> None:
    """The entries up to a reader's watermark are deleted (it read them): it reads the rows
    landed since from the entries after it, each once; a reader that never read the table reads
    its snapshot, each row once, whatever the log has lost."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 40)
    lease, first_read = Lease(lake, "proxy-1", 60), lake.version("turns")
    for _ in range(2):  # the second pass deletes up to the first one's checkpoint
        read = lake.version("turns")
        _read_up_to(lake, read)
        _age_log(lake)
        (done,) = maintain_lake(lake, NOW, lease)
        assert done.log_cleaned
    assert not Path(lake.uri("turns"), "_delta_log", f"{first_read:020d}.json").exists()
    _land(lake, 5, first=40)
    assert _new_turn_ids(lake, read) == [f"turn-{i:06d}" for i in range(40, 45)]
    assert _new_turn_ids(lake, None) == [f"turn-{i:06d}" for i in range(45)]


def test_an_idle_readers_next_entry_is_kept_however_old_its_rows(tmp_path: Path) -> None:
    """A reader read everything; the pass's own commits (properties, compaction) follow its
    watermark and age while no row lands. When rows land, those old entries are still the
    first it reads: the next pass keeps the log, and the reader reads the new rows once."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 40)
    read = lake.version("turns")
    _read_up_to(lake, read)
    maintain_lake(lake, NOW, Lease(lake, "proxy-1", 60))
    assert lake.version("turns") > read  # the pass committed after the watermark
    _age_log(lake)
    _land(lake, 3, first=40)
    (done,) = maintain_lake(lake, NOW, Lease(lake, "proxy-1", 60))
    assert not done.log_cleaned
    assert _new_turn_ids(lake, read) == [f"turn-{i:06d}" for i in range(40, 43)]


def test_a_writer_idle_past_a_cleanup_commits_on_a_fresh_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's handle predating a log cleanup cannot commit (delta-rs reads the entries
    since its version: ``Invalid table version``); a handle older than ``REOPEN_AFTER_S`` is
    re-opened first, so an idle proxy's next commit lands."""
    lake = Lake(str(tmp_path / "lake"))
    idle = lake.writer("turns")
    idle.append(rows_to_arrow(Turn, [_turn(0).model_dump()]))
    _land(lake, 40, first=1)
    _age_log(lake)
    maintain_lake(lake, NOW, Lease(lake, "proxy-1", 60))
    monkeypatch.setattr("claw_pipelines.lake.tables.REOPEN_AFTER_S", 0.0)
    idle.append(rows_to_arrow(Turn, [_turn(99).model_dump()]))
    assert len(_turn_ids(lake)) == 42


def _rchar() -> int:
    """Bytes this process has read through read(2) and friends so far."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


def _refresh_reads(lake: Lake, after: int) -> int:
    """The bytes a refresh's reads of ``turns`` take: open it, tell whether data changed since
    ``after`` (the ingest sensor) and read the rows inserted since (an ``Increment``)."""
    before = _rchar()
    turns = lake.open("turns")
    assert data_commits(turns, after)
    assert changes(turns, after, turns.version(), ["turn_id"]).height == 5
    return _rchar() - before


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts reads in /proc/self/io")
def test_a_refresh_after_hundreds_of_commits_reads_no_more_than_after_ten(tmp_path: Path) -> None:
    """With the passes, opening a table reads its last (small) checkpoint and the few commits
    after it: a refresh of five new commits reads as much after 300 commits as after 10 (without
    the pass, about twice as much)."""
    young, old = Lake(str(tmp_path / "young")), Lake(str(tmp_path / "old"))
    _land(young, 10)
    _land(old, 300)
    _age_log(old)
    maintain_lake(old, NOW, Lease(old, "proxy-1", 60))
    reads = {}
    for name, lake in (("young", young), ("old", old)):
        after = lake.version("turns")
        _land(lake, 5, first=1000)
        _refresh_reads(lake, after)  # the first read of a process loads more than the table
        reads[name] = _refresh_reads(lake, after)
    assert reads["old"] <= 1.25 * reads["young"], reads


KILLED_PASS = """
import sys
from claw_pipelines import maintenance
from claw_pipelines.lake import Lake, properties
from claw_pipelines.lease import Lease
from claw_pipelines.maintenance import Retention, maintain_lake
lake = Lake(sys.argv[1])
retention = Retention(vacuum_retention_hours=0, enforce_retention_duration=False,
                      log_retention_minutes=60, compact_after_files=2)
print("maintaining", flush=True)
maintain_lake(lake, retention, Lease(lake, "doomed", 1))
print("done", flush=True)
"""


@pytest.mark.parametrize("delay_s", [0.05, 0.3])
def test_a_pass_killed_part_way_loses_nothing(tmp_path: Path, delay_s: float) -> None:
    """``kill -9`` a pass ``delay_s`` into it (during compaction, checkpoint, cleanup or vacuum):
    every row is still there, the table takes appends, and the next pass (its lease expired)
    finishes the work."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 60)
    _age_log(lake)
    landed = _turn_ids(lake)
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_PASS, lake.root_uri],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "maintaining"
        time.sleep(delay_s)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert _turn_ids(lake) == landed
    _land(lake, 1, first=60)
    time.sleep(1)  # the killed holder's lease expires
    # The kill may fall before or after the merge, leaving 61 files or 2: merge either down.
    finish = NOW.model_copy(update={"compact_after_files": 1})
    (done,) = maintain_lake(lake, finish, Lease(lake, "proxy-2", 60))
    assert done.files_after == 1
    assert _turn_ids(lake) == [*landed, "turn-000060"]


def test_one_process_holds_the_lease_at_a_time(tmp_path: Path) -> None:
    """Four proxies ask at the same moment: one gets it; the others are refused while it holds
    it, and one of them takes it once it expired; the old holder then finds it lost."""
    lake = Lake(str(tmp_path / "lake"))
    leases = [Lease(lake, f"proxy-{i}", 1.0) for i in range(4)]
    leases[0].table()
    start, taken = threading.Barrier(4), {}

    def ask(lease: Lease) -> None:
        start.wait()
        taken[lease.holder] = lease.acquire()

    threads = [threading.Thread(target=ask, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken.values()) == 1, taken
    holder = next(lease for lease in leases if taken[lease.holder])
    others = [lease for lease in leases if lease is not holder]
    assert not any(lease.acquire() for lease in others)
    assert holder.acquire()  # renewed
    time.sleep(1.1)
    assert others[0].acquire()
    assert not holder.acquire()
    _land(lake, 3)
    with pytest.raises(LeaseLost):
        maintain_table(lake, "turns", lake.open("turns"), NOW, holder)
    assert maintain_lake(lake, NOW, holder) is None


def test_passes_of_two_proxies_never_overlap(tmp_path: Path) -> None:
    """Two proxies' maintainers run passes in a loop while a writer appends: their passes
    (from taking the lease to the end) never overlap, and every row stays."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 20)
    spans: list[tuple[float, float, str]] = []
    stop_at = time.monotonic() + 3

    def proxy(name: str) -> None:
        lease = Lease(lake, name, 0.5)
        while time.monotonic() < stop_at:
            began = time.monotonic()
            if maintain_lake(lake, NOW, lease) is not None:
                spans.append((began, time.monotonic(), name))
            time.sleep(0.6)  # as a maintainer waits between passes: the lease lapses

    threads = [threading.Thread(target=proxy, args=(f"proxy-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    _land(lake, 30, first=20)
    for thread in threads:
        thread.join()
    spans.sort()
    assert len(spans) >= 2
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    assert len(_turn_ids(lake)) == 50
    assert pl.Series(_turn_ids(lake)).n_unique() == 50


def test_a_proxy_maintainer_runs_passes_in_the_background(tmp_path: Path) -> None:
    """The proxy's maintainer thread takes the lease and compacts what the writer committed
    meanwhile, pass after pass, until stopped."""
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, 20)
    maintainer = Maintainer(lake, NOW, "proxy-1", interval_s=0.2)
    maintainer.start()
    try:
        deadline = time.monotonic() + 10
        while len(lake.open("turns").file_uris()) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(lake.open("turns").file_uris()) == 1
        assert maintainer.lease.holding().holder == "proxy-1"
    finally:
        maintainer.stop()
    assert len(_turn_ids(lake)) == 20


def test_compaction_writes_bounded_files_of_skippable_row_groups(
    tmp_path: Path, monkeypatch
) -> None:
    """A pass merges only the files under ``LANDING_FILE_BYTES``, in row groups of
    ``LANDING_ROW_GROUP_ROWS``: a file the size leaves no room in is not rewritten by the
    next pass (the merged file had been rewritten whole by every pass), and a read of a time
    window decodes the row groups of that window only (one row group per file made every such
    read decode the whole table)."""
    monkeypatch.setattr(maintenance, "LANDING_FILE_BYTES", 64 << 10)
    monkeypatch.setattr(properties, "LANDING_ROW_GROUP_ROWS", 100)
    lake = Lake(str(tmp_path / "lake"))
    lease = Lease(lake, "proxy-1", 60)
    writer = lake.writer("turns")
    for first in range(0, 3000, 100):
        writer.append(
            rows_to_arrow(Turn, [_turn(i).model_dump() for i in range(first, first + 100)])
        )
    maintain_lake(lake, NOW, lease)
    merged = {
        uri: pq.ParquetFile(uri.removeprefix("file://")).metadata
        for uri in lake.open("turns").file_uris()
    }
    assert len(merged) > 1
    for metadata in merged.values():
        assert max(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)) <= 100
    _land(lake, 20, first=3000)
    maintain_lake(lake, NOW, lease)
    rewritten = set(merged) - set(lake.open("turns").file_uris())
    assert len(rewritten) <= 1  # the one merged file with room left, at most
    assert _turn_ids(lake) == [f"turn-{i:06d}" for i in range(3020)]
