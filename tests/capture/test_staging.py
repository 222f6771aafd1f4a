"""Staged commits: proxies stage their sealed segments in the lake and one committer, holding
the commit lease, commits everyone's; every row lands once, closing rows never before their
turns, and a bundle staged again or a second committer never lands a row twice."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from test_commit_rate import _trajectory

from claw_pipelines.lake import Lake
from claw_pipelines.lease import LEASE_APP
from claw_pipelines.schemas import LANDING_MODELS
from claw_pipelines.spool.flusher import SpoolFlusher
from claw_pipelines.spool.staging import (
    Committer,
    Stager,
    StagingArea,
    pack_bundle,
    unpack_bundle,
)
from claw_pipelines.spool.writer import SpoolWriter

KEYS = {"turns": "turn_id", "rewards": "reward_id", "trajectory_events": "event_id"}


def _proxy(lake: Lake, spool: Path) -> SpoolFlusher:
    """A proxy's flusher in staged mode, driven by hand (no thread)."""
    return SpoolFlusher(
        SpoolWriter(spool), lake, fsync_interval_s=None, stager=Stager(StagingArea(lake))
    )


def _land(flusher: SpoolFlusher, first: int, count: int) -> None:
    for index in range(first, first + count):
        for row in _trajectory(index):
            flusher.writer.append(row)


def _landed(lake: Lake) -> dict[str, pl.DataFrame]:
    return {table: lake.scan(table).collect() for table in KEYS}


def test_a_bundle_keeps_its_segments_and_a_cut_one_is_refused() -> None:
    segments = [("turns", 3, b"abc"), ("rewards", 0, b""), ("trajectory_events", 7, b"xyz" * 9)]
    packed = pack_bundle("writer-1", segments)
    header, bodies = unpack_bundle(packed)
    assert header.writer_id == "writer-1"
    assert [(s.table, s.seq) for s in header.segments] == [(t, q) for t, q, _ in segments]
    assert bodies == [b for _, _, b in segments]
    with pytest.raises(ValueError):
        unpack_bundle(packed[:-1])


def test_two_proxies_stage_and_one_committer_lands_every_row_once_in_order(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path / "lake"))
    proxies = [_proxy(lake, tmp_path / f"spool-{i}") for i in range(2)]
    committer = Committer(lake, "committer")
    for round_ in range(3):
        for index, proxy in enumerate(proxies):
            _land(proxy, 100 * index + 10 * round_, 10)
            proxy.flush()
        assert committer.commit_staged() == 2 * 10 * 5
    for proxy in proxies:
        assert proxy.writer.spooled_rows() > 0  # staged, not yet seen committed
        proxy.flush()  # sees its bundles gone: deletes the segments
        assert proxy.writer.spooled_rows() == 0
        assert not [p for p in proxy.writer.directory.iterdir() if p.name != ".lock"]
    landed = _landed(lake)
    for table, key in KEYS.items():
        assert landed[table].height == {"turns": 180}.get(table, 60), table
        assert landed[table][key].n_unique() == landed[table].height, table
    assert StagingArea(lake).listing() == []
    # a round commits turns before completions: a completion's version is after its turns'
    versions = {
        table: pl.DataFrame(lake.open(table).load_cdf(0).read_all())
        .group_by("trajectory_id")
        .agg(pl.col("_commit_version").max().alias(table))
        for table in ("turns", "trajectory_events")
    }
    joined = versions["turns"].join(versions["trajectory_events"], on="trajectory_id")
    assert joined.height == 60
    turn_times = {c["version"]: c["timestamp"] for c in lake.open("turns").history()}
    event_times = {c["version"]: c["timestamp"] for c in lake.open("trajectory_events").history()}
    assert all(
        turn_times[t] <= event_times[e]
        for t, e in joined.select("turns", "trajectory_events").iter_rows()
    )


