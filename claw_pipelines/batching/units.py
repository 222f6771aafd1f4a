"""How a batch plan picks its units from the eligible steps: whole trajectories (ppo,
reinforce_pp, sft), complete groups of them (grpo, rloo), or preference pairs from one state
(dpo), with the reason each step left out was dropped. Pure polars, called by
``planner.plan_batches``.

The units are ranked once, in batch order; the batch at ``position`` among those one plan
reserves together takes the units ranked ``[position * n, (position + 1) * n)`` (n units per
batch), so each of them comes out the same whether the plan is made for it alone (a re-plan from
its pins) or for all of them (the reservation)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import NamedTuple

import polars as pl

from claw_pipelines.batches.recipe import GROUPED, Recipe
from claw_pipelines.derived_schemas import (
    DPO_PAIRS,
    STORED_BATCH_ROWS,
    fit,
    with_turn_columns,
)
from claw_pipelines.transforms.group_stats import trajectory_advantage


class Units(NamedTuple):
    """What a plan takes from the eligible steps, whatever its kind of unit."""

    rows: pl.DataFrame
    """The batch's rows: ``STORED_BATCH_ROWS`` (pointing at their turns), or complete
    ``DPO_PAIRS``."""
    dropped: pl.DataFrame
    """Every step left out, with the reason (``dropped_as``)."""
    ready: bool
    """A full batch (``Recipe.units_per_batch`` units) is available."""
    consumed: pl.DataFrame
    """(turn_id, trajectory_id, group_id) of every step the batch uses."""
    consumed_before: pl.DataFrame
    """The same of the steps the batches before it in the plan use (``position`` > 0)."""
    pending: pl.Series
    """Trajectories left out by their own filters that their group still counts among its
    landed rollouts: while it waits for a rollout or keeps a member in play, their drops are
    not final (retired, a later plan would not see them, and the group would wait out its
    timeout)."""


NO_TRAJECTORIES = pl.Series("trajectory_id", [], pl.String)
"""``Units.pending`` of a plan with no group waiting."""


def dropped_as(frame: pl.DataFrame, reason: str | pl.Expr) -> pl.DataFrame:
    reason = pl.lit(reason) if isinstance(reason, str) else reason
    return frame.select("turn_id", "trajectory_id", "group_id", reason.alias("reason"))


REPLACEABLE = frozenset({"no_reward", "infra_failure"})
"""Filters a trajectory may yet pass, or be replaced for: its reward is still on its way, or
the runtime runs the rollout again after an engine or proxy error. Its group does not count it
among its landed rollouts; a trajectory left out by any other filter is landed for good."""


def _landed() -> pl.Expr:
    """A trajectory (aggregated over its steps) that its group counts as a landed rollout: it
    passes every filter, or one of its steps fails a filter that is not ``REPLACEABLE``."""
    reason = pl.col("_reason")
    out_for_good = reason.is_not_null() & ~reason.is_in(list(REPLACEABLE))
    return reason.is_null().all() | out_for_good.any()


class _Trajectories(NamedTuple):
    """``_trajectory_units``' results."""

    units: pl.DataFrame
    landed: pl.DataFrame
    drops: list[pl.DataFrame]


def _trajectory_units(recipe: Recipe, steps: pl.DataFrame) -> _Trajectories:
    """Trajectories whose steps all pass the filters (one row each), the landed trajectories
    (``_landed``: passing or out for good, with group and end), and the drops.

    A trajectory's ``_score`` is its return independent of credit assignment (outcome plus step
    rewards): the quantity zero-variance and min_reward filters are about. Its step count and
    last step index come along for its rows (``num_steps``, ``is_last``).
    """
    failing = steps.filter(pl.col("_reason").is_not_null())
    bad = failing.select("trajectory_id").unique()
    drops = [
        dropped_as(failing, pl.col("_reason")),
        dropped_as(
            steps.join(bad, on="trajectory_id").filter(pl.col("_reason").is_null()),
            "trajectory_filtered",
        ),
    ]
    trajectories = steps.group_by("trajectory_id").agg(
        pl.col("group_id").first(),
        pl.col("started_at").min().alias("_started"),
        pl.col("ended_at").max().alias("_ended"),
        (
            pl.col("outcome_reward").drop_nulls().first().fill_null(0.0)
            + pl.col("step_reward").fill_null(0.0).sum()
        ).alias("_score"),
        pl.len().alias("num_steps"),
        pl.col("step_index").max().alias("_last_step"),
        pl.col("_reason").is_null().all().alias("_passes"),
        _landed().alias("_landed"),
    )
    landed = trajectories.filter("_landed").select("trajectory_id", "group_id", "_ended")
    units = (
        trajectories.filter("_passes").drop("_passes", "_landed").sort("_started", "trajectory_id")
    )
    if recipe.filters.min_reward is not None:
        low = units.filter(pl.col("_score") < recipe.filters.min_reward)
        drops.append(dropped_as(steps.join(low.select("trajectory_id"), on="trajectory_id"),
                              "below_min_reward"))  # fmt: skip
        units = units.join(low.select("trajectory_id"), on="trajectory_id", how="anti")
    return _Trajectories(units, landed, drops)


