"""A capture proxy in front of the fake backend (``fake_backend.py``), for answers the embedded
engine cannot give: a 3 MiB answer, an error that echoes the caller's credentials, answers no
row can be made of. Its ``policy`` model buffers streams (the default), ``policy-live`` passes
them through."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_backend_stack import FakeBackendStack
from stack_fixtures import PROXY_START_TIMEOUT_S, capture_env

from claw_pipelines.edge.launcher import DEFAULT_CONFIG
from claw_pipelines.processes import free_port, start_service
from claw_pipelines.stack import start_proxy

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def fake_backend_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeBackendStack]:
    """The proxy's ``policy`` and ``policy-live`` models served by the fake backend, with an API
    key for it that no pattern would take for a secret (only the proxy config says it is one)."""
    workdir = tmp_path_factory.mktemp("fake-backend")
    key = "sk-test-" + secrets.token_hex(16)
    backend_key = "backend-" + secrets.token_hex(12)
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    policy = config["model_list"][0]
    policy["litellm_params"]["api_key"] = "os.environ/FAKE_BACKEND_KEY"
    live = {"model_name": "policy-live", "litellm_params": dict(policy["litellm_params"])}
    config["model_list"].append({**live, "model_info": {"claw": {"stream_mode": "passthrough"}}})
    config_path = workdir / "litellm.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**capture_env(workdir, key), "FAKE_BACKEND_KEY": backend_key}
    port = free_port()
    backend = start_service(
        "fake-backend",
        [sys.executable, str(HERE / "fake_backend.py"), str(port)],
        f"http://127.0.0.1:{port}",
        workdir / "logs" / "fake-backend.log",
    )
    proxy = None
    try:
        backend.wait_ready("/v1/models", timeout_s=60)
        proxy = start_proxy(free_port(), workdir, f"{backend.url}/v1", env, config=config_path)
        proxy.wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)
        yield FakeBackendStack(workdir, backend, proxy, key, env, backend_key)
    finally:
        if proxy is not None:
            proxy.stop()
        backend.stop()
