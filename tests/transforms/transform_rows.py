"""Row builders for transform tests: rows go through the real landing models and Arrow schemas,
so column types match what the proxy writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from claw_pipelines.schemas import (
    Label,
    LandingRow,
    Reward,
    TrajectoryEventRow,
    TrajectoryRegistration,
    Turn,
    rows_to_arrow,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SYSTEM = list(range(1000, 1020))
"""A 20-token system prompt, longer than the inference key, shared by every test prompt."""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def frame(model: type[LandingRow], rows: list[dict[str, Any]]) -> pl.DataFrame:
    dumped = [model(**row).model_dump() for row in rows]
    return pl.from_arrow(rows_to_arrow(model, dumped))  # type: ignore[return-value]


def turn(
    turn_id: str,
    prompt: list[int],
    response: list[int],
    *,
    start: float = 0.0,
    trajectory_id: str | None = None,
    group_id: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A successful engine turn that started ``start`` seconds after T0 and took one second."""
    row: dict[str, Any] = {
        "turn_id": turn_id,
        "trajectory_id": trajectory_id,
        "group_id": group_id,
        "agent": "solver",
        "channel": "train",
        "policy_version": 1,
        "model": "policy",
        "token_source": "engine",
        "finish_reason": "stop",
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_logprobs": [-0.5] * len(response),
        "request_messages": json.dumps([{"role": "user", "content": f"q-{turn_id}"}]),
        "response_message": json.dumps({"role": "assistant", "content": f"a-{turn_id}"}),
        "response_text": f"a-{turn_id}",
        "started_at": at(start),
        "ended_at": at(start + 1),
    }
    row.update(fields)
    return row


def turns(*rows: dict[str, Any]) -> pl.DataFrame:
    return frame(Turn, list(rows))


def event(
    trajectory_id: str,
    kind: str = "completed",
    *,
    reward: float | None = None,
    group_id: str | None = None,
    when: float = 100.0,
    **fields: Any,
) -> dict[str, Any]:
    return {"trajectory_id": trajectory_id, "event": kind, "reward": reward,
            "group_id": group_id, "created_at": at(when), **fields}  # fmt: skip


def events(*rows: dict[str, Any]) -> pl.DataFrame:
    return frame(TrajectoryEventRow, list(rows))


def rewards(*rows: dict[str, Any]) -> pl.DataFrame:
    return frame(Reward, list(rows))


def registrations(*rows: dict[str, Any]) -> pl.DataFrame:
    return frame(TrajectoryRegistration, list(rows))


def labels(*rows: dict[str, Any]) -> pl.DataFrame:
    return frame(Label, list(rows))


def chain(
    trajectory_id: str | None,
    n: int,
    *,
    start: float = 0.0,
    base: int = 0,
    group_id: str | None = None,
    prefix: str = "",
    **fields: Any,
) -> list[dict[str, Any]]:
    """``n`` prefix-consistent turns: each prompt = previous prompt + response + 2 obs tokens."""
    rows = []
    prompt = [*SYSTEM, base + 1]
    for i in range(n):
        response = [base + 100 + 10 * i, base + 101 + 10 * i]
        rows.append(turn(f"{prefix or trajectory_id}-{i}", prompt, response, start=start + 10 * i,
                         trajectory_id=trajectory_id, group_id=group_id, **fields))  # fmt: skip
        prompt = [*prompt, *response, base + 200 + i, base + 201 + i]
    return rows
