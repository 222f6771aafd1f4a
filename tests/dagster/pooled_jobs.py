"""A job whose one step needs a slot of ``POOL``, run by the project's executor
(``test_pool_claims.py``)."""

import dagster as dg

from assets.executor import claw_executor

POOL = "claw_test_pool"


@dg.op(pool=POOL)
def pooled_step() -> None:
    """Does nothing once it has the slot: the test watches the wait before it."""


@dg.job(executor_def=claw_executor)
def pooled_job() -> None:
    pooled_step()
