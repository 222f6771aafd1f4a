"""Starts each run in a process forked from one that has Dagster imported already.

Dagster's default launcher asks the code server to spawn a fresh interpreter per run, which
imports Dagster and its storage (about a second of CPU on two cores) before it loads the code
location: on a lake under steady traffic, where a refresh run starts every few seconds, that
start-up is a third of each run's CPU and most of the wait between a run leaving the queue and
its first step. This launcher forks each run from a ``forkserver`` that imported Dagster once
(``PRELOAD``); the run then does what ``dagster api execute_run`` does, loading the code
location itself, so a changed recipe or a reloaded location is what the next run sees. Dagster
has no such option for runs (dagster-io/dagster#8638); its multiprocess executor has one for
steps. A code location served by another Python (its ``executable_path``) is launched by
Dagster's default launcher, through its code server. A forked run stores its events through
``run_worker_storage``, which keeps the run's SQLite connections.

Only modules that start no thread are preloaded: a fork keeps only the forking thread, so a
thread pool made before it (numpy's, Arrow's, polars', delta-rs') would be broken in every run;
each run imports those itself (``tests/dagster/test_run_launcher.py`` checks the list).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.context import BaseContext

import dagster as dg
import psutil
from dagster._cli.api import execute_run_command
from dagster._core.launcher import (
    CheckRunHealthResult,
    DefaultRunLauncher,
    LaunchRunContext,
    WorkerStatus,
)
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value
from dagster._utils.interrupts import setup_interrupt_handlers

from assets.executor import WORKER_TAG, RunWorker
from resources.run_worker_storage import run_worker_ref

PRELOAD = (
    "dagster._cli.api",
    "dagster._core.execution.api",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
    "pydantic",
    "httpx",
)
"""What the forkserver imports once for every run: Dagster, its SQLite storage and execution,
and the pure-Python libraries the code location uses."""

_lock = threading.Lock()
_context: BaseContext | None = None


def forkserver() -> BaseContext:
    """This process's forkserver context, with ``PRELOAD`` set before its server starts."""
    global _context
    with _lock:
        if _context is None:
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(list(PRELOAD))
        return _context


def execute_run(input_json: str) -> None:
    """What ``dagster api execute_run <input_json>`` does, in a forked process (a SIGTERM,
    as ``terminate`` sends, interrupts the run as it would that command)."""
    setup_interrupt_handlers()
    execute_run_command.callback(input_json=input_json, compressed_input_json=None)


class ForkedRunLauncher(DefaultRunLauncher):
    """Launches each run in a process forked from a forkserver with Dagster preloaded."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None or origin.executable_path != sys.executable:
            super().launch_run(context)
            return
        args = ExecuteRunArgs(
            job_origin=origin,
            run_id=run.run_id,
            instance_ref=run_worker_ref(self._instance.get_ref()),
            set_exit_code_on_failure=True,
        )
        process = forkserver().Process(
            target=execute_run, args=(serialize_value(args),), name=f"dagster-run-{run.run_id}"
        )
        process.start()
        with contextlib.suppress(psutil.NoSuchProcess):  # already ended: its events say why
            self._instance.add_run_tags(run.run_id, {WORKER_TAG: RunWorker.of(process.pid).tag})

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if GRPC_INFO_TAG in run.tags:
            return super().terminate(run_id)
        worker = RunWorker.from_tag(run.tags.get(WORKER_TAG))
        if worker is None or worker.is_gone():
            return False
        self._instance.report_run_canceling(run)
        os.kill(worker.pid, signal.SIGTERM)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        """FAILED once the run's process on this host is gone (every run tags its process,
        ``assets/executor.py``); RUNNING otherwise, including a process of another host."""
        worker = RunWorker.from_tag(run.tags.get(WORKER_TAG))
        if worker is not None and worker.is_gone():
            return CheckRunHealthResult(WorkerStatus.FAILED, f"its process {worker.tag} is gone")
        return CheckRunHealthResult(WorkerStatus.RUNNING)
