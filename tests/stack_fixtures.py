"""A running engine + capture proxy over a temporary lake, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import polars as pl
import psutil

from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port, stop_group
from claw_pipelines.stack import start_engine, start_proxy
from claw_pipelines.turn_prompts import whole_turns

PROXY_START_TIMEOUT_S = 240
CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium, driven by Playwright: no browser download."""
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class CaptureStack:
    """A running engine + capture proxy over a temporary lake."""

    workdir: Path
    engine: Service
    proxy: Service
    key: str
    env: dict[str, str]

    @property
    def proxy_url(self) -> str:
        return self.proxy.url

    @property
    def lake(self) -> Lake:
        return Lake(self.env["CLAW_LAKE_URI"])

    @property
    def engine_log(self) -> Path:
        return self.workdir / "engine-answers.jsonl"

    def engine_answers(self) -> dict[str, dict]:
        """What the engine sent, by response id (first choice)."""
        answers = {}
        for line in self.engine_log.read_text().splitlines():
            entry = json.loads(line)
            answers.setdefault(entry["id"], entry)
        return answers

    def rows(self, table: str = "turns") -> pl.DataFrame:
        """The table's rows; turns with their prompts and request texts whole."""
        scan = self.lake.scan(table)
        if scan is None:
            return pl.DataFrame()
        return whole_turns(scan) if table == "turns" else scan.collect()

    def wait_for_rows(
        self,
        predicate: Callable[[pl.DataFrame], bool],
        table: str = "turns",
        timeout_s: float = 60,
    ) -> pl.DataFrame:
        """Poll a landing table until ``predicate`` holds (flushes are asynchronous); fail if it
        does not within ``timeout_s``, saying how many rows there were."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.rows(table)
            if not rows.is_empty() and predicate(rows):
                return rows
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{table} did not reach the expected rows in {timeout_s} s "
                    f"({rows.height} rows there)"
                )
            time.sleep(0.2)


CLI = [sys.executable, "-m", "claw_pipelines.cli"]


def stopped_by_ctrl_c(up: Service, children: list[psutil.Process]) -> list[int]:
    """Ctrl-C ``claw up`` as a user would; the pids of its ``children`` still running after."""
    os.kill(up.pid, signal.SIGINT)
    up.process.wait(timeout=120)
    time.sleep(1)
    return [p.pid for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def kill_leftovers(up: Service, children: list[psutil.Process]) -> None:
    """Whatever of ``claw up`` a failed test left running."""
    stop_group(up.process, grace_s=5)
    for child in children:
        if child.is_running():
            child.kill()


def refused_start(workdir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``claw <args>`` (a service: ``proxy``, ``inspect``) and return its last output line,
    after checking that it exited non-zero and left no process of its group running."""
    process = subprocess.Popen(
        [*CLI, *args],
        cwd=workdir,
        env={**os.environ, **capture_env(workdir, "sk-test-start"), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=120)
        assert process.returncode != 0, output
        try:
            os.killpg(process.pid, 0)
            raise AssertionError(f"processes of the refused {args[0]} are still running")
        except ProcessLookupError:
            pass
    finally:
        stop_group(process, grace_s=5)
    return output.strip().splitlines()[-1]


def capture_env(workdir: Path, key: str) -> dict[str, str]:
    return {
        "CLAW_LAKE_URI": str(workdir / "lake"),
        "CLAW_SPOOL_DIR": str(workdir / "spool"),
        "CLAW_FLUSH_INTERVAL_S": "0.25",
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def launch_stack(
    workdir: Path,
    num_workers: int = 1,
    config: Path | None = None,
    env: dict[str, str] | None = None,
    compat: str | None = None,
) -> CaptureStack:
    """Engine and proxy over ``workdir``: ``config`` is a LiteLLM config other than
    resources/litellm.yaml, ``env`` adds to or overrides the capture settings, ``compat`` is
    another gateway's protocol to serve too (``claw proxy --compat``)."""
    key = "sk-test-" + secrets.token_hex(16)
    env = {**capture_env(workdir, key), **(env or {})}
    engine = start_engine(free_port(), workdir, env)
    engine.wait_ready("/health", timeout_s=60)
    proxy = start_proxy(
        free_port(),
        workdir,
        f"{engine.url}/v1",
        env,
        num_workers=num_workers,
        config=config,
        compat=compat,
    )
    try:
        proxy.wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)
    except Exception:
        proxy.stop()
        engine.stop()
        raise
    return CaptureStack(workdir, engine, proxy, key, env)


LOAD_APIS = ("chat", "completions", "responses", "messages")
LOAD_RETRIED_ERRORS = (
    openai.APIConnectionError,
    openai.APIStatusError,
    openai.APITimeoutError,
    anthropic.APIConnectionError,
    anthropic.APIStatusError,
    anthropic.APITimeoutError,
)
LOAD_QUESTION = "What is 6 * 7?"


def _load_client(
    api: str, base_url: str, key: str
) -> tuple[openai.AsyncOpenAI | anthropic.AsyncAnthropic, Callable[[], Awaitable[str]]]:
    """A client of ``api`` through ``base_url`` (``…/v1``) and its call, which returns the
    answer's turn id."""
    messages = [{"role": "user", "content": LOAD_QUESTION}]
    if api == "messages":
        anthropic_client = anthropic.AsyncAnthropic(
            base_url=base_url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=30
        )

        async def message() -> str:
            raw = await anthropic_client.messages.with_raw_response.create(
                model="policy", messages=messages, max_tokens=16
            )
            return raw.headers["x-litellm-call-id"]

        return anthropic_client, message
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)

    async def chat() -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model="policy", messages=messages, max_tokens=16
        )
        return raw.headers["x-litellm-call-id"]

    async def completion() -> str:
        raw = await client.completions.with_raw_response.create(
            model="policy", prompt=LOAD_QUESTION, max_tokens=16
        )
        return raw.headers["x-litellm-call-id"]

    async def response() -> str:
        raw = await client.responses.with_raw_response.create(
            model="policy", input=LOAD_QUESTION, max_output_tokens=16
        )
        return raw.headers["x-litellm-call-id"]

    return client, {"chat": chat, "completions": completion, "responses": response}[api]


