"""Batch recipes (assets/batches.yaml) and batch planning.

A recipe says which algorithm a batch feeds and how rows are grouped, filtered and credited.
``plan_batch`` is pure: from curated steps and the recipe's consumption ledger it picks the next
batch deterministically, so re-planning from pinned input versions reproduces the same batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Literal

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from claw_pipelines.derived_schemas import (
    BATCH_ROWS,
    DPO_PAIRS,
    DROPPED,
    LEDGER,
    LENGTH_COLUMNS,
    STEP_ONLY_COLUMNS,
    fit,
    with_tokens,
)
from claw_pipelines.lake import keyed
from claw_pipelines.transforms.credit import CreditAssignment, assign_credit
from claw_pipelines.transforms.group_stats import trajectory_advantages

Algorithm = Literal["grpo", "rloo", "ppo", "reinforce_pp", "dpo", "sft"]
ExportFormat = Literal["verl", "trl", "jsonl"]
Truncation = Literal["error", "left", "right"]
GroupStatistics = Literal["per_step", "per_trajectory"]


GROUPED: frozenset[str] = frozenset({"grpo", "rloo"})

PINNED = {"pinned": True}
"""Validation context of a recipe a reserved batch was planned under: it is taken as it was, so
the batch re-plans the same even if it would be refused today."""

MAX_STRAGGLER_TIMEOUT_S = timedelta.max.total_seconds()
"""The longest timeout a ``timedelta`` holds: planning with a longer one (or infinity) fails."""


class RecipeFilters(BaseModel):
    """Which curated steps may enter a batch; a trajectory enters only if all its steps pass."""

    model_config = ConfigDict(extra="forbid")

    min_quality: float | None = Field(default=None, ge=0, le=1)
    require_reward: bool = True
    max_policy_lag: int | None = Field(default=None, ge=0)
    max_prompt_len: int | None = Field(default=None, ge=1)
    max_response_len: int | None = Field(default=None, ge=1)
    drop_zero_variance: bool = Field(
        default=True, description="grpo/rloo: drop groups whose trajectory scores are all equal."
    )
    min_reward: float | None = Field(
        default=None,
        description="sft: keep trajectories scoring at least this (rejection sampling).",
    )


class Recipe(BaseModel):
    """A batch recipe (one entry of assets/batches.yaml).

    Units per batch: grpo/rloo ``groups_per_batch`` groups of ``group_size`` trajectories;
    ppo/reinforce_pp/sft ``groups_per_batch * group_size`` trajectories; dpo
    ``groups_per_batch`` preference pairs.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9_]+$")
    algorithm: Algorithm = "grpo"
    group_size: int = Field(default=4, ge=1)
    groups_per_batch: int = Field(default=4, ge=1)
    straggler_timeout_s: float = Field(
        default=600.0, ge=0, description="grpo/rloo: after this, act on incomplete groups."
    )
    straggler_policy: Literal["emit", "drop"] = Field(
        default="emit", description="emit: incomplete groups with >= 2 members; drop: discard."
    )
    filters: RecipeFilters = RecipeFilters()
    credit_assignment: CreditAssignment = CreditAssignment()
    exports: list[ExportFormat] = ["verl", "trl", "jsonl"]
    min_reward_gap: float = Field(default=0.1, ge=0.0, description="dpo: chosen - rejected reward.")
    keep_truncated: bool = Field(
        default=False,
        description="dpo: also pair replies cut off at max_tokens (finish_reason length); "
        "conversational files still leave such pairs out, as a chat template would close them.",
    )
    prompt_length: int | None = Field(
        default=None, ge=1, description="verl: fixed prompt width (left-padded); default per batch."
    )
    response_length: int | None = Field(
        default=None, ge=1, description="verl: fixed response width (right-padded)."
    )
    pad_token_id: int | None = Field(
        default=None, ge=0, description="verl: the tokenizer's pad id (default 0)."
    )
    truncation: Truncation = Field(
        default="error",
        description="A step longer than prompt_length / response_length: error = the planner "
        "leaves it out (reason prompt_too_long / response_too_long); left / right = keep the "
        "prompt's last / first tokens and the response's first ones.",
    )
    group_statistics: GroupStatistics = Field(
        default="per_step",
        description="grpo/rloo: per_step leaves the advantage to the trainer (every step is a "
        "sample, so a trajectory of k steps counts k times in its group); per_trajectory "
        "computes it over trajectory scores and broadcasts it to the steps (rows' advantage).",
    )

    @model_validator(mode="after")
    def _refuse_useless(self, info: ValidationInfo) -> Recipe:
        """Refuse values that load but make every batch useless or every plan fail, so a bad
        batches.yaml stops ``dagster definitions validate`` and ``claw up`` with the recipe's
        name and field rather than yielding batches with no signal."""
        if info.context == PINNED:
            return self
        checks = [
            (
                "group_size",
                self.algorithm in GROUPED and self.group_size < 2,
                f"{self.algorithm} needs at least 2 rollouts per group: with 1, every "
                "group-relative advantage is 0 (and RLOO's leave-one-out baseline is undefined)",
            ),
            (
                "min_reward_gap",
                self.algorithm == "dpo" and not 0 < self.min_reward_gap < math.inf,
                "dpo needs a positive, finite gap: at 0 it pairs responses of equal reward",
            ),
            (
                "straggler_timeout_s",
                self.straggler_timeout_s > MAX_STRAGGLER_TIMEOUT_S,
                f"must be a finite number of seconds, at most {MAX_STRAGGLER_TIMEOUT_S:.0f}",
            ),
            (
                "group_statistics",
                self.group_statistics == "per_trajectory" and self.algorithm not in GROUPED,
                "per_trajectory group statistics are for grpo and rloo (groups of rollouts)",
            ),
            (
                "filters.min_reward",
                self.filters.min_reward is not None and not math.isfinite(self.filters.min_reward),
                "must be a finite number (leave it out for no minimum)",
            ),
        ]
        problems = [f"{field}: {why}" for field, useless, why in checks if useless]
        if problems:
            raise ValueError(f"recipe {self.name!r}: {'; '.join(problems)}")
        return self

    @property
    def units_per_batch(self) -> int:
        if self.algorithm in GROUPED or self.algorithm == "dpo":
            return self.groups_per_batch
        return self.groups_per_batch * self.group_size