IN_PLAY = frozenset({"waiting_for_group", "group_overflow", "next_batch"})
"""Why a passing member of a group is left out of a batch but stays in play: a later plan may
take it."""


class _Groups(NamedTuple):
    ready: pl.DataFrame
    """Members of ready groups, in batch order."""
    others: pl.DataFrame
    """Per-trajectory reasons for the other passing members (waiting_for_group,
    group_overflow, group_short, straggler_dropped, zero_variance, no_group)."""
    waiting: pl.DataFrame
    """The groups (``group_id``) waiting for a rollout."""


def _ready_groups(
    recipe: Recipe, units: pl.DataFrame, landed: pl.DataFrame, now: datetime
) -> _Groups:
    """Which groups a batch may take. A group is complete with ``group_size`` passing members
    (the first ones; later ones overflow). A group whose ``group_size`` rollouts have all
    landed (``landed``: members left out for good count) expects no more: it follows the
    straggler policy at once (``group_short`` when it drops). Others wait for a rollout until
    the straggler timeout after their last member's end, then follow the straggler policy."""
    n = recipe.group_size
    groups = (
        landed.filter(pl.col("group_id").is_not_null())
        .group_by("group_id")
        .agg(pl.len().alias("_landed"), pl.col("_ended").max().alias("_last_activity"))
        .with_columns(
            (
                pl.col("_last_activity")
                <= pl.lit(now) - timedelta(seconds=recipe.straggler_timeout_s)
            ).alias("_timed_out")
        )
    )
    members = (
        units.filter(pl.col("group_id").is_not_null())
        .with_columns(
            pl.int_range(pl.len()).over("group_id").alias("_rank"),
            pl.len().over("group_id").alias("_members"),
            pl.col("_started").min().over("group_id").alias("_group_started"),
        )
        .join(groups, on="group_id", how="left")
    )
    partial_ok = pl.lit(recipe.straggler_policy == "emit") & (pl.col("_members") >= 2)
    status = (
        pl.when(pl.col("_members") >= n)
        .then(
            pl.when(pl.col("_rank") < n).then(pl.lit("ready")).otherwise(pl.lit("group_overflow"))
        )
        .when(pl.col("_landed") >= n)
        .then(pl.when(partial_ok).then(pl.lit("ready")).otherwise(pl.lit("group_short")))
        .when(~pl.col("_timed_out"))
        .then(pl.lit("waiting_for_group"))
        .when(partial_ok)
        .then(pl.lit("ready"))
        .otherwise(pl.lit("straggler_dropped"))
    )
    members = members.with_columns(status.alias("_status"))
    ready = members.filter(pl.col("_status") == "ready")
    if recipe.filters.drop_zero_variance:
        flat = pl.col("_score").n_unique().over("group_id") == 1
        ready = ready.with_columns(
            pl.when(flat)
            .then(pl.lit("zero_variance"))
            .otherwise(pl.col("_status"))
            .alias("_status")
        )
    others = pl.concat(
        [
            members.filter(pl.col("_status") != "ready"),
            ready.filter(pl.col("_status") != "ready"),
            units.filter(pl.col("group_id").is_null()).with_columns(
                pl.lit("no_group").alias("_status")
            ),
        ],
        how="diagonal",
    ).select("trajectory_id", pl.col("_status").alias("reason"))
    ready = ready.filter(pl.col("_status") == "ready").sort("_group_started", "group_id", "_rank")
    waiting = groups.filter((pl.col("_landed") < n) & ~pl.col("_timed_out")).select("group_id")
    return _Groups(ready, others, waiting)


