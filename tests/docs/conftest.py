"""One ``claw up`` stack for every docs block: started on free loopback ports in a temporary
folder that looks like a checkout to the blocks (``.venv`` and the configuration linked in), with
demo traffic and a first exported GRPO batch, so each block finds what the README's tour made."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from docs_stack import DEFAULT_PORTS, LINKED, DocsStack
from markdown_blocks import REPO

from claw_pipelines.processes import Service, free_port, start_service
from claw_pipelines.trainer import BatchConsumer

UP_TIMEOUT_S = 420
DEMO_ROUNDS = 4
"""``claw demo`` rounds played at most until the first GRPO batch: a batch takes 4 groups whose
rewards differ, and one round's 8 groups sometimes hold fewer (2 in one CI run), which is why
the README's tour goes on with ``claw demo --online`` (rounds until its trainer has batches)."""
ROUND_BATCH_TIMEOUT_S = 150


def _wait_until_up(up: Service) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while "claw-pipelines is up" not in up.log_tail(10_000):
        if not up.alive() or time.monotonic() > deadline:
            pytest.fail(f"claw up did not come up:\n{up.log_tail()}")
        time.sleep(1)


@pytest.fixture(scope="module")
def docs_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsStack]:
    folder = tmp_path_factory.mktemp("docs-checkout")
    for name in LINKED:
        (folder / name).symlink_to(REPO / name)
    ports = {name: free_port() for name in DEFAULT_PORTS}
    command = [sys.executable, "-m", "claw_pipelines.cli", "up"]
    command += [f"--{name}-port={port}" for name, port in ports.items()]
    up = start_service("claw-up", command, "", folder / "up.log", cwd=folder)
    try:
        _wait_until_up(up)
        stack = DocsStack(folder, ports, up)
        first = BatchConsumer("grpo", "docs-fixture", str(folder / ".claw" / "lake"))
        batch = None
        for _ in range(DEMO_ROUNDS):
            subprocess.run(
                [str(folder / ".venv" / "bin" / "claw"), "demo"],
                cwd=folder,
                env=stack.env,
                check=True,
                capture_output=True,
                timeout=300,
            )
            batch = first.next(timeout_s=ROUND_BATCH_TIMEOUT_S)
            if batch is not None:
                break
        assert batch is not None, up.log_tail()
        yield stack
    finally:
        up.stop(grace_s=30)
