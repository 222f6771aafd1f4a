"""Join rewards onto steps and assign credit.

Incremental rule for late rewards: steps are append-only, rewards are append-only, and
``rewarded_steps`` is recomputed per trajectory. Each run takes the trajectories touched by new
steps, new rewards (turn targets map through the steps, group targets to every trajectory of the
group), new events or new registrations (``affected_trajectories``), recomputes their rows from
all of their steps and rewards (``reward_steps``), and replaces those trajectories' rows
downstream.
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.derived_schemas import REWARDED_STEPS, fit
from claw_pipelines.lake.filters import keyed
from claw_pipelines.transforms import reward_rules
from claw_pipelines.transforms.credit import assign_credit


def _lazy(frame: pl.LazyFrame | pl.DataFrame | None) -> pl.LazyFrame | None:
    return None if frame is None else frame.lazy()


def affected_trajectories(
    new_steps: pl.LazyFrame | pl.DataFrame | None,
    new_rewards: pl.LazyFrame | pl.DataFrame | None,
    new_events: pl.LazyFrame | pl.DataFrame | None,
    step_index: pl.LazyFrame | pl.DataFrame,
    new_registrations: pl.LazyFrame | pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Distinct ``trajectory_id`` whose rewarded rows must be recomputed.

    ``step_index``: (turn_id, trajectory_id, group_id) of all emitted steps (a narrow scan of the
    steps table), used to resolve turn- and group-targeted rewards to trajectories. It is read
    only at the new rewards' targets (by key, so a Delta scan skips files by their statistics):
    a run's work follows its new rewards, not the steps table.
    """
    index = step_index.lazy().select("turn_id", "trajectory_id", "group_id")
    parts = []
    if (steps := _lazy(new_steps)) is not None:
        parts.append(steps.select("trajectory_id"))
    for frame in (new_events, new_registrations):
        if (rows := _lazy(frame)) is not None:
            parts.append(rows.select("trajectory_id"))
    if (rewards := _lazy(new_rewards)) is not None:
        targets = rewards.select("trajectory_id", "turn_id", "group_id").collect()
        parts += [
            targets.lazy().select("trajectory_id"),
            *(
                keyed(index, column, targets.get_column(column)).select("trajectory_id")
                for column in ("turn_id", "group_id")
            ),
        ]
    if not parts:
        return pl.DataFrame(schema={"trajectory_id": pl.String})
    return pl.concat(parts).drop_nulls().unique().sort("trajectory_id").collect()


def rewards_aimed_at(rewards: pl.LazyFrame | None, touched: pl.DataFrame) -> pl.DataFrame | None:
    """Every reward of ``rewards`` (old or new) aimed at a ``touched`` step, trajectory or group.
    The targets go into the scan as Series, not Python lists (100k touched steps: 45 ms
    against 130)."""
    if rewards is None:
        return None

    def aimed(column: str) -> pl.Expr:
        return pl.col(column).is_in(touched.get_column(column).implode())

    return rewards.filter(aimed("turn_id") | aimed("trajectory_id") | aimed("group_id")).collect()


_REWARD_COLUMNS = ["reward_id", "turn_id", "trajectory_id", "group_id", "value", "source",
                   "created_at"]  # fmt: skip


def _all_rewards(
    steps: pl.LazyFrame,
    rewards: pl.LazyFrame | None,
    events: pl.LazyFrame | None,
    config: reward_rules.RewardConfig,
    judge: reward_rules.ModelJudge | None,
    registrations: pl.LazyFrame | None,
    turns: pl.LazyFrame | pl.DataFrame | None,
) -> pl.LazyFrame:
    """Landed rewards, event rewards (source env) and rule/judge rewards in one shape."""
    rules = reward_rules.rule_rewards(
        steps, config, judge=judge, registrations=registrations, turns=turns
    )
    parts = [rules.select(_REWARD_COLUMNS)]
    if rewards is not None:
        parts.append(rewards.select(_REWARD_COLUMNS))
    if events is not None:
        parts.append(
            events.filter(pl.col("reward").is_not_null()).select(
                pl.col("event_id").alias("reward_id"),
                pl.lit(None, pl.String).alias("turn_id"),
                "trajectory_id",
                pl.lit(None, pl.String).alias("group_id"),
                pl.col("reward").alias("value"),
                pl.lit("env").alias("source"),
                "created_at",
            )
        )
    rank = {source: i for i, source in enumerate(config.source_priority)}
    return pl.concat(parts, how="vertical_relaxed").with_columns(
        pl.col("source")
        .replace_strict(rank, default=len(rank), return_dtype=pl.Int32)
        .alias("_rank")
    )


