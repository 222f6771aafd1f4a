"""The spool on its own: frames, segments, commits, adoption, and what a disk does wrong.

Faults are real where the machine allows: a short write on a full tmpfs; an fsync failure, which
no local file system can be made to give, is injected into ``os.fsync``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from spool_faults import Ballast, small_tmpfs

from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.edge.claw_r1.protocol import StepPayload, SubmitSteps
from claw_pipelines.edge.claw_r1.routes import submit_steps
from claw_pipelines.edge.control import build_control_app
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import Reward, Turn, utc_now
from claw_pipelines.settings import ClawSettings
from claw_pipelines.spool import codec
from claw_pipelines.spool.flusher import (
    QUARANTINE_DIR,
    Schedule,
    SpoolCommitError,
    SpoolFlusher,
)
from claw_pipelines.spool.writer import SpoolUnavailable, SpoolWriter, Waiting, segment_name


def _turn(turn_id: str) -> Turn:
    now = utc_now()
    return Turn(turn_id=turn_id, model="m", started_at=now, ended_at=now, prompt_token_ids=[1])


def test_commit_is_never_applied_twice(tmp_path: Path) -> None:
    """A crash after the Delta commit but before the segment is deleted must not duplicate it."""
    lake = Lake(str(tmp_path / "lake"))
    writer = SpoolWriter(tmp_path / "spool")
    flusher = SpoolFlusher(writer, lake)
    writer.append(_turn("a"))
    writer.append(_turn("a"))
    writer.seal()
    segment = next(writer.directory.glob("turns-*"))
    kept = segment.read_bytes()
    assert flusher.flush() == 1
    segment.write_bytes(kept)
    assert flusher.flush() == 0
    assert not segment.exists()
    assert lake.scan("turns").collect().height == 1


def test_a_commit_that_landed_but_answered_an_error_is_not_applied_again(
    tmp_path: Path,
) -> None:
    """On an object store a commit can land while its caller sees an error (the PUT's answer
    was lost, and the retried PUT is refused as the entry exists): the next flush must ask
    Delta what landed rather than commit the segment a second time."""
    lake = Lake(str(tmp_path / "lake"))
    writer = SpoolWriter(tmp_path / "spool")
    flusher = SpoolFlusher(writer, lake)
    writer.append(_turn("first"))
    assert flusher.flush() == 1
    table = flusher._table("turns")
    append = table.append

    def lands_then_fails(*args, **kwargs):
        append(*args, **kwargs)
        raise OSError("connection reset while reading the answer")

    table.append = lands_then_fails
    writer.append(_turn("second"))
    with pytest.raises(SpoolCommitError):
        flusher.flush()
    table.append = append
    flusher.flush()
    assert sorted(lake.scan("turns").collect()["turn_id"]) == ["first", "second"]
    assert writer.spooled_rows() == 0


def test_orphaned_spool_is_adopted(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    dead = SpoolWriter(tmp_path / "spool")
    dead.append(_turn("left-behind"))
    dead.close()
    live = SpoolWriter(tmp_path / "spool")
    assert SpoolFlusher(live, lake).adopt_orphans() == 1
    assert not dead.directory.exists()
    assert lake.scan("turns").collect()["turn_id"].to_list() == ["left-behind"]


def test_spool_codec_round_trips_null_empty_and_long_lists() -> None:
    now = utc_now()
    turns = [
        Turn(turn_id="none", model="m", started_at=now, ended_at=now),
        Turn(turn_id="empty", model="m", started_at=now, ended_at=now, prompt_token_ids=[]),
        Turn(
            turn_id="long",
            model="m",
            started_at=now,
            ended_at=now,
            prompt_token_ids=list(range(2**31 - 3000, 2**31 - 1)),
            response_token_ids=[0, 1],
            response_logprobs=[-0.25, -1.5],
        ),
    ]
    decoded = codec.decode(b"".join(codec.encode(t) for t in turns), "turns")
    for turn, row in zip(turns, decoded.to_pylist(), strict=True):
        assert row["turn_id"] == turn.turn_id
        assert row["prompt_token_ids"] == turn.prompt_token_ids
        assert row["response_token_ids"] == turn.response_token_ids
        assert row["response_logprobs"] == turn.response_logprobs
        assert row["started_at"] == turn.started_at


PROXY_COMMITS_IN_A_FRESH_PROCESS = """
import sys
from pathlib import Path
from claw_pipelines.spool.writer import SpoolWriter
from claw_pipelines.spool.flusher import SpoolFlusher
from claw_pipelines.lake import Lake
from claw_pipelines.lease import Lease
from claw_pipelines.maintenance import Retention, maintain_lake
from claw_pipelines.policy.gate import ServedPolicy
from claw_pipelines.schemas import Turn, utc_now

