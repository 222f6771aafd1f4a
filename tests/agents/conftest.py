"""Real agent CLIs from the npm registry, installed once per pinned version.

The installs live in pytest's cache (``.pytest_cache/d/agent-clis``), so a second run does not
download them again; ``--cache-clear`` does. Without ``npm`` the tests are skipped; with it, a
failed install is a failure.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_runs import NpmCli


@pytest.fixture(scope="session")
def npm_cli(request: pytest.FixtureRequest) -> Callable[[NpmCli], Path]:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm and node are needed to install the real agent CLIs from the npm registry")
    cache = Path(request.config.cache.mkdir("agent-clis"))
    return lambda cli: cli.install(cache)
