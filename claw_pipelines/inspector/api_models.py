"""Pydantic shapes of the JSON endpoints (used by the page's JavaScript and the benchmark)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class TrajectoryRow(BaseModel):
    trajectory_id: str
    group_id: str | None
    channel: str | None
    agent: str | None
    model: str | None
    status: str
    num_steps: int
    errors: int
    truncated: int
    started_at: datetime | None
    ended_at: datetime | None
    duration_s: float | None
    policy_versions: list[int]
    prompt_tokens: int | None
    completion_tokens: int | None
    reward: float | None
    reward_count: int
    reward_sources: list[str]
    quality: float | None
    quality_min: float | None
    label: str | None
    trainable: bool | None
    tags: list[str] | None
    label_note: str | None
    labelled_steps: int
    untrainable_steps: int
    step_quality_labels: list[str]
    task: str | None
    last_response: str | None


class TrajectoryList(BaseModel):
    total: int
    matched: int
    page: int
    size: int
    rows: list[TrajectoryRow]


class Tokens(BaseModel):
    """A step's decoded tokens column by column: a long session's page holds tens of thousands,
    and lists of numbers and strings validate and serialize at once, where a model (or even a
    dict) per token cost a quarter of the open."""

    ids: list[int]
    texts: list[str]
    logprobs: list[float | None]
    probs: list[float | None]


class RewardOut(BaseModel):
    target: str = "step"
    name: str
    value: float
    source: str
    created_at: datetime | None


class StepOut(BaseModel):
    turn_id: str
    step_index: int | None
    """None for a failed call without token IDs, which the pipeline does not make a step."""
    status: str | None
    error: str | None
    finish_reason: str | None
    token_source: str | None
    model: str | None
    backend: str | None
    policy_version: int | None
    started_at: datetime | None
    ended_at: datetime | None
    duration_ms: int | None
    latency_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    new_messages: list[dict[str, Any]]
    """The prompt's messages after ``earlier_messages``: what this step added (a tool output, a
    user turn), or, after a context edit, everything from the first message that changed."""
    message_count: int
    earlier_messages: int
    """Leading messages that repeat the previous step's messages + reply (only in the full
    prompt, ``/api/steps/{turn_id}/prompt``)."""
    tools: list[dict[str, Any]] | None
    """The tools the request declared (the policy saw them rendered into its prompt)."""
    response: dict[str, Any]
    response_token_ids: list[int] | None
    response_tokens: Tokens | None
    """Decoded tokens with logprobs (None when the IDs are not the embedded engine's)."""
    prompt_token_count: int
    shared_prefix_tokens: int | None
    """Leading prompt tokens shared with the previous step's prompt + response."""
    added_token_ids: list[int] | None
    """The prompt tokens after that shared prefix: what this step's prompt added."""
    added_text: str | None
    """``added_token_ids`` decoded by their model's tokenizer (None when it is unreachable)."""
    prefix_consistent: bool | None
    prefix_break_reason: str | None
    prefix_from_pipeline: bool
    rewards: list[RewardOut]
    credited_reward: float | None
    quality_score: float | None
    quality_reasons: list[str] | None
    label: str | None
    trainable: bool | None
    tags: list[str] | None
    label_note: str | None
    label_author: str | None
    metadata: Any
    sampling_params: Any


class TrajectoryDetail(BaseModel):
    summary: TrajectoryRow
    trajectory_rewards: list[RewardOut]
    steps: list[StepOut]
    in_steps_table: bool
    """Whether the pipeline's `steps` table has this trajectory yet (it only holds closed ones)."""
    parent_trajectory_id: str | None = None
    """Set when this is a side trajectory: a side call inside that trajectory's session."""
    side_trajectories: list[str] = []
    """The side trajectories of this one (title or summary calls, sub-agents)."""


class PromptTokens(BaseModel):
    turn_id: str
    ids: list[int]
    tokens: Tokens | None


class FullPrompt(BaseModel):
    """One step's whole prompt, loaded on demand: the trajectory page shows only what it added."""

    turn_id: str
    trajectory_id: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    token_ids: list[int]


class GroupOut(BaseModel):
    group_id: str
    rollouts: list[TrajectoryDetail]
    reward_mean: float | None
    reward_std: float | None


class GroupPlan(BaseModel):
    group_id: str | None
    rollouts: int
    steps: int
    reward_min: float | None
    reward_max: float | None
    reward_mean: float | None
    reward_std: float | None
    trajectory_id: list[str]


class DroppedReason(BaseModel):
    reason: str | None
    steps: int
    trajectories: int
    examples: list[str | None]


class BatchPreviewOut(BaseModel):
    recipe: str
    algorithm: str
    group_size: int
    groups_per_batch: int
    dagster_url: str
    ready: bool | None
    batch_id: str | None
    rows: int
    groups: list[GroupPlan]
    dropped: list[DroppedReason]
    why_empty: str | None
    planned_at: datetime
