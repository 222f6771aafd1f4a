"""Three proxies stage their rows on one S3 lake under load (one of them commits everyone's), one
is killed with kill -9 and restarted on its spool: every answered turn lands exactly once and
nothing is left waiting to commit, whichever proxy held the commit lease."""

from __future__ import annotations

import os
import signal
import time

import httpx
import polars as pl
from s3_lake import PROXIES, Fleet
from stack_fixtures import LOAD_APIS, PROXY_START_TIMEOUT_S, Load

CLIENTS = 12
PREFIX = "fleet-load-"


def _status(fleet: Fleet, index: int) -> dict:
    answer = httpx.get(
        f"{fleet.proxies[index].url}/claw/v1/status",
        headers={"Authorization": f"Bearer {fleet.key}"},
        timeout=10,
    )
    answer.raise_for_status()
    return answer.json()


def _landed(fleet: Fleet, answered: set[str], timeout_s: float = 120) -> pl.DataFrame:
    """The load's turns, once all ``answered`` are in (or the deadline passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        turns = (
            fleet.lake.scan("turns")
            .filter(pl.col("trajectory_id").str.starts_with(PREFIX))
            .select("turn_id", "writer_id", "api")
            .collect()
        )
        if answered <= set(turns["turn_id"]) or time.monotonic() > deadline:
            return turns
        time.sleep(0.5)


def test_three_proxies_on_one_s3_lake_survive_a_kill_9(fleet: Fleet) -> None:
    killed = 1
    spool_root = fleet.workdir(killed) / "spool"
    urls = [fleet.proxies[i % PROXIES].url for i in range(CLIENTS)]
    load = Load(fleet.key, [f"{url}/t/{PREFIX}{i}/g-{i}/v1" for i, url in enumerate(urls)])
    load.thread.start()
    try:
        load.wait_for(100)
        os.killpg(fleet.proxies[killed].pid, signal.SIGKILL)
        fleet.proxies[killed].process.wait(timeout=30)
        dead_spools = {p.name for p in spool_root.iterdir() if p.is_dir()}
        fleet.start(killed, port=fleet.proxies[killed].port)
        fleet.proxies[killed].wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)
        load.wait_for(len(load.answered) + 100)
    finally:
        load.stop.set()
        load.thread.join(timeout=60)
    answered = set(load.answered)
    assert len(answered) == len(load.answered)
    turns = _landed(fleet, answered)
    missing = answered - set(turns["turn_id"])
    assert not missing, f"{len(missing)} answered turns missing"
    assert turns["turn_id"].n_unique() == turns.height, "duplicate turn ids"
    assert load.missing_by_api(turns) == dict.fromkeys(LOAD_APIS, 0)
    unanswered = turns.filter(~pl.col("turn_id").is_in(list(answered)))
    assert unanswered.height <= CLIENTS // PROXIES  # in flight on the killed proxy: spooled,
    assert set(unanswered["writer_id"]) <= dead_spools  # and their answers never left it
    assert turns["writer_id"].n_unique() >= PROXIES + 1  # the restarted proxy writes anew
    deadline = time.monotonic() + 60  # a proxy deletes what it staged once it sees it landed
    while time.monotonic() < deadline:
        spooled = [_status(fleet, i)["spooled_rows"] for i in range(PROXIES)]
        left = {p.name for p in spool_root.iterdir() if p.is_dir()}
        if spooled == [0] * PROXIES and not left & dead_spools:
            break
        time.sleep(0.5)
    assert spooled == [0] * PROXIES
    assert not left & dead_spools, "the killed proxy's spool was not adopted"
