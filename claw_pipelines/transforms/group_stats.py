"""Group-relative advantages over trajectories, for recipes whose ``group_statistics`` is
``per_trajectory``.

A batch has one row per step, so a trainer's own GRPO/RLOO estimator (verl's
``compute_grpo_outcome_advantage``) counts a trajectory of k steps k times in its group's mean
and std. Here each trajectory counts once: its score is its return, the statistics are taken
over the group's trajectories and the advantage is broadcast to every step. The formulas are
verl's: GRPO ``(score - mean) / (std + 1e-6)`` with the unbiased std, a group of one scoring
against mean 0 and std 1; RLOO the leave-one-out baseline ``n / (n - 1) * (score - mean)``,
a group of one keeping its score.
"""

from __future__ import annotations

import polars as pl

EPSILON = 1e-6


def trajectory_advantage(algorithm: str) -> pl.Expr:
    """``advantage`` of each row of a frame of trajectories (``group_id``, ``_score``), over
    the trajectories of its group_id."""
    score = pl.col("_score")
    size = pl.len().over("group_id")
    mean = score.mean().over("group_id")
    if algorithm == "grpo":
        std = score.std(ddof=1).over("group_id")
        advantage = pl.when(size > 1).then((score - mean) / (std + EPSILON))
        advantage = advantage.otherwise(score / (1 + EPSILON))
    elif algorithm == "rloo":
        advantage = pl.when(size > 1).then((score - mean) * size / (size - 1)).otherwise(score)
    else:
        raise ValueError(f"group statistics are for grpo and rloo, not {algorithm}")
    return advantage.cast(pl.Float64).alias("advantage")