class _Ranked(NamedTuple):
    """The units a batch may take, ranked in batch order, and what no batch may take now."""

    units: pl.DataFrame
    """Trajectories of the units, each with its unit's rank (``_unit``). A unit is a ready group
    or a trajectory; ready groups come whole in batch order, so a group's rank is its run's."""
    available: int
    others: pl.DataFrame
    """Per-trajectory reasons for the passing trajectories no batch may take now."""
    waiting: pl.DataFrame
    """The groups (``group_id``) waiting for a rollout."""


def _ranked_units(
    recipe: Recipe, units: pl.DataFrame, landed: pl.DataFrame, now: datetime
) -> _Ranked:
    """Ready groups (grpo/rloo) or passing trajectories, ranked in batch order."""
    if recipe.algorithm not in GROUPED:
        no_reasons = pl.DataFrame(schema={"trajectory_id": pl.String, "reason": pl.String})
        no_groups = pl.DataFrame(schema={"group_id": pl.String})
        return _Ranked(units.with_row_index("_unit"), units.height, no_reasons, no_groups)
    ready, others, waiting = _ready_groups(recipe, units, landed, now)
    ranked = ready.with_columns(pl.col("group_id").rle_id().alias("_unit"))
    return _Ranked(ranked, ranked.get_column("_unit").n_unique(), others, waiting)


def _select_units(
    recipe: Recipe, ranked: _Ranked, position: int
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, bool]:
    """The trajectories of the batch at ``position`` (with group order), those of the batches
    before it, per-trajectory reasons for the rest (``next_batch`` past it), and ready."""
    wanted = recipe.units_per_batch
    start, end = position * wanted, (position + 1) * wanted
    unit = pl.col("_unit")
    later = ranked.units.filter(unit >= end).select("trajectory_id", reason=pl.lit("next_batch"))
    chosen = ranked.units.filter((unit >= start) & (unit < end))
    before = ranked.units.filter(unit < start)
    return chosen, before, pl.concat([ranked.others, later]), ranked.available >= end


def _pending(
    units: pl.DataFrame,
    landed: pl.DataFrame,
    reasons: pl.DataFrame,
    chosen: pl.DataFrame,
    ready: bool,
    waiting: pl.DataFrame,
) -> pl.Series:
    """``Units.pending``: the landed trajectories out by their own filters whose group waits
    for a rollout or keeps a passing member in play (left out for a reason in ``IN_PLAY``, or
    chosen by a batch that is not ready)."""
    kept = reasons.filter(pl.col("reason").is_in(list(IN_PLAY))).select("trajectory_id")
    if not ready:
        kept = pl.concat([kept, chosen.select("trajectory_id")])
    held = pl.concat([units.join(kept, on="trajectory_id", how="semi").select("group_id"), waiting])
    return (
        landed.join(units, on="trajectory_id", how="anti")
        .join(held, on="group_id", how="semi")
        .get_column("trajectory_id")
    )


def _up_to_unready(batches: Iterator[Units]) -> list[Units]:
    """The batches up to the first that is not ready: none after it is."""
    taken = []
    for batch in batches:
        taken.append(batch)
        if not batch.ready:
            break
    return taken


def trajectory_batches(
    recipe: Recipe,
    steps: pl.DataFrame,
    now: datetime,
    batch_ids: list[str],
    first: int,
    versions: str,
) -> list[Units]:
    """Whole trajectories (in groups for grpo/rloo), each step of them a row: the batches at
    positions ``first``, ``first + 1``, ... of one plan, one per id of ``batch_ids`` up to the
    first that is not ready."""
    trajectories = _trajectory_units(recipe, steps)
    ranked = _ranked_units(recipe, trajectories.units, trajectories.landed, now)
    return _up_to_unready(
        _trajectory_batch(recipe, steps, trajectories, ranked, first + i, batch_id, versions)
        for i, batch_id in enumerate(batch_ids)
    )


