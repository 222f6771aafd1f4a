"""A run killed outside the daemon does not hold its pool slot for good: the next run of the
asset frees it (``assets/executor.py``) instead of waiting "blocked by limit for pool" forever."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from claw_pipelines.processes import start_service, stop_group

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")
MATERIALIZE_STEPS = [DAGSTER, "asset", "materialize", "-m", "assets.definitions"]
MATERIALIZE_STEPS += ["--select", "steps"]


@pytest.fixture
def silent_store() -> Iterator[int]:
    """A loopback port that accepts connections and never answers: a lake there makes a run's
    first read hang while it holds its slot."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=10)
        for connection in held:
            connection.close()
        server.close()


def _slot_holders(home: Path, pool: str) -> set[str]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        info = instance.event_log_storage.get_concurrency_info(pool)
        return {slot.run_id for slot in info.claimed_slots}


@pytest.mark.skip(
    reason="the definitions now probe an object-store lake at load (issue 19), so the silent "
    "store hangs the run before it claims its slot; the hang must be injected after the probe"
)
def test_a_killed_cli_run_does_not_keep_its_pool_slot(tmp_path: Path, silent_store: int) -> None:
    home = tmp_path / "dagster-home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    hanging_lake = {
        "CLAW_LAKE_URI": "s3://bucket/lake",
        "CLAW_STORAGE_OPTIONS": json.dumps(
            {
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent_store}",
                "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_REGION": "us-east-1",
            }
        ),
    }
    killed = start_service(
        "killed-run",
        MATERIALIZE_STEPS,
        "http://unused",
        tmp_path / "killed-run.log",
        env={"DAGSTER_HOME": str(home), **hanging_lake},
        cwd=REPO,
    )
    deadline = time.monotonic() + 180
    while not (holders := _slot_holders(home, "claw_steps")):
        assert killed.alive(), killed.log_tail()
        assert time.monotonic() < deadline, f"no run took the slot:\n{killed.log_tail()}"
        time.sleep(0.5)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.process.wait(timeout=30)

    env = {**os.environ, "DAGSTER_HOME": str(home), "CLAW_LAKE_URI": str(tmp_path / "lake")}
    env.pop("CLAW_STORAGE_OPTIONS", None)
    next_run = subprocess.Popen(
        MATERIALIZE_STEPS, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = next_run.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        stop_group(next_run, grace_s=5, sig=signal.SIGKILL)
        output, _ = next_run.communicate()
        pytest.fail(f"the next run still waited for the slot after 240 s:\n{output[-3000:]}")
    assert next_run.returncode == 0, output[-3000:]
    assert "RUN_SUCCESS" in output
    (dead_run,) = holders
    with dg.DagsterInstance.from_config(str(home)) as instance:
        record = instance.get_run_by_id(dead_run)
        assert record is not None and record.status == dg.DagsterRunStatus.FAILURE
        (failure,) = instance.all_logs(dead_run, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert "is gone" in failure.message
    assert not _slot_holders(home, "claw_steps")
