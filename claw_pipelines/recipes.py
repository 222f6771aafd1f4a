"""Batch recipes (assets/batches.yaml) and batch planning.

A recipe says which algorithm a batch feeds and how rows are grouped, filtered and credited.
``plan_batch`` is pure: from curated steps and the recipe's consumption ledger it picks the next
batch deterministically, so re-planning from pinned input versions reproduces the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import BaseModel, Field

from claw_pipelines.transforms.credit import CreditAssignment

Algorithm = Literal["grpo", "rloo", "ppo", "reinforce_pp", "dpo", "sft"]
ExportFormat = Literal["verl", "trl", "jsonl"]


class RecipeFilters(BaseModel):
    min_quality: float | None = None
    require_reward: bool = True
    max_policy_lag: int | None = None
    max_prompt_len: int | None = None
    max_response_len: int | None = None
    drop_zero_variance: bool = True
    min_reward: float | None = Field(
        default=None, description="sft: keep trajectories at least this good."
    )


class Recipe(BaseModel):
    name: str
    algorithm: Algorithm = "grpo"
    group_size: int = Field(default=4, ge=1)
    groups_per_batch: int = Field(default=4, ge=1)
    straggler_timeout_s: float = 600.0
    straggler_policy: Literal["emit", "drop"] = "emit"
    filters: RecipeFilters = RecipeFilters()
    credit_assignment: CreditAssignment = CreditAssignment()
    exports: list[ExportFormat] = ["verl", "trl", "jsonl"]
    min_reward_gap: float = Field(default=0.1, ge=0.0, description="dpo: chosen - rejected reward.")


def load_recipes(path: str | Path) -> dict[str, Recipe]:
    """Recipes by name from a batches.yaml (``recipes: [...]``)."""
    raise NotImplementedError


@dataclass(frozen=True)
class BatchPlan:
    batch_id: str
    rows: pl.DataFrame
    """``derived_schemas.BATCH_ROWS`` (or ``DPO_PAIRS`` for dpo), in deterministic order."""
    dropped: pl.DataFrame
    """``derived_schemas.DROPPED``: eligible-looking steps left out, with the reason."""
    ready: bool
    """A full batch (``groups_per_batch`` units) is available now."""

    def ledger_rows(self, recipe: str, planned_at: datetime) -> pl.DataFrame:
        """``derived_schemas.LEDGER`` rows marking this batch's steps consumed."""
        raise NotImplementedError


def plan_batch(
    recipe: Recipe,
    curated_steps: pl.LazyFrame | pl.DataFrame,
    ledger: pl.LazyFrame | pl.DataFrame | None,
    now: datetime,
    *,
    batch_id: str | None = None,
    source_versions: dict[str, int] | None = None,
    latest_policy_version: int | None = None,
) -> BatchPlan:
    """Select the next batch of ``recipe`` from curated steps not yet in its ledger."""
    raise NotImplementedError
