"""The executor of every run: Dagster's in-process executor, plus freeing the pool slots that
runs whose process died still hold.

Each incremental asset has its own pool (``claw_<table>``, one slot: ``dagster.yaml``). A run
that dies without ending, such as a ``dagster asset materialize`` killed with ``kill -9``, keeps
its slot: its run stays STARTED, and a run started outside the daemon has no run monitor, so
every later run of that asset waits for the slot for good. So each run tags itself with the
process that runs it (host, pid, process start time) and, while it runs, looks at the runs
holding or waiting for the slots of its pools: one whose process on this host is gone is marked
failed and its slots freed (a finished run's too, as the daemon would after
``free_slots_after_run_end_seconds``). Runs of other hosts are left to their own host.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import psutil

WORKER_TAG = "claw/run_worker"
CHECK_EVERY_S = 2.0
"""How often a run looks for dead holders while it runs (and may be waiting for a slot)."""


@dataclass(frozen=True)
class RunWorker:
    """The process running a run: its host, pid and start time (a reused pid starts later)."""

    host: str
    pid: int
    started: float

    @classmethod
    def current(cls) -> RunWorker:
        return cls.of(psutil.Process().pid)

    @classmethod
    def of(cls, pid: int) -> RunWorker:
        """The process ``pid`` of this host."""
        return cls(socket.gethostname(), pid, psutil.Process(pid).create_time())

    @property
    def tag(self) -> str:
        return f"{self.host}/{self.pid}/{self.started:.2f}"

    @classmethod
    def from_tag(cls, tag: str | None) -> RunWorker | None:
        try:
            host, pid, started = (tag or "").rsplit("/", 2)
            return cls(host, int(pid), float(started))
        except ValueError:
            return None

    def is_gone(self) -> bool:
        """Whether this process has ended; only known for a process of this host."""
        if self.host != socket.gethostname():
            return False
        try:
            return f"{psutil.Process(self.pid).create_time():.2f}" != f"{self.started:.2f}"
        except psutil.NoSuchProcess:
            return True


def free_slots_of_dead_runs(instance: dg.DagsterInstance, pools: set[str], own_run: str) -> int:
    """Free the slots (held or waited for) in ``pools`` of runs that can no longer free them:
    finished, or unfinished with their worker gone (marked failed). Returns how many runs."""
    storage = instance.event_log_storage
    infos = storage.get_concurrency_infos(sorted(pools))
    holders = {slot.run_id for info in infos.values() for slot in info.claimed_slots}
    holders |= {step.run_id for info in infos.values() for step in info.pending_steps}
    freed = 0
    for run_id in sorted(holders - {own_run}):
        run = instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            worker = RunWorker.from_tag(run.tags.get(WORKER_TAG))
            if worker is None or not worker.is_gone():
                continue
            instance.report_run_failed(
                run, f"its process {worker.tag} is gone; run {own_run} freed its pool slots"
            )
        storage.free_concurrency_slots_for_run(run_id)
        freed += 1
    return freed


@contextlib.contextmanager
def _watching_pools(instance: dg.DagsterInstance, pools: set[str], own_run: str) -> Iterator[None]:
    """Free dead runs' slots now and every ``CHECK_EVERY_S`` until the block ends."""
    stop = threading.Event()

    def watch() -> None:
        while True:
            with contextlib.suppress(Exception):  # the next round tries again
                free_slots_of_dead_runs(instance, pools, own_run)
            if stop.wait(CHECK_EVERY_S):
                return

    watcher = threading.Thread(target=watch, name="claw-pool-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=30)


class FreeingDeadRunsSlots(dg.Executor):
    """Dagster's in-process executor, run while ``free_slots_of_dead_runs`` watches its pools."""

    def __init__(self, inner: dg.Executor) -> None:
        self.inner = inner

    @property
    def retries(self):
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator[dg.DagsterEvent]:
        instance, run_id = plan_context.instance, plan_context.dagster_run.run_id
        instance.add_run_tags(run_id, {WORKER_TAG: RunWorker.current().tag})
        steps = execution_plan.get_steps_to_execute_in_topo_order()
        pools = {step.pool for step in steps if step.pool}
        if not pools:
            yield from self.inner.execute(plan_context, execution_plan)
            return
        with _watching_pools(instance, pools, run_id):
            yield from self.inner.execute(plan_context, execution_plan)


@dg.executor(name="in_process", config_schema=dg.in_process_executor.config_schema)
def claw_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """``in_process`` (one process per run: steps are small and write their own tables), same
    name and config, freeing the pool slots of dead runs."""
    return FreeingDeadRunsSlots(dg.in_process_executor.executor_creation_fn(init_context))
