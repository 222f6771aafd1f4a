"""Session-wide services shared by the test areas: one embedded engine and one capture proxy (and
one more of each, with Claw-R1's protocol on, for the tests that use it).

Starting the real LiteLLM proxy takes 10-40 s on two cores, so areas share this one unless a
test needs its own (several workers, kill -9). See stack_fixtures.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from stack_fixtures import CaptureStack, launch_stack

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def capture_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    stack = launch_stack(tmp_path_factory.mktemp("capture"))
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()


@pytest.fixture(scope="session")
def claw_r1_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    """A proxy run with ``--compat claw-r1``, on loopback: its Claw-R1 routes need no key."""
    stack = launch_stack(tmp_path_factory.mktemp("claw_r1"), compat="claw-r1")
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()
