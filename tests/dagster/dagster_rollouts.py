"""Synthetic agent rollouts written straight into the landing tables (as the proxy would)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn, new_id, rows_to_arrow, utc_now


@dataclass
class Rollouts:
    """What was landed, to compare batches against."""

    turns: dict[str, dict] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)


def land_rollouts(
    lake: Lake,
    groups: int,
    group_size: int = 4,
    steps: int = 2,
    *,
    seed: int = 0,
    complete: bool = True,
    flat: bool = False,
    trajectory_prefix: str = "t",
    policy_version: int = 1,
    request_tools: str | None = None,
    start: datetime | None = None,
) -> Rollouts:
    """Land ``groups`` GRPO groups of multi-step trajectories, then their completion events.

    Each step's prompt extends the previous prompt + response exactly (prefix-consistent), and
    rewards differ within a group so no group has zero variance (``flat``: all score 1).
    Trajectory ids are ``<trajectory_prefix>-<time-ordered id>``; the turns start at ``start``
    (default now), a millisecond apart.
    """
    rng = random.Random(seed)
    landed = Rollouts()
    turn_rows, event_rows = [], []
    start = start or utc_now()
    for _ in range(groups):
        group_id = f"g-{new_id()}"
        landed.groups[group_id] = []
        task = [rng.randrange(1, 30_000) for _ in range(12)]
        for member in range(group_size):
            trajectory_id = f"{trajectory_prefix}-{new_id()}"
            landed.groups[group_id].append(trajectory_id)
            prompt = list(task)
            for index in range(steps):
                response = [rng.randrange(1, 30_000) for _ in range(rng.randrange(3, 9))]
                text = f"step {index} of rollout {member}: answer {sum(response) % 97}"
                started = start + timedelta(milliseconds=len(turn_rows))
                turn = Turn(
                    turn_id=new_id(),
                    trajectory_id=trajectory_id,
                    group_id=group_id,
                    agent="synthetic",
                    policy_version=policy_version,
                    model="policy",
                    finish_reason="stop",
                    token_source="engine",
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    response_logprobs=[-0.5] * len(response),
                    request_messages=json.dumps([{"role": "user", "content": "solve the task"}]),
                    request_tools=request_tools,
                    response_message=json.dumps({"role": "assistant", "content": text}),
                    response_text=text,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(response),
                    started_at=started,
                    ended_at=started + timedelta(milliseconds=1),
                    metadata=json.dumps({"claw": {"ground_truth": "42"}}),
                )
                turn_rows.append(turn.model_dump())
                landed.turns[turn.turn_id] = turn.model_dump()
                prompt = [*prompt, *response, 7, 8]
            reward = 1.0 if flat else float(member % 2)
            landed.rewards[trajectory_id] = reward
            if complete:
                event_rows.append(
                    TrajectoryEventRow(
                        trajectory_id=trajectory_id, group_id=group_id, reward=reward
                    ).model_dump()
                )
    lake.append("turns", rows_to_arrow(Turn, turn_rows))
    if event_rows:
        lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, event_rows))
    return landed


def late_turn(last: dict, after: timedelta = timedelta(seconds=1)) -> dict:
    """A turn landing after ``last``'s trajectory completed: it continues ``last`` (its prompt
    extends ``last``'s prompt + response exactly)."""
    response = [11, 12, 13]
    started = last["ended_at"] + after
    return Turn.model_validate(
        {
            **last,
            "turn_id": new_id(),
            "prompt_token_ids": [*last["prompt_token_ids"], *last["response_token_ids"], 7, 8],
            "response_token_ids": response,
            "response_logprobs": [-0.5] * len(response),
            "started_at": started,
            "ended_at": started + timedelta(milliseconds=1),
        }
    ).model_dump()
