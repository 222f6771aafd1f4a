"""``ForkedRunLauncher`` (``resources/run_launcher.py``): runs start from a forkserver that
imported Dagster, and only modules that start no thread are imported there; a run can be
terminated, and a run whose process was killed is reported failed by the health check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.launcher import WorkerStatus

from assets.executor import WORKER_TAG, RunWorker
from resources.run_launcher import PRELOAD

JOBS = str(Path(__file__).with_name("forked_jobs.py"))
LAUNCHER = {"module": "resources.run_launcher", "class": "ForkedRunLauncher"}


def test_the_preloaded_modules_start_no_thread_and_load_no_thread_pool() -> None:
    """A fork keeps only the forking thread: a pool started before it would hang the runs."""
    script = (
        "import importlib, json, os, sys\n"
        f"for name in {list(PRELOAD)!r}: importlib.import_module(name)\n"
        "pools = [n for n in ('numpy', 'polars', 'pyarrow', 'deltalake') if n in sys.modules]\n"
        "print(json.dumps([len(os.listdir('/proc/self/task')), pools]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [1, []]


def _launch(instance: dg.DagsterInstance, job: str, op: str, config: dict) -> str:
    """Launch ``job`` of ``forked_jobs.py`` with ``config`` for its one ``op``."""
    recon = ReconstructableJob.for_file(JOBS, job)
    run = instance.create_run_for_job(
        job_def=recon.get_definition(),
        run_config={"ops": {op: {"config": config}}},
        job_code_origin=recon.get_python_origin(),
    )
    instance.launch_run(run.run_id, workspace=None)
    return run.run_id


def _wait_until(condition, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    return instance.get_run_by_id(run_id).status


def _finished(instance: dg.DagsterInstance, run_id: str) -> bool:
    return instance.get_run_by_id(run_id).is_finished


def test_a_run_is_forked_from_the_forkserver_and_succeeds(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    with dg.instance_for_test(overrides={"run_launcher": LAUNCHER}) as instance:
        run_id = _launch(instance, "reporting_job", "report_process", {"report": str(report)})
        _wait_until(lambda: _finished(instance, run_id))
        assert _status(instance, run_id) == dg.DagsterRunStatus.SUCCESS
        worker = RunWorker.from_tag(instance.get_run_by_id(run_id).tags[WORKER_TAG])
    parent, unsafe, storage = report.read_text().splitlines()
    assert "multiprocessing.forkserver" in parent
    assert unsafe == "[]"  # imported by no run of this job, so not by the forkserver
    assert storage == "KeptConnectionsEventLogStorage"  # resources/run_worker_storage.py
    assert worker is not None and worker.pid != os.getpid()


def test_a_terminated_run_ends_canceled(tmp_path: Path) -> None:
    started = tmp_path / "started"
    with dg.instance_for_test(overrides={"run_launcher": LAUNCHER}) as instance:
        run_id = _launch(instance, "waiting_job", "wait_forever", {"started": str(started)})
        _wait_until(started.exists)
        assert instance.run_launcher.terminate(run_id)
        _wait_until(lambda: _finished(instance, run_id))
        assert _status(instance, run_id) == dg.DagsterRunStatus.CANCELED
        assert not instance.run_launcher.terminate(run_id)


def test_the_health_check_fails_a_run_whose_process_was_killed(tmp_path: Path) -> None:
    started = tmp_path / "started"
    with dg.instance_for_test(overrides={"run_launcher": LAUNCHER}) as instance:
        run_id = _launch(instance, "waiting_job", "wait_forever", {"started": str(started)})
        _wait_until(started.exists)
        launcher = instance.run_launcher
        run = instance.get_run_by_id(run_id)
        assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
        os.kill(int(started.read_text()), signal.SIGKILL)
        _wait_until(lambda: launcher.check_run_worker_health(run).status == WorkerStatus.FAILED, 30)


def test_a_location_served_by_another_python_goes_through_its_code_server() -> None:
    """Dagster's default launcher needs the workspace to find the location's code server."""
    recon = ReconstructableJob.for_file(JOBS, "reporting_job")
    origin = recon.get_python_origin()
    origin = origin._replace(
        repository_origin=origin.repository_origin._replace(executable_path="/other/bin/python")
    )
    with dg.instance_for_test(overrides={"run_launcher": LAUNCHER}) as instance:
        run = instance.create_run_for_job(
            job_def=recon.get_definition(),
            run_config={"ops": {"report_process": {"config": {"report": "unused"}}}},
            job_code_origin=origin,
        )
        with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):
            instance.launch_run(run.run_id, workspace=None)
