"""Batch recipes (assets/batches.yaml): which algorithm a batch feeds and how rows are grouped,
filtered and credited. A recipe that would make every batch useless is refused at load."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from claw_pipelines.batches.manifest import Truncation
from claw_pipelines.transforms.credit import CreditAssignment

Algorithm = Literal["grpo", "rloo", "ppo", "reinforce_pp", "dpo", "sft"]
ExportFormat = Literal["verl", "trl", "jsonl"]
GroupStatistics = Literal["per_step", "per_trajectory"]
Layout = Literal["sequence", "step"]
Unfinished = Literal["keep", "drop"]


GROUPED: frozenset[str] = frozenset({"grpo", "rloo"})
"""Algorithms whose batches are made of complete groups of rollouts of one prompt."""

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
    unfinished: Unfinished = Field(
        default="keep",
        description="Trajectories closed aborted or by timeout: keep them (their reward says "
        "how they ended) or drop them (reason unfinished).",
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
    layout: Layout | None = Field(
        default=None,
        description="sequence: one row per segment of a trajectory (its prefix-consistent "
        "steps as one sequence, observations masked); step: one row per step. Default: "
        "sequence, step for dpo (pairs of replies to one state). Lengths, filters and "
        "widths count the layout's tokens.",
    )
    group_size: int = Field(default=4, ge=1)
    groups_per_batch: int = Field(default=4, ge=1)
    straggler_timeout_s: float = Field(
        default=600.0,
        ge=0,
        description="grpo/rloo: how long a group still missing a rollout waits after its last "
        "member ended, then follows straggler_policy.",
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
        default=None,
        ge=1,
        description="verl: fixed prompt width (left-padded); default filters.max_prompt_len, "
        "else the batch's longest prompt (then batches need not concatenate).",
    )
    response_length: int | None = Field(
        default=None,
        ge=1,
        description="verl: fixed response width (right-padded); default "
        "filters.max_response_len, else the batch's longest response.",
    )
    pad_token_id: int | None = Field(
        default=None, ge=0, description="verl: the tokenizer's pad id (default 0)."
    )
    pad_to_multiple: int = Field(
        default=8,
        ge=1,
        description="verl: rows padded to a multiple of this with rows that carry no loss, so "
        "DataProto.chunk(n) works for every n dividing it (data-parallel ranks).",
    )
    truncation: Truncation = Field(
        default="error",
        description="A row longer than prompt_length / response_length: error = the planner "
        "leaves its trajectory out (reason prompt_too_long / response_too_long); left / right = "
        "keep the prompt's last / first tokens and the response's first ones, and the row's "
        "``truncated`` says what was cut.",
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
        if self.layout is None:
            # a recipe pinned before layouts existed planned per step
            per_step = self.algorithm == "dpo" or info.context == PINNED
            self.layout = "step" if per_step else "sequence"
        if info.context == PINNED:
            return self
        checks = [
            (
                "layout",
                self.algorithm == "dpo" and self.layout == "sequence",
                "dpo pairs two replies to one state, so its rows stay per step",
            ),
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
    def widths(self) -> tuple[int | None, int | None]:
        """The fixed (prompt, response) widths of exported rows: the recipe's, else its length
        filters' (None: each batch's longest row)."""
        return (
            self.prompt_length or self.filters.max_prompt_len,
            self.response_length or self.filters.max_response_len,
        )

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