root = Path(sys.argv[1])
writer = SpoolWriter(root / "spool")
now = utc_now()
for index, ids in enumerate([[1, 2], None, []]):
    writer.append(Turn(turn_id=str(index), model="m", started_at=now, ended_at=now,
                       prompt_token_ids=ids, response_logprobs=ids and [-0.5] * len(ids)))
lake = Lake(str(root / "lake"))
assert SpoolFlusher(writer, lake).flush() == 3
assert maintain_lake(lake, Retention(), Lease(lake, "proxy-1", 60))
policy = ServedPolicy(lake, "proxy-1", max_hold_s=1)
assert policy.record("announce", 2).version == 2
print(sorted(name for name in sys.modules if name.split(".")[0] == "pandas"))
"""


def test_the_proxys_commits_never_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas when handed numpy arrays or lists to convert: in the proxy, about
    a second of CPU at the first commit, and a heavier garbage collection from then on. The
    proxy commits its spool, its maintenance lease and its policy events."""
    done = subprocess.run(
        [sys.executable, "-c", PROXY_COMMITS_IN_A_FRESH_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def _nan_reward() -> Reward:
    """A row the boundary now refuses, as an older proxy could still have spooled it."""
    return Reward.model_construct(reward_id="bad", trajectory_id="t", value=float("nan"))


def test_undecodable_rows_are_quarantined_and_block_nothing(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    dead = SpoolWriter(tmp_path / "spool")
    dead.append(Reward(reward_id="orphan-ok", trajectory_id="t", value=1.0))
    dead.append(_nan_reward())
    dead.close()
    writer = SpoolWriter(tmp_path / "spool")
    writer.append(Reward(reward_id="ok", trajectory_id="t", value=0.5))
    writer.append(_nan_reward())
    writer.append(_turn("turn-after"))
    flusher = SpoolFlusher(writer, lake)
    flusher.start()
    flusher.stop()
    rewards = lake.scan("rewards").collect()["reward_id"].to_list()
    assert sorted(rewards) == ["ok", "orphan-ok"]
    assert lake.scan("turns").collect()["turn_id"].to_list() == ["turn-after"]
    assert not any(writer.directory.glob("*.spool")) and not dead.directory.exists()
    quarantined = sorted((tmp_path / "spool" / QUARANTINE_DIR).iterdir())
    assert len(quarantined) == 2
    for path in quarantined:
        assert len(codec.scan(path.read_bytes()).frames) == 1


def test_a_failing_flush_never_stops_startup(tmp_path: Path) -> None:
    dead = SpoolWriter(tmp_path / "spool")
    dead.append(_turn("orphan"))
    dead.close()
    flusher = SpoolFlusher(
        SpoolWriter(tmp_path / "spool"), Lake(str(tmp_path / "lake")), interval_s=3600
    )
    attempts = []

    def failing_commit(directory: Path, writer_id: str) -> int:
        attempts.append(directory)
        raise OSError("lake unreachable")

    flusher.commit_directory = failing_commit  # type: ignore[method-assign]
    flusher.start()
    assert attempts == [dead.directory]  # adoption at start failed, and start went on
    flusher.stop()
    assert attempts[-1] == flusher.writer.directory  # the final flush was tried
    assert dead.directory.is_dir(), "a directory that failed to commit is kept"


def test_flushes_and_adoptions_keep_their_own_schedule() -> None:
    """Nothing an attempt does moves the schedule: sealed rows whose commit failed are retried
    once per interval, not on every tick, and never hold back adoption; a nudge flushes at once."""
    schedule = Schedule(interval_s=0.5, adopt_every_s=1.0, start=0.0)
    failed = Waiting(None, None, sealed_rows=3)
    ticks = [round(0.1 * i, 1) for i in range(1, 13)]
    due = {tick: schedule.due(tick, woken=False, waiting=failed) for tick in ticks}
    assert [t for t in ticks if due[t][0]] == [0.5, 1.0]
    assert [t for t in ticks if due[t][1]] == [1.0]
    assert schedule.due(1.3, woken=True, waiting=NOTHING) == (True, False)
    assert schedule.due(1.5, woken=False, waiting=failed) == (False, False)


NOTHING = Waiting(None, None, sealed_rows=0)


def _flushes(schedule: Schedule, appends: list[float], until: float) -> list[float]:
    """The ticks (every 0.1 s) at which ``schedule`` flushes rows appended at ``appends``."""
    flushed, oldest, newest = [], None, None
    for tick in [round(0.1 * i, 1) for i in range(1, int(until * 10) + 1)]:
        for at in [a for a in appends if (newest is None or newest < a) and a <= tick]:
            oldest, newest = oldest or at, at
        waiting = Waiting(oldest, newest, 0) if newest is not None else NOTHING
        if schedule.due(tick, woken=False, waiting=waiting)[0] and oldest is not None:
            flushed.append(tick)
            oldest = None
    return flushed


def test_a_busy_proxy_commits_every_few_seconds_and_a_quiet_one_soon_after_its_last_row() -> None:
    """A commit costs about the same CPU whatever its size: under continuous traffic the rows
    wait up to ``max_wait_s`` (or a nudge at ``max_rows``); once appends pause they land
    ``interval_s`` after the last one."""
    steady = [round(0.05 * i, 2) for i in range(1, 240)]  # a row every 50 ms for 12 s
    assert _flushes(Schedule(1.0, 5.0, 0.0, max_wait_s=5.0), steady, until=14) == [5.1, 10.2, 13.0]
    burst = [0.2, 0.4, 0.6, 3.0]
    assert _flushes(Schedule(1.0, 5.0, 0.0, max_wait_s=5.0), burst, until=6) == [1.6, 4.0]
    assert not _flushes(Schedule(1.0, 5.0, 0.0), [], until=6)


def test_the_writer_says_when_its_waiting_rows_were_appended(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path / "spool")
    assert writer.waiting() == NOTHING
    writer.append(_turn("a"))
    writer.append(_turn("b"))
    first = writer.waiting()
    assert first.oldest_at is not None and first.newest_at is not None
    assert first.oldest_at <= first.newest_at and first.sealed_rows == 0
    writer.seal()
    assert writer.waiting() == Waiting(None, None, sealed_rows=2)
    writer.close()


def _complete(client: TestClient) -> None:
    answer = client.post("/claw/v1/trajectories/t-1/complete", json={"reward": 1.0})
    assert answer.status_code == 200, answer.text


def _reward(client: TestClient) -> None:
    answer = client.post("/claw/v1/rewards", json={"trajectory_id": "t-1", "value": 1.0})
    assert answer.status_code == 200, answer.text


def _claw_r1_last_step(_: TestClient) -> None:
    last = StepPayload(prompt_ids=[1], response_ids=[2], trajectory_uid="t-1", is_last=True)
    asyncio.run(submit_steps(SubmitSteps(steps=[last])))


@pytest.mark.parametrize(
    ("close", "table"),
    [
        (_complete, "trajectory_events"),
        (_reward, "rewards"),
        (_claw_r1_last_step, "trajectory_events"),
    ],
    ids=["complete", "reward", "claw-r1-last-step"],
)
def test_a_completion_or_a_reward_commits_at_once_with_the_turns_before_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    close: Callable[[TestClient], None],
    table: str,
) -> None:
    """Turns alone wait an hour here (for a pause or the max wait); the row that closes their
    trajectory wakes the flusher, which commits it and every turn spooled before it."""
    settings = ClawSettings(
        lake_uri=str(tmp_path / "lake"),
        spool_dir=tmp_path / "spool",
        flush_interval_s=3600,
        flush_max_wait_s=3600,
    )
    runtime = CaptureRuntime(settings)
    monkeypatch.setattr(CaptureRuntime, "_instance", runtime)
    try:
        runtime.land([_turn(f"turn-{i}") for i in range(3)])
        assert runtime.flusher.committed_rows == 0
        close(TestClient(build_control_app()))
        deadline = time.monotonic() + 30  # a bound against hanging, not a speed target
        while runtime.writer.spooled_rows() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.writer.spooled_rows() == 0
        turns = set(runtime.lake.scan("turns").collect()["turn_id"])
        assert {"turn-0", "turn-1", "turn-2"} <= turns
        assert runtime.lake.scan(table).collect()["trajectory_id"].to_list() == ["t-1"]
    finally:
        CaptureRuntime.shutdown_current()


def test_status_counts_spooled_rows_until_they_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of sealed segments whose commit failed are still waiting: an operator reading
    spooled_rows == 0 must be able to trust that everything answered has landed."""
    in_the_way = tmp_path / "a-file-where-the-lake-should-go"
    in_the_way.write_text("")
    settings = ClawSettings(
        lake_uri=str(in_the_way / "lake"), spool_dir=tmp_path / "spool", flush_interval_s=3600
    )
    runtime = CaptureRuntime(settings)
    monkeypatch.setattr(CaptureRuntime, "_instance", runtime)
    client = TestClient(build_control_app())

    def spooled_rows() -> int:
        return client.get("/claw/v1/status").json()["spooled_rows"]

    try:
        runtime.land([_turn(f"turn-{i}") for i in range(3)])
        with pytest.raises(SpoolCommitError):
            runtime.flusher.flush()
        runtime.land([_turn("turn-3")])
        assert spooled_rows() == 4
        in_the_way.unlink()
        assert runtime.flusher.flush() == 4
        assert spooled_rows() == 0
    finally:
        CaptureRuntime.shutdown_current()


def test_a_row_of_megabytes_round_trips() -> None:
    """Over pyarrow's default 1 MiB JSON block, which a row used to have to fit."""
    now = utc_now()
    big = Turn(turn_id="big", model="m", started_at=now, ended_at=now, metadata="x" * 3_000_000)
    small = _turn("small")
    decoded = codec.decode(codec.encode(small) + codec.encode(big), "turns")
    assert decoded.column("turn_id").to_pylist() == ["small", "big"]
    assert decoded.column("metadata").to_pylist()[1] == big.metadata


def test_damaged_bytes_are_quarantined_and_the_frames_after_them_land(tmp_path: Path) -> None:
    """The decoder used to stop at the first bad frame: every later frame of the segment was
    dropped, silently, when the segment was committed and deleted."""
    lake = Lake(str(tmp_path / "lake"))
    writer = SpoolWriter(tmp_path / "spool")
    for turn_id in ("before", "damaged", "after"):
        writer.append(_turn(turn_id))
    writer.seal()
    segment = next(writer.directory.glob("turns-*"))
    data = bytearray(segment.read_bytes())
    second = codec.scan(bytes(data)).frames[1]
    start = bytes(data).index(bytes(second.raw))
    data[start + len(second.raw) // 2] ^= 0xFF  # one flipped byte: its checksum fails
    segment.write_bytes(bytes(data))
    assert SpoolFlusher(writer, lake).flush() == 2
    assert sorted(lake.scan("turns").collect()["turn_id"]) == ["after", "before"]
    (damaged,) = (tmp_path / "spool" / QUARANTINE_DIR).glob("*.damaged")
    assert damaged.read_bytes() == bytes(data[start : start + len(second.raw)])


def test_a_torn_last_frame_is_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = Lake(str(tmp_path / "lake"))
    writer = SpoolWriter(tmp_path / "spool")
    writer.append(_turn("whole"))
    writer.append(_turn("torn"))
    writer.seal()
    segment = next(writer.directory.glob("turns-*"))
    segment.write_bytes(segment.read_bytes()[:-20])
    scan = codec.scan(segment.read_bytes())
    assert (len(scan.frames), scan.damaged, scan.torn_tail > 0) == (1, [], True)
    with caplog.at_level(logging.WARNING):
        assert SpoolFlusher(writer, lake).flush() == 1
    assert "dropped the torn last" in caplog.text
    assert not (tmp_path / "spool" / QUARANTINE_DIR).exists()


def test_a_short_write_on_a_full_disk_is_cut_back_and_fails(tmp_path: Path) -> None:
    """A full disk used to leave a torn frame that answered 200, and hid every frame after it."""
    with small_tmpfs(tmp_path / "spool", size="1m") as spool:
        lake = Lake(str(tmp_path / "lake"))
        writer = SpoolWriter(spool)
        writer.append(_turn("before"))
        (segment,) = writer.directory.glob("turns-*")
        kept = segment.stat().st_size
        big = _turn("too-big").model_copy(update={"metadata": "m" * 64 * 1024})
        with Ballast(spool / "ballast", leave_free=16 * 1024):
            with pytest.raises(SpoolUnavailable, match="No space left on device"):
                writer.append(big)
            assert segment.stat().st_size == kept, "the part written was not cut off"
            assert writer.spooled_rows() == 1
        writer.append(_turn("after"))
        assert SpoolFlusher(writer, lake).flush() == 2
        assert sorted(lake.scan("turns").collect()["turn_id"]) == ["after", "before"]
        writer.close()


@pytest.fixture
def answer_fsync_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CaptureRuntime]:
    """A capture runtime with CLAW_FSYNC=answer behind the /claw/v1 endpoints, in process."""
    settings = ClawSettings(
        lake_uri=str(tmp_path / "lake"), spool_dir=tmp_path / "spool", fsync="answer"
    )
    runtime = CaptureRuntime(settings)
    monkeypatch.setattr(CaptureRuntime, "_instance", runtime)
    try:
        yield runtime
    finally:
        CaptureRuntime.shutdown_current()


def test_with_fsync_per_answer_the_answer_waits_for_its_fsync(
    answer_fsync_runtime: CaptureRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    control = build_control_app()

    async def recording_app(scope, receive, send) -> None:
        async def recording_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                events.append(("answer", str(message["status"])))
            await send(message)

        await control(scope, receive, recording_send)

    answer = TestClient(recording_app).post(
        "/claw/v1/rewards", json={"trajectory_id": "t", "value": 1.0}
    )
    assert answer.status_code == 200, answer.text
    # the reward closes something, so the flusher may commit and delete its segment at once:
    # the segment is known by the fsync's path, not looked up afterwards
    segment = str(answer_fsync_runtime.writer.directory / segment_name("rewards", 0))
    assert ("fsync", segment) in events
    assert events.index(("fsync", segment)) < events.index(("answer", "200"))


def test_a_failed_fsync_fails_the_call_with_503(
    answer_fsync_runtime: CaptureRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to be suppressed: the call was answered 200 for a row not known to be on disk."""

    disk_fails = True
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if disk_fails:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    client = TestClient(build_control_app())
    answer = client.post("/claw/v1/rewards", json={"trajectory_id": "t", "value": 1.0})
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "2"
    assert "cannot make this row durable (Input/output error)" in answer.json()["error"]
    disk_fails = False
    assert client.post("/claw/v1/rewards", json={"trajectory_id": "t", "value": 1.0}).is_success
