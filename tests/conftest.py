"""Session-wide services shared by the test areas: one embedded engine and one capture proxy (and
one more of each, with Claw-R1's protocol on, for the tests that use it).

Starting the real LiteLLM proxy takes 10-40 s on two cores, so areas share this one unless a
test needs its own (several workers, kill -9). See stack_fixtures.py.

``make test`` runs the suite on two pytest-xdist workers, a test file at a time (``--dist
loadfile``): a module fixture starts once, a session fixture once in each worker that uses it.
The files that share a costly session service of their area run on one worker together
(``ONE_WORKER_FILES``), so it starts once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from stack_fixtures import CaptureStack, launch_stack
from xdist.scheduler import LoadFileScheduling

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ONE_WORKER_FILES = {
    "fake_backend_stack": (
        "tests/capture/test_backend_answers.py",
        "tests/capture/test_capture_limits.py",
        "tests/capture/test_capture_secrets.py",
    ),
    "fleet": ("tests/objectstore/test_lake_on_s3.py", "tests/objectstore/test_many_proxies.py"),
}
"""The files using a session fixture that starts LiteLLM proxies (10-40 s each on two cores):
the fleet's three, the fake backend's one. ``capture_stack`` serves every area: it starts in
both workers rather than holding most of the suite on one."""
UNIT_OF_FILE = {file: service for service, files in ONE_WORKER_FILES.items() for file in files}
TEST_UNIT_FILES = {"tests/bench/test_benches_quick.py"}
"""Files whose tests are each a unit of their own, spread over both workers: each runs a
benchmark in its own process, up to minutes each."""


class SharedServiceScheduling(LoadFileScheduling):
    """``--dist loadfile``, with the files of a ``ONE_WORKER_FILES`` service as one unit and
    each test of a ``TEST_UNIT_FILES`` file as one.

    Scheduled by node id: the ``xdist_group`` marks of ``--dist loadgroup`` reach the scheduler
    as a node id suffix, which pytest 9.2's node ids no longer take (pytest-xdist #1386).
    """

    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::")[0]
        if file in TEST_UNIT_FILES:
            return nodeid
        return UNIT_OF_FILE.get(file, file)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None
    return SharedServiceScheduling(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that uses a ``ONE_WORKER_FILES`` service from a file not listed with it: that
    file would start the service a second time, on the other worker."""
    file = item.nodeid.split("::")[0]
    for service, files in ONE_WORKER_FILES.items():
        if service in item.fixturenames and file not in files:
            pytest.fail(f"{file} uses {service}: add it to ONE_WORKER_FILES in tests/conftest.py")


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