class _RecipeFile(BaseModel):
    recipes: list[Recipe]


def load_recipes(path: str | Path) -> dict[str, Recipe]:
    """Recipes by name from a batches.yaml (``recipes: [...]``)."""
    recipes = _RecipeFile.model_validate(yaml.safe_load(Path(path).read_text())).recipes
    by_name = {recipe.name: recipe for recipe in recipes}
    if len(by_name) != len(recipes):
        raise ValueError(f"duplicate recipe names in {path}")
    return by_name


TOKENS_PER_CHUNK = 1 << 25
"""Token IDs whose lists ``BatchPlan.row_chunks`` reads at a time (32M: 128 MiB of IDs, at
most as much again of logprobs): memory is bounded by tokens whatever the sequence lengths,
and a big batch of short steps is read in a few large scans instead of many small ones."""


@dataclass(frozen=True)
class BatchPlan:
    batch_id: str
    planned: pl.DataFrame
    """``derived_schemas.BATCH_ROWS`` in deterministic order, token lists and tools still null
    (read from ``tokens`` by ``rows`` / ``row_chunks``); for dpo complete ``DPO_PAIRS`` rows."""
    tokens: pl.LazyFrame | pl.DataFrame | None
    """The steps the token lists and tools are read from (None when ``planned`` is complete)."""
    dropped: pl.DataFrame
    """``derived_schemas.DROPPED``: unconsumed steps left out of this batch, with the reason
    (filters, waiting for a group, straggler drop, zero variance, no pair, next batch)."""
    ready: bool
    """A full batch (``Recipe.units_per_batch`` units) is available now."""
    consumed: pl.DataFrame
    """(turn_id, trajectory_id, group_id) of every step this batch uses; for dpo both the
    chosen and the rejected step."""
    final: pl.DataFrame
    """The rows of ``dropped`` that later plans drop too (``final_drops``): to retire."""
    open_from_next: str | None
    """The smallest trajectory id still in play once this batch is reserved (if ``ready``) and
    the final drops retired, or the newest id when none is: the next plan's ``open_from``, valid
    only after the reservation committed. None for an empty table."""

    @cached_property
    def rows(self) -> pl.DataFrame:
        """The complete batch rows (all token lists at once)."""
        return self._with_tokens(self.planned)

    def row_chunks(self) -> Iterator[pl.DataFrame]:
        """The complete rows, about ``TOKENS_PER_CHUNK`` tokens at a time (sized from the steps'
        lengths): a big batch is written without holding every token list."""
        if self.tokens is None:
            yield self.planned
            return
        lengths = with_tokens(self.planned.select("turn_id"), self.tokens, LENGTH_COLUMNS)
        size = pl.sum_horizontal(LENGTH_COLUMNS)
        chunk = lengths.select(((size.cum_sum() - size) // TOKENS_PER_CHUNK).alias("_chunk"))
        parts = self.planned.with_columns(chunk.to_series()).partition_by(
            "_chunk", maintain_order=True, include_key=False
        )
        for part in parts:
            yield self._with_tokens(part)

    def _with_tokens(self, rows: pl.DataFrame) -> pl.DataFrame:
        if self.tokens is None:
            return rows
        return fit(
            with_tokens(rows.drop(STEP_ONLY_COLUMNS), self.tokens, STEP_ONLY_COLUMNS), BATCH_ROWS
        )

    def ledger_rows(self, recipe: str, planned_at: datetime) -> pl.DataFrame:
        """``derived_schemas.LEDGER`` rows marking this batch's steps consumed."""
        return fit(
            self.consumed.with_columns(
                pl.lit(recipe).alias("recipe"),
                pl.lit(self.batch_id).alias("batch_id"),
                pl.lit(planned_at).alias("planned_at"),
            ),
            LEDGER,
        )


TRUNCATED = "length"
"""The finish reason of a reply cut off at max_tokens: it has no end-of-turn token."""


def _length_limits(recipe: Recipe) -> list[tuple[str, int, str]]:
    """(length column, limit, reason): the length filters, and the fixed widths when the recipe
    does not truncate (so every exported batch fits its widths)."""
    f = recipe.filters
    fits = recipe.truncation == "error"
    prompt_width = recipe.prompt_length if fits else None
    response_width = recipe.response_length if fits else None
    limits = [
        ("prompt_len", [f.max_prompt_len, prompt_width], "prompt_too_long"),
        ("response_len", [f.max_response_len, response_width], "response_too_long"),
    ]
    return [
        (column, min(given), reason)
        for column, bounds, reason in limits
        if (given := [b for b in bounds if b is not None])
    ]


def _step_reasons(recipe: Recipe, latest_policy: pl.Expr) -> pl.Expr:
    """The first filter a step fails (null = eligible)."""
    f = recipe.filters
    checks: list[tuple[pl.Expr, str]] = [(~pl.col("trainable").fill_null(True), "untrainable")]
    if f.min_quality is not None:
        checks.append((pl.col("quality_score") < f.min_quality, "low_quality"))
    if f.require_reward:
        checks.append((~pl.col("reward_present").fill_null(False), "no_reward"))
    if f.max_policy_lag is not None:
        checks.append(((latest_policy - pl.col("policy_version")) > f.max_policy_lag, "stale"))
    for column, limit, reason in _length_limits(recipe):
        checks.append((pl.col(column) > limit, reason))
    if recipe.algorithm == "dpo" and not recipe.keep_truncated:
        checks.append((pl.col("finish_reason") == TRUNCATED, "truncated"))
    checks.append((pl.col("response_len").is_null(), "no_tokens"))
    reason = pl.lit(None, pl.String)
    for failed, name in reversed(checks):
        reason = pl.when(failed.fill_null(False)).then(pl.lit(name)).otherwise(reason)
    return reason


def _dropped(frame: pl.DataFrame, reason: str | pl.Expr) -> pl.DataFrame:
    reason = pl.lit(reason) if isinstance(reason, str) else reason
    return frame.select("turn_id", "trajectory_id", "group_id", reason.alias("reason"))


def _trajectory_units(
    recipe: Recipe, steps: pl.DataFrame
) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Trajectories whose steps all pass the filters (one row each), and the drops.

    A trajectory's ``_score`` is its return independent of credit assignment (outcome plus step
    rewards): the quantity zero-variance and min_reward filters are about.
    """
    failing = steps.filter(pl.col("_reason").is_not_null())
    bad = failing.select("trajectory_id").unique()
    drops = [
        _dropped(failing, pl.col("_reason")),
        _dropped(
            steps.join(bad, on="trajectory_id").filter(pl.col("_reason").is_null()),
            "trajectory_filtered",
        ),
    ]
    units = (
        steps.join(bad, on="trajectory_id", how="anti")
        .group_by("trajectory_id")
        .agg(
            pl.col("group_id").first(),
            pl.col("started_at").min().alias("_started"),
            pl.col("ended_at").max().alias("_ended"),
            (
                pl.col("outcome_reward").drop_nulls().first().fill_null(0.0)
                + pl.col("step_reward").fill_null(0.0).sum()
            ).alias("_score"),
        )
        .sort("_started", "trajectory_id")
    )
    if recipe.filters.min_reward is not None:
        low = units.filter(pl.col("_score") < recipe.filters.min_reward)
        drops.append(_dropped(steps.join(low.select("trajectory_id"), on="trajectory_id"),
                              "below_min_reward"))  # fmt: skip
        units = units.join(low.select("trajectory_id"), on="trajectory_id", how="anti")
    return units, drops


def _ready_groups(
    recipe: Recipe, units: pl.DataFrame, now: datetime
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Members of ready groups (in batch order), and per-trajectory reasons for the others
    (waiting_for_group, group_overflow, straggler_dropped, zero_variance, no_group)."""
    n = recipe.group_size
    members = units.filter(pl.col("group_id").is_not_null()).with_columns(
        pl.int_range(pl.len()).over("group_id").alias("_rank"),
        pl.len().over("group_id").alias("_members"),
        pl.col("_ended").max().over("group_id").alias("_last_activity"),
        pl.col("_started").min().over("group_id").alias("_group_started"),
    )
    timed_out = pl.col("_last_activity") <= pl.lit(now) - timedelta(
        seconds=recipe.straggler_timeout_s
    )
    partial_ok = pl.lit(recipe.straggler_policy == "emit") & (pl.col("_members") >= 2)
    status = (
        pl.when(pl.col("_members") >= n)
        .then(
            pl.when(pl.col("_rank") < n).then(pl.lit("ready")).otherwise(pl.lit("group_overflow"))
        )
        .when(~timed_out)
        .then(pl.lit("waiting_for_group"))
        .when(partial_ok)
        .then(pl.lit("ready"))
        .otherwise(pl.lit("straggler_dropped"))
    )
    members = members.with_columns(status.alias("_status"))
    ready = members.filter(pl.col("_status") == "ready")
    if recipe.filters.drop_zero_variance:
        flat = ready.group_by("group_id").agg((pl.col("_score").n_unique() == 1).alias("_flat"))
        ready = ready.join(flat, on="group_id").with_columns(
            pl.when(pl.col("_flat")).then(pl.lit("zero_variance")).otherwise(pl.col("_status"))
            .alias("_status")
        ).drop("_flat")  # fmt: skip
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
    return ready, others


def _select_units(
    recipe: Recipe, units: pl.DataFrame, now: datetime
) -> tuple[pl.DataFrame, pl.DataFrame, bool]:
    """Trajectories of the batch (with group order), per-trajectory reasons for the rest, ready."""
    wanted = recipe.units_per_batch
    if recipe.algorithm in GROUPED:
        ready, others = _ready_groups(recipe, units, now)
        order = ready.select("group_id").unique(maintain_order=True).with_row_index("_unit")
        ready = ready.join(order, on="group_id")
        chosen = ready.filter(pl.col("_unit") < wanted)
        later = ready.filter(pl.col("_unit") >= wanted).select(
            "trajectory_id", pl.lit("next_batch").alias("reason")
        )
        return chosen, pl.concat([others, later]), order.height >= wanted
    ranked = units.with_row_index("_unit")
    chosen = ranked.filter(pl.col("_unit") < wanted)
    later = ranked.filter(pl.col("_unit") >= wanted).select(
        "trajectory_id", pl.lit("next_batch").alias("reason")
    )
    return chosen, later, ranked.height >= wanted


def _trajectory_batch(
    recipe: Recipe,
    steps: pl.DataFrame,
    now: datetime,
    batch_id: str,
    versions: str,
) -> tuple[pl.DataFrame, pl.DataFrame, bool, pl.DataFrame]:
    units, drops = _trajectory_units(recipe, steps)
    chosen, reasons, ready = _select_units(recipe, units, now)
    drops.append(_dropped(steps.join(reasons, on="trajectory_id"), pl.col("reason")))
    group_size = chosen.group_by("group_id").agg(pl.len().alias("group_size"))
    scores = chosen.select("trajectory_id", pl.col("_score").alias("trajectory_score"))
    if recipe.group_statistics == "per_trajectory":
        advantages = trajectory_advantages(recipe.algorithm, chosen)
        scores = scores.join(advantages, on="trajectory_id", maintain_order="left")
    rows = (
        steps.join(chosen.select("trajectory_id", "_unit"), on="trajectory_id")
        .join(scores, on="trajectory_id")
        .join(units.select("trajectory_id", "_started"), on="trajectory_id")
        .join(group_size, on="group_id", how="left")
        .sort("_unit", "_started", "trajectory_id", "step_index")
        .with_columns(
            pl.lit(batch_id).alias("batch_id"),
            pl.lit(recipe.name).alias("recipe"),
            (pl.col("step_index") == pl.col("step_index").max().over("trajectory_id")).alias(
                "is_last"
            ),
            pl.len().over("trajectory_id").alias("num_steps"),
            pl.col("group_size").fill_null(1),
            pl.lit(versions).alias("source_versions"),
        )
    )
    return fit(rows, BATCH_ROWS), pl.concat(drops), ready, rows


def _dpo_batch(
    recipe: Recipe,
    steps: pl.DataFrame,
    tokens: pl.LazyFrame | pl.DataFrame,
    batch_id: str,
    versions: str,
) -> tuple[pl.DataFrame, pl.DataFrame, bool, pl.DataFrame]:
    """One pair per state (group, prompt): best vs worst credited reward, gap >= minimum."""
    eligible = with_tokens(
        steps.filter(pl.col("_reason").is_null() & pl.col("group_id").is_not_null()),
        tokens,
        STEP_ONLY_COLUMNS,
    )
    drops = [
        _dropped(steps.filter(pl.col("_reason").is_not_null()), pl.col("_reason")),
        _dropped(steps.filter(pl.col("_reason").is_null() & pl.col("group_id").is_null()),
                 "no_group"),
    ]  # fmt: skip
    state = ["group_id", "_prompt_key"]
    ranked = eligible.with_columns(pl.col("prompt_token_ids").hash().alias("_prompt_key")).sort(
        *state, "reward", "turn_id", descending=[False, False, True, False]
    )
    best = ranked.group_by(state, maintain_order=True).first()
    worst = ranked.group_by(state, maintain_order=True).last()
    pairs = (
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
    wanted = recipe.units_per_batch
    chosen = pairs.filter(pl.col("_unit") < wanted)
    consumed = pl.concat(
        [
            chosen.select("turn_id", "trajectory_id", "group_id"),
            chosen.select(
                pl.col("turn_id_r").alias("turn_id"),
                pl.col("trajectory_id_r").alias("trajectory_id"),
                "group_id",
            ),
        ]
    )
    later = pairs.filter(pl.col("_unit") >= wanted)
    later_ids = pl.concat(
        [later.select("turn_id"), later.select(pl.col("turn_id_r").alias("turn_id"))]
    )
    unpaired = eligible.join(consumed.select("turn_id"), on="turn_id", how="anti")
    drops.append(
        _dropped(unpaired, pl.when(pl.col("turn_id").is_in(later_ids["turn_id"].implode()))
                 .then(pl.lit("next_batch")).otherwise(pl.lit("no_pair")))
    )  # fmt: skip
    rows = chosen.select(
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
    return fit(rows, DPO_PAIRS), pl.concat(drops), pairs.height >= wanted, consumed


def _unconsumed(recipe: Recipe, curated: pl.LazyFrame, excluded: pl.LazyFrame) -> pl.LazyFrame:
    """Credited curated steps the recipe has neither consumed nor retired: trajectory-based
    algorithms skip any trajectory with an excluded step, dpo skips excluded steps (credit is
    still assigned over the whole trajectory). The excluded keys and then the open trajectory
    ids are collected first (one plan joining the whole id columns took ~3x the memory), so
    planning holds the open trajectories' rows, not the table's."""
    key = "turn_id" if recipe.algorithm == "dpo" else "trajectory_id"
    excluded = excluded.select(key).unique().collect(engine="streaming").lazy()
    open_trajectories = (
        curated.join(excluded, on=key, how="anti").select("trajectory_id").unique().collect()
    )
    open_rows = keyed(curated, "trajectory_id", open_trajectories.get_column("trajectory_id"))
    credited = assign_credit(open_rows, recipe.credit_assignment)
    return credited.join(excluded, on=key, how="anti") if key == "turn_id" else credited


FINAL_REASONS = frozenset(
    {
        "untrainable",
        "low_quality",
        "no_reward",
        "stale",
        "prompt_too_long",
        "response_too_long",
        "truncated",
        "no_tokens",
        "trajectory_filtered",
        "below_min_reward",
        "no_group",
    }
)
"""Drops decided by the step's own trajectory: they stand until one of its curated rows changes
(staleness only grows, as the newest policy version never goes back)."""

FINAL_GROUP_REASONS = frozenset({"zero_variance", "straggler_dropped"})
"""Drops of a whole group: they stand until a curated row of the group changes, provided every
other unconsumed member of the group is dropped for good too. A member waiting, overflowing or
queued for a later batch could still move into the group's first ``group_size``."""


def final_drops(recipe: Recipe, dropped: pl.DataFrame) -> pl.DataFrame:
    """The rows of a plan's ``dropped`` that every later plan drops as well, as long as no curated
    row of their group (or of their trajectory, when it has none) changes.

    Leaving them out of later plans (``plan_batch(retired=...)``) changes no batch; it keeps
    planning from re-reading everything ever dropped (e.g. GRPO's many zero-variance groups).
    """
    final = pl.col("reason").is_in(list(FINAL_REASONS))
    if recipe.algorithm == "dpo":
        return dropped.filter(final)
    by_group = pl.col("reason").is_in(list(FINAL_GROUP_REASONS))
    group_done = (final | by_group).all().over("group_id")
    return dropped.filter(final | (by_group & group_done))


def plan_batch(
    recipe: Recipe,
    curated_steps: pl.LazyFrame | pl.DataFrame,
    steps: pl.LazyFrame | pl.DataFrame,
    ledger: pl.LazyFrame | pl.DataFrame | None,
    now: datetime,
    *,
    retired: pl.LazyFrame | pl.DataFrame | None = None,
    open_from: str | None = None,
    batch_id: str | None = None,
    source_versions: dict[str, int] | None = None,
    latest_policy_version: int | None = None,
) -> BatchPlan:
    """Select the next batch of ``recipe`` from curated steps not yet in its ledger.

    Rewards are re-credited with the recipe's credit assignment; staleness is measured against
    ``latest_policy_version`` (default: the newest policy_version among all curated steps,
    consumed or not). Trajectory-based algorithms
    skip any trajectory with a consumed step (so late steps of a consumed trajectory never
    form a fragment); dpo skips consumed steps. Everything is ordered by explicit keys
    (start time, then ids), so the same inputs and ``now`` give the same batch. ``batch_id``
    defaults to ``<recipe>-<n+1>`` with n the batches in the ledger. ``retired`` steps (rows of
    earlier plans' ``final_drops``) are left out like consumed ones. ``open_from`` (an earlier
    plan's ``open_from_next``, lowered to any trajectory changed since) says every trajectory
    sorting before it is consumed or retired: only the rest of each table is read, which file
    statistics make cheap as ids are time-ordered. Planning reads only the narrow curated
    columns; the token lists of the selected rows are then read from ``steps``.
    """
    curated = curated_steps.lazy()
    if latest_policy_version is None:
        latest_policy_version = curated.select(pl.col("policy_version").max()).collect().item()
    latest = pl.lit(latest_policy_version, pl.Int64)
    if batch_id is None:
        batches_so_far = 0
        if ledger is not None:
            batches_so_far = ledger.lazy().select(pl.col("batch_id").n_unique()).collect().item()
        batch_id = f"{recipe.name}-{batches_so_far + 1:06d}"
    in_play = pl.lit(True)
    if open_from is not None:
        in_play = pl.col("trajectory_id").is_null() | (pl.col("trajectory_id") >= open_from)
    curated = curated.filter(in_play)
    excluded = [
        frame.lazy().filter(in_play).select("turn_id", "trajectory_id")
        for frame in (ledger, retired)
        if frame is not None
    ]
    candidates = (
        _unconsumed(recipe, curated, pl.concat(excluded))
        if excluded
        else assign_credit(curated, recipe.credit_assignment)
    )
    frame = (
        candidates.with_columns(_step_reasons(recipe, latest).alias("_reason"))
        .sort("started_at", "trajectory_id", "step_index", "turn_id")
        .collect(engine="streaming")
    )
    versions = json.dumps(source_versions or {}, sort_keys=True)
    if recipe.algorithm == "dpo":
        rows, dropped, ready, consumed = _dpo_batch(recipe, frame, steps, batch_id, versions)
    else:
        rows, dropped, ready, picked = _trajectory_batch(recipe, frame, now, batch_id, versions)
        consumed = picked.select("turn_id", "trajectory_id", "group_id")
    dropped = fit(dropped.sort("reason", "trajectory_id", "turn_id"), DROPPED)
    final = final_drops(recipe, dropped)
    settled = pl.concat([final.select("turn_id"), consumed.select("turn_id")]) if ready else final
    still_in_play = frame.join(settled, on="turn_id", how="anti").get_column("trajectory_id")
    if still_in_play.len():
        open_from_next = still_in_play.min()
    else:  # nothing in play: what comes later is newer, or shows in the change feed
        newest = curated.select(pl.col("trajectory_id").max()).collect().item()
        open_from_next = newest if newest is not None else open_from
    return BatchPlan(
        batch_id=batch_id,
        planned=rows,
        tokens=None if recipe.algorithm == "dpo" else steps,
        dropped=dropped,
        ready=ready,
        consumed=consumed.sort("turn_id"),
        final=final,
        open_from_next=open_from_next,
    )
