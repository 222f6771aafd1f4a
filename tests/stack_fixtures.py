"""A running engine + capture proxy over a temporary lake, for tests and benchmarks."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port
from claw_pipelines.stack import start_engine, start_proxy

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
        scan = self.lake.scan(table)
        return pl.DataFrame() if scan is None else scan.collect()

    def wait_for_rows(
        self,
        predicate: Callable[[pl.DataFrame], bool],
        table: str = "turns",
        timeout_s: float = 60,
    ) -> pl.DataFrame:
        """Poll a landing table until ``predicate`` holds (flushes are asynchronous)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.rows(table)
            if not rows.is_empty() and predicate(rows):
                return rows
            if time.monotonic() > deadline:
                return rows
            time.sleep(0.2)


def capture_env(workdir: Path, key: str) -> dict[str, str]:
    return {
        "CLAW_LAKE_URI": str(workdir / "lake"),
        "CLAW_SPOOL_DIR": str(workdir / "spool"),
        "CLAW_FLUSH_INTERVAL_S": "0.25",
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def launch_stack(
    workdir: Path, num_workers: int = 1, config: Path | None = None, compat: str | None = None
) -> CaptureStack:
    """Engine + proxy; ``config`` is a LiteLLM config other than resources/litellm.yaml,
    ``compat`` another gateway's protocol to serve too (``claw proxy --compat``)."""
    key = "sk-test-" + secrets.token_hex(16)
    env = capture_env(workdir, key)
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
