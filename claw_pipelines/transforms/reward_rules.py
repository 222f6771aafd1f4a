"""Reward functions declared in assets/rewards.yaml: rules on ground truth, and a model judge.

Rules are polars expressions over steps, reading the ground truth from
``turns.metadata`` -> ``claw.ground_truth`` or, when the turns carry none, from the trajectory's
registration (``trajectory_registrations``, whenever it landed). The model judge is any
callable scoring a frame of steps; ``openai_judge`` builds one that asks an OpenAI-compatible
endpoint (the capture proxy).
The judge is off by default: it costs a model call per scored trajectory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import httpx
import polars as pl
import yaml
from pydantic import BaseModel, Field

from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import Reward, polars_schema
from claw_pipelines.settings import LOCAL_MASTER_KEY as LOCAL_KEY
from claw_pipelines.transforms.credit import CreditAssignment
from claw_pipelines.transforms.messages import claw_field, malformed_tool_calls, tool_calls

ModelJudge = Callable[[pl.DataFrame], pl.Series]
"""Scores the last steps of trajectories: gets rows with request_messages, response_text,
ground_truth; returns one float (or null) per row, in order."""

RuleName = Literal["exact_match", "numeric_match", "regex_match", "tool_call_success"]


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
    source_priority: list[str] = Field(
        default=["human", "env", "rule", "model"],
        description="Per target, the first source present wins; within it the latest value.",
    )
    rules: list[RewardRule] = []
    judge: JudgeConfig = JudgeConfig()

    @classmethod
    def from_yaml(cls, path: str | Path) -> RewardConfig:
        """With libyaml's loader: PyYAML's own took 2-4 ms of each run (a process) reading it."""
        return cls.model_validate(yaml.load(Path(path).read_text(), yaml.CSafeLoader) or {})


def _normalized(text: pl.Expr) -> pl.Expr:
    return text.str.strip_chars().str.to_lowercase().str.replace_all(r"\s+", " ")


_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?"


def _last_number(text: pl.Expr) -> pl.Expr:
    return text.str.extract_all(_NUMBER).list.last().str.replace_all(",", "").cast(pl.Float64)


def _rule_value(rule: RewardRule) -> pl.Expr:
    """The rule's score (1.0 / 0.0, null without ground truth) on a final-step row."""
    truth = pl.col("ground_truth")
    response = pl.col("response_text").fill_null("")
    if rule.rule == "exact_match":
        hit = _normalized(response) == _normalized(truth)
    elif rule.rule == "numeric_match":
        gap = (_last_number(response) - truth.cast(pl.Float64, strict=False)).abs()
        hit = (gap <= rule.tolerance).fill_null(False)
    elif rule.rule == "regex_match":
        pattern = pl.lit(rule.pattern) if rule.pattern is not None else truth
        hit = response.str.contains(pattern, strict=False).fill_null(False)
        truth = pattern
    else:
        called = pl.col("_tool_names").list.contains(truth) | truth.is_null()
        hit = (pl.col("_failures") == 0) & (pl.col("_tool_names").list.len() > 0) & called
        truth = pl.lit(True)
    return pl.when(truth.is_null()).then(None).otherwise(hit.cast(pl.Float64))


def _matches(data_source: str | None, agent: str | None) -> pl.Expr:
    condition = pl.lit(True)
    if data_source is not None:
        condition &= pl.col("data_source") == data_source
    if agent is not None:
        condition &= pl.col("agent") == agent
    return condition


def _registered(registrations: pl.LazyFrame | None) -> pl.LazyFrame:
    """Per trajectory: the latest ground truth and data source it was registered with."""
    schema = {"trajectory_id": pl.String, "_truth": pl.String, "_source": pl.String}
    if registrations is None:
        return pl.LazyFrame(schema=schema)
    return (
        registrations.sort("created_at", "registration_id")
        .group_by("trajectory_id")
        .agg(
            pl.col("ground_truth").drop_nulls().last().alias("_truth"),
            pl.col("data_source").drop_nulls().last().alias("_source"),
        )
    )


_RULE_COLUMNS = ["turn_id", "trajectory_id", "step_index", "agent", "metadata", "started_at",
                 "ended_at"]  # fmt: skip
"""What the rules read of a final step besides its ``response_text``; the judge is handed
whole steps."""


def _with_replies(
    rows: pl.DataFrame, turns: pl.LazyFrame | pl.DataFrame | None, columns: list[str]
) -> pl.DataFrame:
    """``rows`` with their turns' reply ``columns`` read from ``turns`` (the step tables point
    at their turns); ``turns`` None: the rows carry them."""
    return rows if turns is None else with_turn_columns(rows, turns, columns)


def _final_steps(steps: pl.LazyFrame, registrations: pl.LazyFrame | None) -> pl.DataFrame:
    """The final step of each trajectory with its ground truth and data source (a turn's own win
    over the trajectory's registration). Collected once: every rule and the judge read it, and
    as a plan each of them would sort, group and parse the steps again."""
    return (
        steps.filter(pl.col("trajectory_id").is_not_null())
        .sort("trajectory_id", "step_index")
        .group_by("trajectory_id")
        .last()
        .join(_registered(registrations), on="trajectory_id", how="left")
        .with_columns(
            pl.coalesce(claw_field("ground_truth"), "_truth").alias("ground_truth"),
            pl.coalesce(claw_field("data_source"), "_source").alias("data_source"),
        )
        .drop("_truth", "_source")
        .collect()
    )


