"""Reward functions declared in assets/rewards.yaml: rules on ground truth, and a model judge.

Rules are polars expressions over steps, reading the ground truth from
``turns.metadata`` -> ``claw.ground_truth``. The model judge is any callable scoring a frame of
steps; ``openai_judge`` builds one that asks an OpenAI-compatible endpoint (the capture proxy).
The judge is off by default: it costs a model call per scored trajectory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import BaseModel, Field

ModelJudge = Callable[[pl.DataFrame], pl.Series]
"""Scores the last steps of trajectories: gets rows with request_messages, response_text,
ground_truth; returns one float (or null) per row, in order."""

RuleName = Literal["exact_match", "numeric_match", "regex_match", "tool_call_success"]


class CreditAssignment(BaseModel):
    """last_step: outcome on the final step; broadcast: outcome on every step; discounted:
    G_t = r_t + gamma * G_{t+1} with the outcome added to the final step's r."""

    method: Literal["last_step", "broadcast", "discounted"] = "last_step"
    gamma: float = Field(default=1.0, gt=0.0, le=1.0)


class RewardRule(BaseModel):
    """One rule reward: applied to the final step of each matching trajectory (outcome)."""

    name: str
    rule: RuleName
    data_source: str | None = Field(default=None, description="Match metadata.claw.data_source.")
    agent: str | None = Field(default=None, description="Match the step's agent.")
    pattern: str | None = Field(
        default=None, description="regex_match: pattern (default: the ground truth)."
    )
    tolerance: float = Field(default=1e-6, description="numeric_match: absolute tolerance.")


class JudgeConfig(BaseModel):
    enabled: bool = False
    base_url: str = "http://127.0.0.1:4000/v1"
    model: str = "policy"
    api_key_env: str = "CLAW_JUDGE_API_KEY"
    prompt: str = (
        "Rate the assistant's final answer from 0 to 10. Reference answer: {ground_truth}\n"
        "Conversation:\n{conversation}\nAnswer: {response}\nReply with the number only."
    )
    data_source: str | None = None
    agent: str | None = None


class RewardConfig(BaseModel):
    """assets/rewards.yaml."""

    credit_assignment: CreditAssignment = CreditAssignment()
    source_priority: list[str] = ["human", "env", "rule", "model"]
    rules: list[RewardRule] = []
    judge: JudgeConfig = JudgeConfig()

    @classmethod
    def from_yaml(cls, path: str | Path) -> RewardConfig:
        raise NotImplementedError


def rule_rewards(
    steps: pl.LazyFrame | pl.DataFrame, config: RewardConfig, *, judge: ModelJudge | None = None
) -> pl.LazyFrame:
    """Rewards rows (``schemas.Reward`` columns, trajectory-targeted) produced by the rules and the
    judge for the final step of each trajectory in ``steps``."""
    raise NotImplementedError


def openai_judge(config: JudgeConfig) -> ModelJudge:
    """A judge asking ``config.base_url`` (OpenAI-compatible) to score each row; 0..10 -> 0..1."""
    raise NotImplementedError