def test_segments_staged_again_or_committed_twice_land_once(tmp_path: Path) -> None:
    """An adopter that stages a dead proxy's segments again (their first bundle was committed
    just before the crash), and a second committer whose lease ran out, add nothing."""
    lake = Lake(str(tmp_path / "lake"))
    spool = tmp_path / "spool"
    proxy = _proxy(lake, spool)
    _land(proxy, 0, 20)
    proxy.flush()
    staged = StagingArea(lake)
    [(name, _)] = staged.listing()
    copy = staged.read(name)
    late_committer = Committer(lake, "late")
    late_snapshots = {
        t: late_committer._writer(t).snapshot(LANDING_MODELS[t].arrow_schema()) for t in KEYS
    }
    first = Committer(lake, "first")
    assert first.commit_staged() == 100
    first.lease.release()  # say it ran out while the late one had read the bundle
    staged.put(name, copy)
    late_committer._writer("turns").snapshot = lambda schema: late_snapshots["turns"]
    with pytest.raises(CommitFailedError):  # from its stale snapshot: refused, not retried
        late_committer.commit_staged()
    del late_committer._writer("turns").snapshot
    assert late_committer.commit_staged() == 0  # from a fresh one: nothing is new
    adopter = SpoolFlusher(
        SpoolWriter(tmp_path / "other"), lake, fsync_interval_s=None, stager=Stager(staged)
    )
    orphan = proxy.writer.directory
    proxy.writer.close()
    shutil.copytree(orphan, tmp_path / "orphan" / orphan.name)  # its spool, not yet cleaned
    adopter.commit_directory(tmp_path / "orphan" / orphan.name, orphan.name)
    assert len(staged.listing()) == 1
    assert late_committer.commit_staged() == 0
    for table, frame in _landed(lake).items():
        assert frame[KEYS[table]].n_unique() == frame.height == (60 if table == "turns" else 20)


def test_one_process_at_a_time_holds_the_commit_lease(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    first, second = Committer(lake, "first"), Committer(lake, "second")
    assert first._holds() and not second._holds()
    first.lease.release()
    second._ask_at = 0.0
    assert second._holds()


def test_a_refused_append_is_retried_unless_its_rows_landed_meanwhile(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    lake.append("t", pa.table({"x": [0]}))
    stale, other = lake.writer("t"), lake.writer("t")
    stale.append(pa.table({"x": [1]}), apps={"w": 1})
    other.append(pa.table({"x": [2]}), apps={"v": 1})
    stale._handle = lake.open("t", 1)  # predates the other's commit: refused, retried fresh
    stale.append(pa.table({"x": [3]}), apps={"w": 2})
    stale._handle = lake.open("t", 1)
    with pytest.raises(CommitFailedError):  # "w" 2 is in the table already: never twice
        stale.append(pa.table({"x": [3]}), apps={"w": 2})
    assert sorted(lake.scan("t").collect()["x"]) == [0, 1, 2, 3]


def test_a_committer_asks_each_writers_version_once_until_another_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs reads a table's log again for every ``transaction_version``: the committer asks
    once per writer and table, and again only once someone else has committed to it."""
    asked: list[str] = []
    original = DeltaTable.transaction_version

    def counted(table: DeltaTable, app: str) -> int | None:
        if app != LEASE_APP:
            asked.append(app)
        return original(table, app)

    monkeypatch.setattr(DeltaTable, "transaction_version", counted)
    lake = Lake(str(tmp_path / "lake"))
    proxies = [_proxy(lake, tmp_path / f"spool-{i}") for i in range(2)]
    committer = Committer(lake, "committer")

    def staged_round(first: int) -> int:
        for index, proxy in enumerate(proxies):
            _land(proxy, first + 100 * index, 2)
            proxy.flush()
        asked.clear()
        return committer.commit_staged()

    assert staged_round(0) == 2 * 2 * 5
    assert sorted(asked) == sorted(p.writer.writer_id for p in proxies for _ in KEYS)
    assert staged_round(10) == 2 * 2 * 5
    assert asked == []
    committer.lease.release()  # say it ran out: another process commits meanwhile
    other = Committer(lake, "other")
    _land(proxies[0], 20, 2)
    proxies[0].flush()
    assert other.commit_staged() == 2 * 5  # the tables moved under the first committer
    other.lease.release()
    committer._ask_at = 0.0
    assert staged_round(30) == 2 * 2 * 5
    assert len(asked) == 2 * len(KEYS)
    for table, frame in _landed(lake).items():
        assert frame[KEYS[table]].n_unique() == frame.height == (42 if table == "turns" else 14)


def test_a_committer_that_does_not_hold_the_lease_asks_again_when_it_runs_out(
    tmp_path: Path,
) -> None:
    lake = Lake(str(tmp_path / "lake"))
    holder, other = Committer(lake, "holder", lease_s=30), Committer(lake, "other", lease_s=30)
    assert holder._holds() and not other._holds()
    now = time.monotonic()
    assert holder._ask_at - now == pytest.approx(10, abs=1)  # renews every third of the lease
    assert other._ask_at - now == pytest.approx(30, abs=1)  # when the lease it saw expires