def _with_tool_use(
    final: pl.DataFrame, steps: pl.LazyFrame, turns: pl.LazyFrame | pl.DataFrame | None
) -> pl.LazyFrame:
    """``final`` plus what ``tool_call_success`` reads over all of a trajectory's steps: failed
    steps and malformed tool calls, and the names of the tools called. Reading and decoding
    the messages is the costly part, so only the steps of ``final``'s trajectories are read."""
    names = tool_calls().list.eval(pl.element().struct.field("function").struct.field("name"))
    called = steps.join(final.lazy().select("trajectory_id"), on="trajectory_id", how="semi")
    if turns is not None:
        called = called.select("turn_id", "trajectory_id", "status", "started_at").collect()
        called = _with_replies(called, turns, ["response_message"]).lazy()
    used = called.group_by("trajectory_id").agg(
        ((pl.col("status") == "error").cast(pl.Int64) + malformed_tool_calls())
        .sum()
        .alias("_failures"),
        names.list.explode(keep_nulls=False, empty_as_null=False).alias("_tool_names"),
    )
    return final.lazy().join(used, on="trajectory_id")


def _reward_rows(frame: pl.LazyFrame, name: str, source: str, value: pl.Expr) -> pl.LazyFrame:
    """Trajectory-targeted rows in the ``rewards`` columns; ids are deterministic so recomputing
    the same trajectory yields the same rows."""
    return frame.select(
        (pl.lit(f"{source}:{name}:") + pl.col("trajectory_id")).alias("reward_id"),
        pl.lit(None, pl.String).alias("turn_id"),
        "trajectory_id",
        pl.lit(None, pl.String).alias("group_id"),
        value.alias("value"),
        pl.lit(name).alias("name"),
        pl.lit(source).alias("source"),
        pl.col("ended_at").alias("created_at"),
        pl.lit(None, pl.String).alias("metadata"),
    ).filter(pl.col("value").is_not_null())


def rule_rewards(
    steps: pl.LazyFrame | pl.DataFrame,
    config: RewardConfig,
    *,
    judge: ModelJudge | None = None,
    registrations: pl.LazyFrame | pl.DataFrame | None = None,
    turns: pl.LazyFrame | pl.DataFrame | None = None,
) -> pl.LazyFrame:
    """Rewards rows (``schemas.Reward`` columns, trajectory-targeted) produced by the rules and the
    judge for the final step of each trajectory in ``steps``.

    The judge runs only when ``config.judge.enabled``; ``judge`` replaces the default
    ``openai_judge(config.judge)`` (tests pass a local callable). ``registrations``: rows of
    ``trajectory_registrations`` for these trajectories (their ground truth and data source).
    ``turns``: where the steps' replies are read (None: ``steps`` carry them).
    """
    if not config.rules and not config.judge.enabled:
        return pl.LazyFrame(schema=polars_schema(Reward.arrow_schema()))
    steps = steps.lazy()
    light = _RULE_COLUMNS if turns is not None else [*_RULE_COLUMNS, "response_text"]
    read = steps if config.judge.enabled else steps.select(light)
    final = _final_steps(read, None if registrations is None else registrations.lazy())
    final = _with_replies(final, turns, ["response_text"])
    parts = []
    for r in config.rules:
        matched = final.filter(_matches(r.data_source, r.agent))
        rows = (
            _with_tool_use(matched, steps, turns)
            if r.rule == "tool_call_success"
            else matched.lazy()
        )
        parts.append(_reward_rows(rows, r.name, "rule", _rule_value(r)))
    if config.judge.enabled:
        scored = final.filter(_matches(config.judge.data_source, config.judge.agent))
        score = (judge or openai_judge(config.judge))(scored)
        parts.append(
            _reward_rows(scored.lazy().with_columns(score.alias("_score")), "judge", "model",
                         pl.col("_score").cast(pl.Float64))
        )  # fmt: skip
    return pl.concat(parts)


def _judge_prompt(config: JudgeConfig, row: dict) -> str:
    return config.prompt.format(
        ground_truth=row.get("ground_truth") or "(none)",
        conversation=row.get("request_messages") or "[]",
        response=row.get("response_text") or "",
    )


def openai_judge(config: JudgeConfig) -> ModelJudge:
    """A judge asking ``config.base_url`` (OpenAI-compatible) to score each row; 0..10 -> 0..1.

    A reply without a number scores null (no reward) rather than failing the run.
    """

    def judge(rows: pl.DataFrame) -> pl.Series:
        headers = {"Authorization": f"Bearer {os.environ.get(config.api_key_env, LOCAL_KEY)}"}
        scores: list[float | None] = []
        with httpx.Client(base_url=config.base_url, headers=headers, timeout=60) as client:
            for row in rows.iter_rows(named=True):
                body = {
                    "model": config.model,
                    "messages": [{"role": "user", "content": _judge_prompt(config, row)}],
                    "temperature": 0,
                }
                reply = client.post("/chat/completions", json=body).raise_for_status().json()
                text = reply["choices"][0]["message"].get("content") or ""
                match = re.search(r"\d+(?:\.\d+)?", text)
                scores.append(min(float(match.group()), 10.0) / 10.0 if match else None)
        return pl.Series("score", scores, dtype=pl.Float64)

    return judge


def reading_conversations(judge: ModelJudge, lake: Lake) -> ModelJudge:
    """``judge`` given each row's ``request_messages``, read from ``turns`` by turn_id for the
    rows it scores (the step tables point at their turns instead of repeating the
    conversation on every step)."""

    def with_conversation(rows: pl.DataFrame) -> pl.Series:
        return judge(with_turn_columns(rows, lake.scan("turns"), ["request_messages"]))

    return with_conversation