class Load:
    """Clients that keep calling the proxy (through restarts: a refused call is tried again)
    and record the turn id of every answer. Client ``i`` uses ``base_urls[i]`` (``…/v1``) and
    speaks ``LOAD_APIS[i % 4]``, so every route the proxy captures is under the same load."""

    def __init__(self, key: str, base_urls: list[str]) -> None:
        self.key = key
        self.base_urls = base_urls
        self.answered: list[str] = []
        self.answered_by_api: dict[str, list[str]] = {api: [] for api in LOAD_APIS}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _one(self, base_url: str, api: str) -> None:
        client, call = _load_client(api, base_url, self.key)
        async with client:
            while not self.stop.is_set():
                try:
                    turn_id = await call()
                except LOAD_RETRIED_ERRORS:
                    await asyncio.sleep(0.2)
                    continue
                self.answered.append(turn_id)
                self.answered_by_api[api].append(turn_id)

    async def _run(self) -> None:
        await asyncio.gather(
            *(self._one(url, LOAD_APIS[i % len(LOAD_APIS)]) for i, url in enumerate(self.base_urls))
        )

    def missing_by_api(self, turns: pl.DataFrame) -> dict[str, int]:
        """For each API, how many of its answers are not among ``turns`` as a turn of that API
        (every API must have been answered)."""
        assert all(self.answered_by_api.values()), {
            k: len(v) for k, v in self.answered_by_api.items()
        }
        return {
            api: len(set(ids) - set(turns.filter(pl.col("api") == api)["turn_id"]))
            for api, ids in self.answered_by_api.items()
        }

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        """Until ``count`` calls were answered in all."""
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.answered)} answers")
            time.sleep(0.2)
