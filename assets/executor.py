"""The executor of every run: Dagster's in-process executor, with pool claims that sleep while
they wait, plus freeing the pool slots that runs whose process died still hold.

Each incremental asset has its own pool (``claw_<table>``, one slot: ``dagster.yaml``). A run
that dies without ending, such as a ``dagster asset materialize`` killed with ``kill -9``, keeps
its slot: its run stays STARTED, and a run started outside the daemon has no run monitor, so
every later run of that asset waits for the slot for good. So each run tags itself with the
process that runs it (host, pid, process start time) and, while it runs, looks at the runs
holding or waiting for the slots of its pools: one whose process on this host is gone is marked
failed and its slots freed (a finished run's too, as the daemon would after
``free_slots_after_run_end_seconds``). Runs of other hosts are left to their own host.

A step whose pool is full waits for a slot. Dagster's in-process loop never sleeps while it
waits (``InstanceConcurrencyContext.interval_to_next_pending_claim_check`` returns at most 0)
and asks again only after 1 s, growing to 15 s. So a refresh run that queued behind another
burned a core on a two-core machine and took the slot up to seconds after it was free.
``PoolClaims`` asks every ``CLAIM_RETRY_S`` and sleeps in between.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import psutil
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import inner_plan_execution_iterator
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.executor.in_process import InProcessExecutor

WORKER_TAG = "claw/run_worker"
CHECK_EVERY_S = 2.0
"""How often a run looks for dead holders while it runs (and may be waiting for a slot)."""
CLAIM_RETRY_S = 0.25
"""How often a step waiting for a pool slot asks for it again (Dagster: 1 s, growing to 15)."""


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


class PoolClaims(InstanceConcurrencyContext):
    """A run's pool claims that ask again every ``CLAIM_RETRY_S`` and let the loop sleep until
    then: a slot one run frees is the next run's within a quarter second, at no CPU meanwhile."""

    def claim(self, concurrency_key: str, step_key: str, step_priority: int = 0) -> bool:
        claimed = super().claim(concurrency_key, step_key, step_priority)
        if not claimed and step_key in self._pending_timeouts:
            retry_at = time.time() + CLAIM_RETRY_S
            self._pending_timeouts[step_key] = min(self._pending_timeouts[step_key], retry_at)
        return claimed

    def interval_to_next_pending_claim_check(self) -> float:
        retries = [self._pending_timeouts.get(step) for step in self._pending_claims]
        due = [retry_at for retry_at in retries if retry_at is not None]
        return max(0.0, min(due) - time.time()) if due else 0.0


def _steps_with_pool_claims(job_context, execution_plan) -> Iterator[dg.DagsterEvent]:
    with PoolClaims(job_context.instance, job_context.dagster_run) as claims:
        yield from inner_plan_execution_iterator(job_context, execution_plan, claims)


class ClawExecutor(InProcessExecutor):
    """Dagster's in-process executor with ``PoolClaims``, run while ``free_slots_of_dead_runs``
    watches its pools."""

    def execute(self, plan_context, execution_plan) -> Iterator[dg.DagsterEvent]:
        instance, run_id = plan_context.instance, plan_context.dagster_run.run_id
        instance.add_run_tags(run_id, {WORKER_TAG: RunWorker.current().tag})
        steps = execution_plan.get_steps_to_execute_in_topo_order()
        pools = {step.pool for step in steps if step.pool}
        watching = _watching_pools(instance, pools, run_id) if pools else contextlib.nullcontext()
        with watching:
            yield from self._steps_in_process(plan_context)

    def _steps_in_process(self, plan_context) -> Iterator[dg.DagsterEvent]:
        """What ``InProcessExecutor.execute`` does, with ``PoolClaims`` for the steps' claims."""
        step_keys = plan_context.execution_plan.step_keys_to_execute
        in_process = EngineEventData.in_process(os.getpid(), step_keys)
        yield DagsterEvent.engine_event(
            plan_context, f"Executing steps in process (pid: {os.getpid()})", in_process
        )
        started = time.perf_counter()
        yield from ExecuteRunWithPlanIterable(
            execution_plan=plan_context.execution_plan,
            iterator=_steps_with_pool_claims,
            execution_context_manager=PlanExecutionContextManager(
                job=plan_context.job,
                retry_mode=plan_context.retry_mode,
                execution_plan=plan_context.execution_plan,
                run_config=plan_context.run_config,
                dagster_run=plan_context.dagster_run,
                instance=plan_context.instance,
                raise_on_error=plan_context.raise_on_error,
                output_capture=plan_context.output_capture,
                step_dependency_config=self.step_dependency_config,
            ),
        )
        yield DagsterEvent.engine_event(
            plan_context,
            f"Finished steps in process (pid: {os.getpid()}) in "
            f"{time.perf_counter() - started:.2f} s",
            in_process,
        )


@dg.executor(name="in_process", config_schema=dg.in_process_executor.config_schema)
def claw_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """``in_process`` (one process per run: steps are small and write their own tables), same
    name and config, with pool claims that sleep while they wait and free dead runs' slots."""
    inner = dg.in_process_executor.executor_creation_fn(init_context)
    return ClawExecutor(
        retries=inner.retries,
        step_dependency_config=inner.step_dependency_config,
        marker_to_close=inner.marker_to_close,
    )
