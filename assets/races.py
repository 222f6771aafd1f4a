"""A step that lost a commit race (``incremental.increment.ConcurrentRun``) is retried by Dagster.

The losing run wrote nothing that counts, and its retry reads on from the winner's watermark,
so an instance without the pool limits of dagster.yaml (which queue such runs instead) still
refreshes without anyone relaunching.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import dagster as dg

from claw_pipelines.lake.commits import ConcurrentRun

RACE_RETRIES = 3
"""How often a step that lost a commit race is retried (each retry reads on from the winner)."""

RACE_RETRY_WAIT_S = 1.0

P = ParamSpec("P")
R = TypeVar("R")


class RaceLost(dg.RetryRequested):
    """Dagster's retry of a step, with the message of the race it lost."""

    def __init__(self, race: ConcurrentRun) -> None:
        super().__init__(max_retries=RACE_RETRIES, seconds_to_wait=RACE_RETRY_WAIT_S)
        self.args = race.args


def retried_when_raced(compute: Callable[P, R]) -> Callable[P, R]:
    """``compute`` (an asset's body), retried by Dagster when it raises ``ConcurrentRun``."""

    @functools.wraps(compute)
    def retried(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return compute(*args, **kwargs)
        except ConcurrentRun as race:
            raise RaceLost(race) from race

    return retried
