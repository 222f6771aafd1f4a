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

from claw_pipelines.batching.units import GROUPED, dpo_batch, trajectory_batch
from claw_pipelines.derived_schemas import (
    BATCH_ROWS,
    DROPPED,
    LEDGER,
    LENGTH_COLUMNS,
    STEP_ONLY_COLUMNS,
    fit,
    with_tokens,
)
from claw_pipelines.lake import keyed
from claw_pipelines.transforms.credit import CreditAssignment, assign_credit

Algorithm = Literal["grpo", "rloo", "ppo", "reinforce_pp", "dpo", "sft"]
ExportFormat = Literal["verl", "trl", "jsonl"]
Truncation = Literal["error", "left", "right"]
GroupStatistics = Literal["per_step", "per_trajectory"]


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
    ``latest_policy_version`` (the assets pass ``policy_versions.lag_reference``, the highest
    announced version; default: the newest policy_version among all curated steps, consumed or
    not). Trajectory-based algorithms
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
        rows, dropped, ready, consumed = dpo_batch(recipe, frame, steps, batch_id, versions)
    else:
        rows, dropped, ready, picked = trajectory_batch(recipe, frame, now, batch_id, versions)
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