def _trajectory_batch(
    recipe: Recipe,
    steps: pl.DataFrame,
    trajectories: _Trajectories,
    ranked: _Ranked,
    position: int,
    batch_id: str,
    versions: str,
) -> Units:
    """The batch at ``position`` of the ``ranked`` units."""
    units, landed, drops = trajectories
    chosen, before, reasons, ready = _select_units(recipe, ranked, position)
    drops = [*drops, dropped_as(steps.join(reasons, on="trajectory_id"), pl.col("reason"))]
    pending = NO_TRAJECTORIES
    if recipe.algorithm in GROUPED:
        pending = _pending(units, landed, reasons, chosen, ready, ranked.waiting)
    group_size = chosen.group_by("group_id").agg(pl.len().alias("group_size"))
    rows = (
        steps.join(_chosen_trajectories(recipe, chosen), on="trajectory_id")
        .join(group_size, on="group_id", how="left")
        .sort("_unit", "_started", "trajectory_id", "step_index")
        .with_columns(
            pl.lit(batch_id).alias("batch_id"),
            pl.lit(recipe.name).alias("recipe"),
            (pl.col("step_index") == pl.col("_last_step")).alias("is_last"),
            pl.col("group_size").fill_null(1),
            pl.lit(versions).alias("source_versions"),
        )
    )
    consumed = rows.select("turn_id", "trajectory_id", "group_id")
    consumed_before = steps.join(before.select("trajectory_id"), on="trajectory_id").select(
        "turn_id", "trajectory_id", "group_id"
    )
    return Units(
        fit(rows, STORED_BATCH_ROWS), pl.concat(drops), ready, consumed, consumed_before, pending
    )


def _chosen_trajectories(recipe: Recipe, chosen: pl.DataFrame) -> pl.DataFrame:
    """What the rows of each chosen trajectory repeat, to join them once: unit, start, score,
    step count, last step and (per-trajectory group statistics) advantage."""
    repeated = [
        "trajectory_id",
        "_unit",
        "_started",
        pl.col("_score").alias("trajectory_score"),
        "num_steps",
        "_last_step",
    ]
    if recipe.group_statistics == "per_trajectory":
        repeated.append(trajectory_advantage(recipe.algorithm))
    return chosen.select(repeated)


def dpo_batches(
    recipe: Recipe,
    steps: pl.DataFrame,
    turns: pl.LazyFrame | pl.DataFrame,
    batch_ids: list[str],
    first: int,
    versions: str,
) -> list[Units]:
    """One pair per state (group, prompt): best vs worst credited reward, gap >= minimum; the
    batches at positions ``first``, ``first + 1``, ... of one plan, one per id of
    ``batch_ids`` up to the first that is not ready. The pairs are complete rows (token lists
    and messages read from ``turns``)."""
    eligible = with_turn_columns(
        steps.filter(pl.col("_reason").is_null() & pl.col("group_id").is_not_null()), turns
    )
    pairs = _pairs(recipe, eligible)
    return _up_to_unready(
        _dpo_batch(recipe, steps, eligible, pairs, first + i, batch_id, versions)
        for i, batch_id in enumerate(batch_ids)
    )


def _dpo_batch(
    recipe: Recipe,
    steps: pl.DataFrame,
    eligible: pl.DataFrame,
    pairs: pl.DataFrame,
    position: int,
    batch_id: str,
    versions: str,
) -> Units:
    """The batch at ``position`` of the ranked ``pairs``."""
    wanted = recipe.units_per_batch
    start, end = position * wanted, (position + 1) * wanted
    unit = pl.col("_unit")
    chosen = pairs.filter((unit >= start) & (unit < end))
    consumed, consumed_before = _both_sides(chosen), _both_sides(pairs.filter(unit < start))
    taken = pl.concat([consumed_before, consumed]).select("turn_id")
    unpaired = eligible.join(taken, on="turn_id", how="anti")
    waiting = _pairable(recipe, unpaired)  # the pairs past this batch's too
    drops = [
        dropped_as(steps.filter(pl.col("_reason").is_not_null()), pl.col("_reason")),
        dropped_as(steps.filter(pl.col("_reason").is_null() & pl.col("group_id").is_null()),
                   "no_group"),
        dropped_as(unpaired, pl.when(pl.col("turn_id").is_in(waiting.implode()))
                   .then(pl.lit("next_batch")).otherwise(pl.lit("no_pair"))),
    ]  # fmt: skip
    rows = _pair_rows(recipe, chosen, batch_id, versions)
    ready = pairs.height >= end
    return Units(rows, pl.concat(drops), ready, consumed, consumed_before, NO_TRAJECTORIES)


