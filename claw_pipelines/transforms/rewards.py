"""Join rewards onto steps and assign credit.

Incremental rule for late rewards: steps are append-only, rewards are append-only, and
``rewarded_steps`` is recomputed per trajectory. Each run takes the trajectories touched by new
steps, new rewards (turn targets map through the steps, group targets to every trajectory of the
group) or new events (``affected_trajectories``), recomputes their rows from all of their steps
and rewards (``reward_steps``), and replaces those trajectories' rows downstream.
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.reward_rules import ModelJudge, RewardConfig


def affected_trajectories(
    new_steps: pl.LazyFrame | pl.DataFrame | None,
    new_rewards: pl.LazyFrame | pl.DataFrame | None,
    new_events: pl.LazyFrame | pl.DataFrame | None,
    step_index: pl.LazyFrame | pl.DataFrame,
) -> pl.DataFrame:
    """Distinct ``trajectory_id`` whose rewarded rows must be recomputed.

    ``step_index``: (turn_id, trajectory_id, group_id) of all emitted steps (a narrow scan of the
    steps table), used to resolve turn- and group-targeted rewards to trajectories.
    """
    raise NotImplementedError


def reward_steps(
    steps: pl.LazyFrame | pl.DataFrame,
    rewards: pl.LazyFrame | pl.DataFrame | None,
    events: pl.LazyFrame | pl.DataFrame | None,
    config: RewardConfig,
    *,
    judge: ModelJudge | None = None,
) -> pl.LazyFrame:
    """``REWARDED_STEPS`` rows for ``steps`` (all steps of the affected trajectories).

    Reward sources: rewards rows (turn -> step reward; trajectory and group -> outcome), event
    rewards (source ``env``), rule rewards and the optional model judge declared in ``config``.
    Per target the highest-priority source wins (``config.source_priority``), the latest value
    within it. ``reward`` is credited by ``config.credit_assignment``.
    """
    raise NotImplementedError
