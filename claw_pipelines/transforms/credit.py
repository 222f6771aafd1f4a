"""Credit assignment: spread a trajectory's outcome over its steps."""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field


class CreditAssignment(BaseModel):
    """last_step: outcome on the final step; broadcast: outcome on every step; discounted:
    G_t = r_t + gamma * G_{t+1} with the outcome added to the final step's r."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["last_step", "broadcast", "discounted"] = "last_step"
    gamma: float = Field(default=1.0, gt=0.0, le=1.0)


def assign_credit(frame: pl.LazyFrame, credit: CreditAssignment) -> pl.LazyFrame:
    """Set ``reward`` from ``step_reward`` and ``outcome_reward`` per trajectory (by step_index).

    The final step is the one with the highest step_index (so steps of a reopened trajectory
    count). Trajectories with neither kind of reward get ``reward`` null and
    ``reward_present`` false; otherwise missing parts count as 0. The discounted return is
    computed as a reverse cumulative sum of gamma^k * r_k scaled by gamma^-t, which is exact
    for the trajectory lengths agents produce (gamma^k stays far from float underflow). Its
    terms become columns first: a window nested in another runs once per trajectory (100k
    one-step trajectories: 1.3 against 0.2 CPU s).
    """
    by = "trajectory_id"
    last = pl.col("step_index") == pl.col("step_index").max().over(by)
    present = (pl.col("outcome_reward").is_not_null() | pl.col("step_reward").is_not_null()).any()
    outcome = pl.col("outcome_reward").fill_null(0.0)
    immediate = pl.col("step_reward").fill_null(0.0)
    terminal = immediate + pl.when(last).then(outcome).otherwise(0.0)
    steps = frame.sort(by, "step_index").with_columns(present.over(by).alias("reward_present"))
    terms: list[str] = []
    if credit.method == "last_step":
        credited = terminal
    elif credit.method == "broadcast":
        credited = immediate + outcome
    else:
        position = pl.col("step_index").rank("ordinal").over(by).cast(pl.Float64) - 1
        terms = ["_weight", "_terminal"]
        steps = steps.with_columns(
            pl.lit(credit.gamma, pl.Float64).pow(position).alias("_weight"),
            terminal.alias("_terminal"),
        )
        weight = pl.col("_weight")
        credited = (pl.col("_terminal") * weight).cum_sum(reverse=True).over(by) / weight
    return steps.with_columns(
        pl.when(pl.col("reward_present")).then(credited).otherwise(None).alias("reward")
    ).drop(terms)