def _pairs(recipe: Recipe, eligible: pl.DataFrame) -> pl.DataFrame:
    """Per state, its best step beside its worst (columns ``*_r``), where they differ in their
    response and by at least the recipe's reward gap; in batch order (``_unit``)."""
    state = ["group_id", "_prompt_key"]
    ranked = eligible.with_columns(pl.col("prompt_token_ids").hash().alias("_prompt_key")).sort(
        *state, "reward", "turn_id", descending=[False, False, True, False]
    )
    best = ranked.group_by(state, maintain_order=True).first()
    worst = ranked.group_by(state, maintain_order=True).last()
    return (
        best.join(worst, on=state, suffix="_r")
        .filter(
            (pl.col("turn_id") != pl.col("turn_id_r"))
            & (pl.col("prompt_token_ids") == pl.col("prompt_token_ids_r"))
            & (pl.col("response_token_ids") != pl.col("response_token_ids_r"))
            & (pl.col("reward") - pl.col("reward_r") >= recipe.min_reward_gap)
        )
        .sort("started_at", "turn_id")
        .with_row_index("_unit")
    )


def _pairable(recipe: Recipe, unpaired: pl.DataFrame) -> pl.Series:
    """Turn ids of the steps left unpaired whose state (group, prompt) still holds a pair by
    ``_pairs``' own rule: once this batch's pairs are consumed a later plan pairs them. The rest
    can pair only if their group changes, which voids a retirement, so their ``no_pair`` is
    final (kept in play, they held every later plan's start at the first of them: a soak's dpo
    plans read every curated step since it began, first for steps under the reward gap, then
    for states whose best and worst replies are the same tokens)."""
    state = ["group_id", "_prompt_key"]
    open_states = _pairs(recipe, unpaired).select(state)
    return (
        unpaired.with_columns(pl.col("prompt_token_ids").hash().alias("_prompt_key"))
        .join(open_states, on=state, how="semi")
        .get_column("turn_id")
    )


def _both_sides(pairs: pl.DataFrame) -> pl.DataFrame:
    """(turn_id, trajectory_id, group_id) of the chosen and of the rejected step of each pair."""
    chosen = pairs.select("turn_id", "trajectory_id", "group_id")
    rejected = pairs.select(
        pl.col("turn_id_r").alias("turn_id"),
        pl.col("trajectory_id_r").alias("trajectory_id"),
        "group_id",
    )
    return pl.concat([chosen, rejected])


def _pair_rows(recipe: Recipe, pairs: pl.DataFrame, batch_id: str, versions: str) -> pl.DataFrame:
    """``DPO_PAIRS`` rows of the chosen ``pairs``."""
    rows = pairs.select(
        pl.lit(batch_id).alias("batch_id"),
        pl.lit(recipe.name).alias("recipe"),
        "group_id",
        "trajectory_id",
        "step_index",
        "turn_id",
        pl.col("turn_id_r").alias("rejected_turn_id"),
        "prompt_token_ids",
        pl.col("response_token_ids").alias("chosen_token_ids"),
        pl.col("response_token_ids_r").alias("rejected_token_ids"),
        pl.col("reward").alias("chosen_reward"),
        pl.col("reward_r").alias("rejected_reward"),
        "policy_version",
        "model",
        pl.col("finish_reason").alias("chosen_finish_reason"),
        pl.col("finish_reason_r").alias("rejected_finish_reason"),
        "request_messages",
        "request_tools",
        pl.col("response_message").alias("chosen_message"),
        pl.col("response_message_r").alias("rejected_message"),
        "metadata",
        "source_version",
        pl.lit(versions).alias("source_versions"),
    )
    return fit(rows, DPO_PAIRS)
