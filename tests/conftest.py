"""Session-wide services shared by the test areas: one embedded engine and one capture proxy (and
one more of each, with Claw-R1's protocol on, for the tests that use it).

Starting the real LiteLLM proxy takes 10-40 s on two cores, so areas share this one unless a
test needs its own (several workers, kill -9). See stack_fixtures.py.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadgroup``): a session
fixture starts once in each worker that uses it, a module fixture once, as each file runs on
one worker; the few files that share a costly session service run on one worker together.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from stack_fixtures import CaptureStack, launch_stack

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ONE_WORKER_SERVICES = ("fake_backend_stack", "fleet")
"""Session fixtures whose files run on one worker, so they start once: the fleet is three
proxies, the fake backend's proxy serves three files of one area. ``capture_stack`` serves every
area and starts in both workers."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each test in the xdist group of its file, files using a service of
    ``ONE_WORKER_SERVICES`` in that service's group (before xdist reads the marks)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    group = {item.path: item.nodeid.split("::")[0] for item in items}
    for service in ONE_WORKER_SERVICES:
        users = {group[item.path] for item in items if service in item.fixturenames}
        group = {path: service if name in users else name for path, name in group.items()}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item.path]))


@pytest.fixture(scope="session")
def capture_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    stack = launch_stack(tmp_path_factory.mktemp("capture"))
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()


@pytest.fixture(scope="module")
def claw_r1_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    """A proxy run with ``--compat claw-r1``, on loopback: its Claw-R1 routes need no key."""
    stack = launch_stack(tmp_path_factory.mktemp("claw_r1"), compat="claw-r1")
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()
