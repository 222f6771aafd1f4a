"""Fixtures of the engine tests: an in-process app for shapes, one real ``claw sim`` process."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from claw_pipelines.engine.server import create_app
from claw_pipelines.processes import Service, free_port, start_service

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def answer_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine") / "answers.jsonl"


@pytest.fixture(scope="session")
def client(answer_log: Path) -> Iterator[TestClient]:
    with TestClient(create_app(seed=7, log_file=answer_log)) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def sim_window() -> int:
    """The context window the ``sim`` process is given through its environment."""
    return 65_536


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory, sim_window: int) -> Iterator[Service]:
    """A real ``claw sim`` process, configured by environment (``claw up`` passes flags)."""
    workdir = tmp_path_factory.mktemp("sim")
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "claw_pipelines.cli",
        "sim",
        "--port",
        str(port),
        "--seed",
        "3",
    ]
    service = start_service(
        "engine",
        command,
        f"http://127.0.0.1:{port}",
        workdir / "engine.log",
        env={
            "CLAW_ENGINE_LOG": str(workdir / "answers.jsonl"),
            "CLAW_ENGINE_LATENCY_MS": "1",
            "CLAW_ENGINE_MAX_MODEL_LEN": str(sim_window),
        },
    )
    try:
        service.wait_ready("/health", timeout_s=60)
        yield service
    finally:
        service.stop()