def _winner(frame: pl.LazyFrame, key: str, value: str) -> pl.LazyFrame:
    """Per key: the value of the highest-priority source, latest within it."""
    return (
        frame.sort(key, "_rank", "created_at", "reward_id", descending=[False, False, True, True])
        .group_by(key)
        .agg(pl.col("value").first().alias(value), pl.col("source").first().alias(f"{value}_src"))
    )


def reward_steps(
    steps: pl.LazyFrame | pl.DataFrame,
    rewards: pl.LazyFrame | pl.DataFrame | None,
    events: pl.LazyFrame | pl.DataFrame | None,
    config: reward_rules.RewardConfig,
    *,
    judge: reward_rules.ModelJudge | None = None,
    registrations: pl.LazyFrame | pl.DataFrame | None = None,
    turns: pl.LazyFrame | pl.DataFrame | None = None,
) -> pl.LazyFrame:
    """``REWARDED_STEPS`` rows for ``steps`` (all steps of the affected trajectories; their token
    lists are not needed and not kept).

    Reward sources: rewards rows (turn -> step reward; trajectory and group -> outcome), event
    rewards (source ``env``), rule rewards and the optional model judge declared in ``config``
    (their ground truth from the turns' metadata or the trajectories' ``registrations``).
    Per target the highest-priority source wins (``config.source_priority``), the latest value
    within it; a trajectory's own outcome beats its group's at equal priority only by being
    later. ``reward_sources`` lists the winning sources of the step's reward and outcome.
    ``reward`` is credited by ``config.credit_assignment``. ``turns``: where the rules read the
    steps' replies (None: ``steps`` carry them). ``trajectory_started_at``: the earliest start
    among the trajectory's steps; steps are only ever added to a trajectory, so it can only move
    earlier as more of them land.
    """
    steps = steps.lazy()
    candidates = _all_rewards(
        steps, _lazy(rewards), _lazy(events), config, judge, _lazy(registrations), turns
    ).collect()
    members = steps.select("trajectory_id", "group_id").unique()
    step_rewards = _winner(
        candidates.lazy().filter(pl.col("turn_id").is_not_null()), "turn_id", "step_reward"
    )
    outcome_candidates = pl.concat(
        [
            candidates.filter(pl.col("trajectory_id").is_not_null()).lazy(),
            candidates.filter(pl.col("group_id").is_not_null())
            .lazy()
            .drop("trajectory_id")
            .join(members, on="group_id"),
        ],
        how="diagonal",
    )
    outcomes = _winner(outcome_candidates, "trajectory_id", "outcome_reward")
    frame = (
        steps.join(step_rewards, on="turn_id", how="left")
        .join(outcomes, on="trajectory_id", how="left")
        .with_columns(
            pl.col("started_at").min().over("trajectory_id").alias("trajectory_started_at")
        )
    )
    return fit(assign_credit(_with_sources(frame), config.credit_assignment), REWARDED_STEPS)


def _with_sources(frame: pl.LazyFrame) -> pl.LazyFrame:
    """``frame`` plus ``reward_sources``: the winning sources of its step reward and outcome,
    without nulls or repeats. Built once per distinct pair and joined back: as list operations
    on every row it took ~90 ms per 100k steps, the lookup ~20."""
    pair = ["step_reward_src", "outcome_reward_src"]
    sources = pl.concat_list(pair).list.drop_nulls().list.unique(maintain_order=True)
    lookup = frame.select(pair).unique().with_columns(sources.alias("reward_sources"))
    return frame.join(lookup, on=pair, how="left", nulls_equal=True, maintain_order="left")
