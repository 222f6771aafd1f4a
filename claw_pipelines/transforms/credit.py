"""Credit assignment: spread a trajectory's outcome over its steps."""

from __future__ import annotations

import polars as pl

from claw_pipelines.reward_rules import CreditAssignment


def assign_credit(frame: pl.LazyFrame, credit: CreditAssignment) -> pl.LazyFrame:
    """Set ``reward`` from ``step_reward`` and ``outcome_reward`` per trajectory (by step_index).

    Trajectories with neither get ``reward`` null; otherwise missing parts count as 0.
    """
    raise NotImplementedError
