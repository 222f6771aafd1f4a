"""Concurrency and crashes: rows == answered calls, no duplicate turn ids, no loss on kill -9
(on chat completions, Responses and Messages at once)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import polars as pl
import pytest
from stack_fixtures import LOAD_APIS, CaptureStack, Load, launch_stack

from claw_pipelines.processes import free_port, stop_group
from claw_pipelines.stack import start_proxy

CLIENTS = 64
TURNS_PER_CLIENT = 20


async def _client_loop(stack: CaptureStack, client_index: int, answered: list[str]) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{stack.proxy_url}/t/load-{client_index}/g-{client_index % 8}/v1",
        api_key=stack.key,
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultAsyncHttpxClient(
            limits=httpx.Limits(max_keepalive_connections=0)
        ),
    )  # a connection per call: kept-alive ones all stay on the worker that started first
    async with client:
        for _ in range(TURNS_PER_CLIENT):
            raw = await client.chat.completions.with_raw_response.create(
                model="policy",
                messages=[{"role": "user", "content": "What is 3 + 4?"}],
                max_tokens=32,
            )
            answered.append(raw.headers["x-litellm-call-id"])


@pytest.fixture(scope="module")
def two_worker_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    stack = launch_stack(tmp_path_factory.mktemp("two-workers"), num_workers=2)
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()


def test_concurrent_clients_on_two_workers_land_every_answer_once(
    two_worker_stack: CaptureStack,
) -> None:
    answered: list[str] = []

    async def run_all() -> None:
        await asyncio.gather(*(_client_loop(two_worker_stack, i, answered) for i in range(CLIENTS)))

    asyncio.run(run_all())
    assert len(answered) == CLIENTS * TURNS_PER_CLIENT
    turns = two_worker_stack.wait_for_rows(
        lambda df: set(answered) <= set(df["turn_id"]), timeout_s=120
    )
    assert turns.height == len(answered)
    assert turns["turn_id"].n_unique() == turns.height
    assert set(turns["turn_id"]) == set(answered)
    assert turns["writer_id"].n_unique() == 2


def test_kill_9_under_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    stack = launch_stack(tmp_path)
    port = int(stack.proxy_url.rsplit(":", 1)[1])
    load = Load(stack.key, [f"{stack.proxy_url}/t/crash-{i}/g/v1" for i in range(16)])
    load.thread.start()
    try:
        for _ in range(3):
            load.wait_for(len(load.answered) + 150)
            os.killpg(stack.proxy.pid, signal.SIGKILL)
            stack.proxy.process.wait(timeout=30)
            stack.proxy = start_proxy(port, tmp_path, f"{stack.engine.url}/v1", stack.env)
            stack.proxy.wait_ready("/health/liveliness", timeout_s=240)
        load.wait_for(len(load.answered) + 100)
    finally:
        load.stop.set()
        load.thread.join(timeout=60)
    stop_group(stack.proxy.process, grace_s=30, sig=signal.SIGTERM)
    stack.engine.stop()
    answered = set(load.answered)
    assert len(answered) == len(load.answered)
    turns = stack.rows()
    missing = answered - set(turns["turn_id"])
    assert not missing, f"{len(missing)} answered turns missing"
    assert turns["turn_id"].n_unique() == turns.height, "duplicate turn ids"
    assert load.missing_by_api(turns) == dict.fromkeys(LOAD_APIS, 0)
    assert turns.filter(pl.col("status") == "success").height >= len(answered)
    assert not any(Path(stack.env["CLAW_SPOOL_DIR"]).glob("*/*.spool"))


def test_separate_proxy_processes_on_one_lake_land_every_answer_once(tmp_path: Path) -> None:
    """Two `claw proxy` processes (as on two machines: their own spool directories) append to
    the same tables at once."""
    first = launch_stack(tmp_path / "first")
    second_dir = tmp_path / "second"
    env = {**first.env, "CLAW_SPOOL_DIR": str(second_dir / "spool")}
    second_proxy = start_proxy(free_port(), second_dir, f"{first.engine.url}/v1", env)
    second = CaptureStack(second_dir, first.engine, second_proxy, first.key, env)
    answered: list[str] = []
    try:
        second_proxy.wait_ready("/health/liveliness", timeout_s=240)

        async def run_all() -> None:
            stacks = (first, second)
            await asyncio.gather(*(_client_loop(stacks[i % 2], i, answered) for i in range(32)))

        asyncio.run(run_all())
    finally:
        for proxy in (first.proxy, second_proxy):
            stop_group(proxy.process, grace_s=30, sig=signal.SIGTERM)
        first.engine.stop()
    assert len(answered) == 32 * TURNS_PER_CLIENT
    turns = first.rows()
    assert turns.height == turns["turn_id"].n_unique() == len(answered)
    assert set(turns["turn_id"]) == set(answered)
    assert turns["writer_id"].n_unique() == 2
