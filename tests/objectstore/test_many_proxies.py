"""Three proxies append to one S3 lake under load, one is killed with kill -9 and restarted on
its spool: every answered turn lands exactly once and nothing is left waiting to commit."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import openai
import polars as pl
from conftest import PROXIES, Fleet
from stack_fixtures import PROXY_START_TIMEOUT_S

CLIENTS = 12
PREFIX = "fleet-load-"


class FleetLoad:
    """Clients spread over the proxies, calling on through a proxy's restart, recording the
    turn id of every answer."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.answered: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _one(self, index: int) -> None:
        proxy = self.fleet.proxies[index % PROXIES]
        client = openai.AsyncOpenAI(
            base_url=f"{proxy.url}/t/{PREFIX}{index}/g-{index}/v1",
            api_key=self.fleet.key,
            max_retries=0,
            timeout=30,
        )
        async with client:
            while not self.stop.is_set():
                try:
                    raw = await client.chat.completions.with_raw_response.create(
                        model="policy",
                        messages=[{"role": "user", "content": "What is 6 * 7?"}],
                        max_tokens=16,
                    )
                except (openai.APIConnectionError, openai.APIStatusError, openai.APITimeoutError):
                    await asyncio.sleep(0.2)
                    continue
                self.answered.append(raw.headers["x-litellm-call-id"])

    async def _run(self) -> None:
        await asyncio.gather(*(self._one(i) for i in range(CLIENTS)))

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.answered)} answers")
            time.sleep(0.2)


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
            .select("turn_id", "writer_id")
            .collect()
        )
        if answered <= set(turns["turn_id"]) or time.monotonic() > deadline:
            return turns
        time.sleep(0.5)


def test_three_proxies_on_one_s3_lake_survive_a_kill_9(fleet: Fleet) -> None:
    killed = 1
    spool_root = fleet.workdir(killed) / "spool"
    load = FleetLoad(fleet)
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
    unanswered = turns.filter(~pl.col("turn_id").is_in(list(answered)))
    assert unanswered.height <= CLIENTS // PROXIES  # in flight on the killed proxy: spooled,
    assert set(unanswered["writer_id"]) <= dead_spools  # and their answers never left it
    assert turns["writer_id"].n_unique() >= PROXIES + 1  # the restarted proxy writes anew
    assert all(_status(fleet, i)["spooled_rows"] == 0 for i in range(PROXIES))
    left = {p.name for p in spool_root.iterdir() if p.is_dir()}
    assert not left & dead_spools, "the killed proxy's spool was not adopted"
