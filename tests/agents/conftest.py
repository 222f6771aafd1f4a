"""Real agent CLIs from the npm registry, installed once per pinned version.

The installs live in the user's cache (``$XDG_CACHE_HOME/claw-pipelines/agent-clis``, else
``~/.cache/...``), shared by every checkout and kept between runs; delete the folder to install
afresh. Without ``npm`` the tests are skipped; with it, a failed install is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_runs import InstalledCli, NpmCli


def _cache() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    cache = Path(root) / "claw-pipelines" / "agent-clis"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def npm_cli() -> Callable[[NpmCli], InstalledCli]:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm and node are needed to install the real agent CLIs from the npm registry")
    cache = _cache()
    return lambda cli: cli.install(cache)
