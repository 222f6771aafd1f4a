"""A step waiting for a pool slot sleeps between asks and asks often (``assets/executor.py``,
``PoolClaims``): Dagster's in-process loop spun a core while it waited and asked again only
after 1 s and more."""

from __future__ import annotations

import threading
import time

import dagster as dg
from dagster._core.test_utils import create_run_for_test

from assets.executor import CLAIM_RETRY_S, WORKER_TAG, RunWorker
from tests.dagster.pooled_jobs import POOL, pooled_job

WAIT_S = 2.0


def _pending_runs(instance: dg.DagsterInstance) -> set[str]:
    info = instance.event_log_storage.get_concurrency_info(POOL)
    return {step.run_id for step in info.pending_steps}


def test_a_step_waiting_for_a_slot_sleeps_asks_often_and_runs_once_it_is_free() -> None:
    overrides = {"concurrency": {"pools": {"default_limit": 1}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots(POOL, 1)
        holder = create_run_for_test(
            instance,
            status=dg.DagsterRunStatus.STARTED,
            tags={WORKER_TAG: RunWorker.current().tag},  # alive: its slot is not freed
        ).run_id
        assert storage.claim_concurrency_slot(POOL, holder, "holder-step").is_claimed
        asks: list[float] = []
        claim = storage.claim_concurrency_slot

        def counted_claim(*args, **kwargs):
            asks.append(time.monotonic())
            return claim(*args, **kwargs)

        storage.claim_concurrency_slot = counted_claim
        results = []
        job = dg.reconstructable(pooled_job)
        runner = threading.Thread(target=lambda: results.append(dg.execute_job(job, instance)))
        runner.start()
        deadline = time.monotonic() + 60
        while not _pending_runs(instance) - {holder}:
            assert time.monotonic() < deadline, "the step never asked for the slot"
            time.sleep(0.05)

        cpu_before, wall_before = time.process_time(), time.monotonic()
        time.sleep(WAIT_S)
        cpu_waiting = time.process_time() - cpu_before
        asks_waiting = [at for at in asks if at >= wall_before]
        storage.free_concurrency_slot_for_step(holder, "holder-step")
        runner.join(timeout=60)

        assert not runner.is_alive()
        (result,) = results
        assert result.success
        assert cpu_waiting < WAIT_S / 4, f"{cpu_waiting:.2f} s of CPU in {WAIT_S} s of waiting"
        assert len(asks_waiting) >= WAIT_S / CLAIM_RETRY_S / 2, asks_waiting
