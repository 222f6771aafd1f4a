"""A run killed outside the daemon does not hold its pool slot for good: the next run of the
asset frees it (``assets/executor.py``) instead of waiting "blocked by limit for pool" forever.

The run to kill must hang *inside* its step, after it claimed the slot. Its lake is local (the
definitions probe only an object-store lake at load) and its ``turns`` table's
``_delta_log/_last_checkpoint`` is a named pipe with no writer: delta-rs opens that file when it
opens the table, which only the steps step does, and the open blocks until it is killed. (A pipe
as the log entry ``00000000000000000000.json`` would not do: delta-rs lists only regular files
and finds no table.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from claw_pipelines.processes import start_service, stop_group

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")
MATERIALIZE_STEPS = [DAGSTER, "asset", "materialize", "-m", "assets.definitions"]
MATERIALIZE_STEPS += ["--select", "steps"]


@pytest.fixture
def hanging_lake(tmp_path: Path) -> Path:
    """A local lake whose ``turns`` table cannot be opened: its ``_last_checkpoint`` is a FIFO
    nobody writes to, so a run's steps step blocks opening it while the run holds its slot."""
    lake = tmp_path / "hanging-lake"
    log = lake / "turns" / "_delta_log"
    log.mkdir(parents=True)
    os.mkfifo(log / "_last_checkpoint")
    return lake


def _run_env(home: Path, lake: Path) -> dict[str, str]:
    return {"DAGSTER_HOME": str(home), "CLAW_LAKE_URI": str(lake), "CLAW_STORAGE_OPTIONS": "{}"}


def _slot_holders(home: Path, pool: str) -> set[str]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        info = instance.event_log_storage.get_concurrency_info(pool)
        return {slot.run_id for slot in info.claimed_slots}


def _holders_inside_their_step(home: Path, pool: str) -> set[str]:
    """The runs holding a slot of ``pool`` whose step has started."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {
            run_id
            for run_id in _slot_holders(home, pool)
            if instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)
        }


def test_a_killed_cli_run_does_not_keep_its_pool_slot(tmp_path: Path, hanging_lake: Path) -> None:
    home = tmp_path / "dagster-home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    killed = start_service(
        "killed-run",
        MATERIALIZE_STEPS,
        "http://unused",
        tmp_path / "killed-run.log",
        env=_run_env(home, hanging_lake),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 180
        while not (holders := _holders_inside_their_step(home, "claw_steps")):
            assert killed.alive(), killed.log_tail()
            assert time.monotonic() < deadline, f"no step took the slot:\n{killed.log_tail()}"
            time.sleep(0.5)
    finally:
        stop_group(killed.process, grace_s=0, sig=signal.SIGKILL)

    env = {**os.environ, **_run_env(home, tmp_path / "lake")}
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
