"""The object-store tests' fixtures: one S3 server per session and the proxy fleet on it
(s3_lake.py)."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_lake import PROXIES, S3, Fleet, lake_env, start_s3
from stack_fixtures import PROXY_START_TIMEOUT_S, capture_env

from claw_pipelines.processes import free_port
from claw_pipelines.settings import get_settings
from claw_pipelines.stack import start_engine

DAGSTER_TESTS = Path(__file__).resolve().parent.parent / "dagster"
sys.path.insert(0, str(DAGSTER_TESTS))  # the in-process Dagster driver, shared


@pytest.fixture
def lake_settings(monkeypatch: pytest.MonkeyPatch):
    """Point this process's settings at a lake: ``use(root, options)``."""

    def use(root: str, options: dict[str, str]) -> None:
        for name, value in lake_env(root, options).items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()

    yield use
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    server = start_s3(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.service.stop()


@pytest.fixture(scope="session")
def fleet(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Started together: a LiteLLM proxy takes 10-40 s to start on two cores."""
    root = tmp_path_factory.mktemp("fleet")
    key = "sk-test-" + secrets.token_hex(16)
    engine = start_engine(free_port(), root, capture_env(root, key))
    fleet = Fleet(s3.new_lake(), engine, key, root, [None] * PROXIES)
    try:
        engine.wait_ready("/health", timeout_s=60)
        for index in range(PROXIES):
            fleet.start(index)
        for proxy in fleet.proxies:
            proxy.wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)
        yield fleet
    finally:
        fleet.stop()
